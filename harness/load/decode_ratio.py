"""Server decode throughput at c streams against the engine's own batch decode step, in one run.

Issue 5 asks how much of the engine's decode speed survives the scheduler, HTTP and SSE: aggregate
decode tok/s of c concurrent streams ÷ the engine's c-stream throughput from its bare decode step
at the same KV length. Both halves are measured by one `g4bench serve-load --engine-baseline` run.

Server side (`decode_window`, from the client's records of one load level). A stream is *in decode*
from the arrival of its first output chunk to the arrival of its last. The measurement window is
the union of the intervals during which exactly c streams (the level's concurrency) are in decode,
i.e. every stream is decoding and none is waiting for or in prefill. Then

    decode_tok_per_s = Σ tokens of the chunks arriving inside the window ÷ total window length,

a chunk counting when its arrival t satisfies a < t ≤ b for a window [a, b] (the first token of the
stream whose arrival opens a window came from its prefill, not from a decode step, so it is out;
the last token of the stream whose end closes it is in). Tokens per chunk come from the stream's
`token_ids` (exact). With one wave of c equal requests the window is one interval: from the last
stream's first token to the first stream's last token.

Engine side (`engine_baseline`, in a fresh child via harness.isolate): `DecodeCase(model, the weight
format the server loads (loading.default_format), batch = the server's max_slots (its decode step
always computes every slot row), ctx = the KV bucket the server's steps used in the window,
sliding_kv="ring", donate=True)`: compile, warm up, then the median of 15 single steps on fresh
inputs. Its c-stream throughput is c × 1000 / median_ms: the same program shape as the server's
decode step, without the host work around it (scheduling, token delivery, HTTP).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

from harness.load.client import RequestRecord
from harness.results import is_failure
from harness.run import CHILD_TIMEOUT_S

CHILD = "harness.load.decode_ratio:engine_baseline_child"
GOAL = 0.8  # issue 5: server aggregate decode ≥ 0.8 × the engine's own step


def decode_window(records: Sequence[RequestRecord], conc: int) -> dict[str, Any]:
    """Aggregate decode tok/s over the time all `conc` streams were decoding (module docstring)."""
    streams = [r for r in records if r.ok and len(r.chunk_times) >= 2]
    events = []  # (time, +1 at a stream's first token | -1 at its last), ends sort before starts
    for r in streams:
        events.append((r.send_s + r.chunk_times[0], 1))
        events.append((r.send_s + r.chunk_times[-1], -1))
    events.sort(key=lambda e: (e[0], e[1]))
    windows: list[tuple[float, float]] = []
    active, opened = 0, None
    for t, d in events:
        active += d
        if active == conc and d == 1:
            opened = t
        elif opened is not None and active < conc:
            if t > opened:
                windows.append((opened, t))
            opened = None
    tokens = 0
    for r in streams:
        for ct, n in zip(r.chunk_times[1:], r.chunk_tokens[1:], strict=False):
            t = r.send_s + ct
            tokens += n if any(a < t <= b for a, b in windows) else 0
    span = sum(b - a for a, b in windows)
    return {
        "decode_window_s": span,
        "decode_window_tokens": tokens,
        "decode_windows": len(windows),
        "decode_tok_per_s_all_streams": tokens / span if span > 0 else None,
    }


def server_kv_len(max_len: int, first_pos: int, last_pos: int) -> tuple[int, int]:
    """The engine's KV buckets for decode positions first_pos..last_pos (as `Engine.decode` picks
    them): (bucket at the first, bucket at the last); equal when one bucket covers the window."""
    from g4bench.engine.engine_config import EngineConfig, bucket_for

    buckets = EngineConfig(max_len=max_len).kv_buckets
    return bucket_for(first_pos + 1, buckets), bucket_for(last_pos + 1, buckets)


def engine_baseline_child(payload: dict[str, Any]) -> dict[str, Any]:
    """Isolated child: the engine's decode step at the server's shape; returns step times (ms)."""
    from harness.isolate import configure_jax_cache

    configure_jax_cache()
    from g4bench.engine.bench import DecodeCase, make_decode_bench
    from g4bench.engine.loading import default_format
    from g4bench.model.config import load_config
    from harness.env import device_info
    from harness.timing import measure_bench

    fmt = default_format(load_config(payload["model"]))
    case = DecodeCase(model=payload["model"], layers=fmt.layers, ple=fmt.ple, embed=fmt.embed,
                      kv_dtype=payload.get("kv_dtype", "bf16"), donate=True, sliding_kv="ring",
                      batch=int(payload["batch"]), ctx=int(payload["kv_len"]))  # fmt: skip
    out = measure_bench(
        make_decode_bench(case), int(payload.get("samples", 15)), int(payload.get("warmup", 3))
    )
    return out | {"case": case.__dict__, "case_name": case.name, "device": device_info()}


def engine_baseline(
    model: str, batch: int, kv_len: int, samples: int = 15, timeout_s: float = CHILD_TIMEOUT_S
) -> dict[str, Any]:
    """Run the child; returns its record plus `step_ms_median`, or {"failure": ...}."""
    from harness.isolate import run_isolated

    payload = {"model": model, "batch": batch, "kv_len": kv_len, "samples": samples, "warmup": 3}
    res = run_isolated(CHILD, payload, timeout_s=timeout_s)
    if not is_failure(res):
        res["step_ms_median"] = statistics.median(res["step_ms_samples"])
    return res


def compare(level: dict[str, Any], baseline: dict[str, Any]) -> dict[str, Any]:
    """Ratio block for one level: server window tok/s ÷ (c × 1000 / engine median step ms)."""
    c = level["concurrency"]
    server = level.get("decode_tok_per_s_all_streams")
    step = baseline.get("step_ms_median")
    engine = c * 1000.0 / step if step else None
    return {
        "concurrency": c,
        "server_decode_tok_per_s": server,
        "engine_step_ms_median": step,
        "engine_tok_per_s": engine,
        "ratio": server / engine if server and engine else None,
        "goal": GOAL,
    }
