"""Engine-level step times: the serving engine's own `prefill` and `decode` calls, timed at every shape
they can take, so a step-time profile can be fitted for the simulator without any serve-load run.

Why not revalidate's numbers: revalidate times the bare compiled decode program at one shape.
What the scheduler pays per call is `Engine.decode` / `Engine.prefill` / `Engine.step` as served: a paged cache read
through block tables, the KV length rounded up to a bucket, every one of `max_slots` rows computed
whatever the number of active streams, the host-side argument building and the read-back of the
sampled ids. The simulator (harness/sim/) prices exactly these calls, so they are what we measure.

Data flow::

    EngineStepsSettings (model, slots × max_len grid, engine knobs, samples)
      └─ one fresh child per (max_slots, max_len) engine   (harness/isolate.py; `measure_child`)
           Engine(cfg, synthetic params, EngineConfig as the server builds it); warmup() compiles
           for each KV bucket k:  decode   all slots active at position k − 1 → kv_len = k
                                  prefill  each chunk bucket c, one slot, positions k − c .. k − 1
                                  mixed    (mixed policy) each reachable piece-row bucket: pieces
                                           ending at k − 1 on the first slots, the rest decoding
           each: `warmup` untimed calls, then `samples` calls timed with perf_counter around the
           public call (it returns host values, so the device has finished)
      └─ one record per (program, shape): kind "engine-steps", config {program, rows, tokens,
         kv_len, max_slots, max_len, model, layers, ple, embed, kv_dtype, sliding_kv, kv_layout,
         chunk_size}, step_ms_median and the samples

`points(records)` turns the records into calibrate's points with the features of
costs.decode_cost (rows = max_slots), costs.prefill_cost (tokens = the chunk bucket) or
costs.mixed_cost (piece rows beside max_slots decode rows).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

KIND = "engine-steps"


@dataclass(frozen=True)
class EngineStepsSettings:
    model: str = "small"
    slots: tuple[int, ...] = (1, 2, 4, 8)
    max_lens: tuple[int, ...] = (256, 512, 2048)
    kv_dtype: str = "bf16"
    sliding_kv: str = "ring"
    kv_layout: str = "paged"
    chunk_size: int = 256
    max_batched_tokens: int = 512
    prefill_policy: str | None = None  # None: mixed when paged (what serve runs)
    samples: int = 9
    warmup: int = 2
    timeout_s: float = 900.0


def measure_child(payload: dict[str, Any]) -> dict[str, Any]:
    """Isolated child: build one engine as the server does, time every decode and prefill shape."""
    from harness.isolate import configure_jax_cache

    configure_jax_cache()
    from g4bench.engine.engine_config import EngineConfig, bucket_for
    from g4bench.engine.loading import default_format, load_engine
    from g4bench.engine.sampling import SamplingParams
    from harness.env import device_info

    s = payload
    ecfg = EngineConfig(max_slots=s["max_slots"], max_len=s["max_len"], kv_dtype=s["kv_dtype"],
                        sliding_kv=s["sliding_kv"], chunk_size=s["chunk_size"], kv_layout=s["kv_layout"],
                        max_batched_tokens=s["max_batched_tokens"], prefill_policy=s["prefill_policy"])  # fmt: skip
    engine, _ = load_engine(s["model"], ecfg)
    fmt = default_format(engine.cfg)
    compile_s = engine.warmup()
    greedy = SamplingParams()
    S = ecfg.max_slots

    def timed(call: Any) -> list[float]:
        for _ in range(s["warmup"]):
            call()
        out = []
        for _ in range(s["samples"]):
            t0 = time.perf_counter()
            call()
            out.append((time.perf_counter() - t0) * 1e3)
        return out

    shapes = []
    tokens, active = np.ones(S, np.int32), np.ones(S, bool)
    for k in ecfg.kv_buckets:
        positions = np.full(S, k - 1, np.int32)
        ms = timed(lambda p=positions: engine.decode(tokens, p, active))
        shapes.append({"program": "decode", "rows": S, "tokens": 1, "kv_len": k, "samples_ms": ms})
        for c in ecfg.chunk_buckets:
            if c > k:
                continue
            start = k - c
            assert bucket_for(start + c, ecfg.kv_buckets) == k
            chunk = [engine.cfg.pad_token_id + 3] * c
            ms = timed(lambda st=start, ch=chunk: engine.prefill(0, ch, st, greedy))
            shapes.append({"program": "prefill", "rows": 1, "tokens": c, "kv_len": k, "samples_ms": ms})
        if ecfg.policy == "mixed":
            shapes += _mixed_shapes(engine, k, timed)
    return {"shapes": shapes, "compile_s": compile_s, "layers": fmt.layers, "ple": fmt.ple,
            "embed": fmt.embed, **device_info()}  # fmt: skip


def _mixed_shapes(engine: Any, k: int, timed: Any) -> list[dict[str, Any]]:
    """Mixed calls at KV bucket `k`, one per reachable piece-row bucket: pieces (the first
    SAMPLED_PER_STEP sampling)
    on the first slots, every other slot decoding at position k − 1 (every decode row is computed
    whatever the number active, so the shape is the row bucket)."""
    from g4bench.engine.engine_config import bucket_for
    from g4bench.engine.mixed import SAMPLED_PER_STEP, Piece, piece_rows
    from g4bench.engine.sampling import SamplingParams

    ecfg, S, piece = engine.ecfg, engine.ecfg.max_slots, engine.piece_tokens
    shapes: list[dict[str, Any]] = []
    seen: set[int] = set()
    for rows in ecfg.row_buckets:
        pieces: list[Piece] = []
        left, slot = rows * piece, 0
        while left > 0 and slot < S:
            n = min(left, ecfg.chunk_size, k)
            sampling = SamplingParams() if len(pieces) < SAMPLED_PER_STEP else None
            pieces.append(Piece(slot, [engine.cfg.pad_token_id + 3] * n, k - n, sampling))
            left -= piece_rows(n, piece) * piece
            slot += 1
        bucket = bucket_for(sum(piece_rows(len(p.tokens), piece) for p in pieces), ecfg.row_buckets)
        if bucket in seen:  # not enough slots to reach a larger bucket
            continue
        seen.add(bucket)
        active = np.arange(S) >= slot
        ms = timed(
            lambda ps=pieces, a=active: engine.step(np.ones(S, np.int32), np.full(S, k - 1, np.int32), a, ps)
        )
        shapes.append({"program": "mixed", "rows": bucket, "tokens": piece, "kv_len": k, "decode_rows": S,
                       "samples_ms": ms})  # fmt: skip
    return shapes


def run_engine_steps(settings: EngineStepsSettings, out: Path, argv: list[str], console: Any) -> list[dict]:
    """One child per (max_slots, max_len) engine, on the shared run lifecycle (harness/run.py):
    command.txt and env.json up front, each record appended as it arrives, summary.csv at the end."""
    from harness.results import write_summary
    from harness.run import failure_line, open_run

    base = asdict(settings)
    # the policy the engine runs, recorded on every shape (a profile's [step] record reads it)
    base["prefill_policy"] = settings.prefill_policy or ("mixed" if settings.kv_layout == "paged" else "chunk")
    run = open_run(out=out, results_root=out.parent, short_name="engine-steps", argv=argv, settings=base,
                   identity=base, device=None, timeout_s=settings.timeout_s, mem_limit_bytes=None)  # fmt: skip
    records: list[dict[str, Any]] = []
    for max_len in settings.max_lens:
        for slots in settings.slots:
            payload = {**base, "max_slots": slots, "max_len": max_len}
            console.print(f"engine-steps: {settings.model} max_slots {slots}, max_len {max_len} …")
            tag = f"engine/slots{slots}/len{max_len}"
            res = run.child("harness.calibrate.engine_steps:measure_child", payload, tag)
            common = {k: payload[k] for k in ("model", "kv_dtype", "sliding_kv", "kv_layout", "chunk_size",
                                              "max_batched_tokens", "prefill_policy")}  # fmt: skip
            failed = failure_line(tag, res)
            if failed:
                config = {**common, "max_slots": slots, "max_len": max_len}
                records.append(run.append(run.record(KIND, tag, config, res, failure=res["failure"])))
                console.print(failed)
                continue
            for sh in res["shapes"]:
                ms = sh["samples_ms"]
                cfg = {**common, "layers": res["layers"], "ple": res["ple"], "embed": res["embed"],
                       "max_slots": slots, "max_len": max_len, "program": sh["program"], "rows": sh["rows"],
                       "tokens": sh["tokens"], "kv_len": sh["kv_len"], "decode_rows": sh.get("decode_rows", 0)}  # fmt: skip
                name = f"{sh['program']}/slots{slots}/len{max_len}/rows{sh['rows']}/T{sh['tokens']}/kv{sh['kv_len']}"
                rec = run.append(run.record(KIND, name, cfg, res, step_ms_median=float(np.median(ms)),
                                            step_ms_q1=float(np.percentile(ms, 25)),
                                            step_ms_q3=float(np.percentile(ms, 75)), step_ms_samples=ms,
                                            compile_s=res["compile_s"]))  # fmt: skip
                records.append(rec)
                console.print(f"  {name}: {rec['step_ms_median']:.2f} ms")
    write_summary(run.path, records)
    return records


def cost_of(config: dict[str, Any]) -> Any:
    """costs.decode_cost / prefill_cost of one engine call, priced on the logical (contiguous) layout
    of the served engine: a paged read gathers the same positions through block tables."""
    from g4bench.model import costs
    from g4bench.model.config import load_config
    from g4bench.model.kv_cache import CacheLayout
    from g4bench.model.params import WeightFormat

    cfg = load_config(config["model"])
    fmt = WeightFormat(layers=config["layers"], ple=config["ple"], embed=config["embed"])
    layout = CacheLayout(max_len=int(config["max_len"]), kv_dtype=config["kv_dtype"],
                         ring=config["sliding_kv"] == "ring")  # fmt: skip
    if config["program"] == "decode":
        return costs.decode_cost(cfg, fmt, layout, int(config["rows"]), int(config["kv_len"]))
    if config["program"] == "mixed":
        return costs.mixed_cost(cfg, fmt, layout, int(config["decode_rows"]), int(config["rows"]),
                                int(config["tokens"]), int(config["kv_len"]))  # fmt: skip
    return costs.prefill_cost(cfg, fmt, layout, int(config["tokens"]), int(config["kv_len"]))
