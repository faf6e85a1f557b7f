"""`g4bench capacity`: residency ceilings, measured on the local device or compiled for a TPU target.

Data flow::

    configurations (kv dtype × step × PLE × sliding, program decode | prefill T) ──▶ for each:
      estimate = (limit − weights) ÷ KV bytes per sequence (× 2 when copying: two caches live)
      search_ceiling(probe, estimate)                        (harness/capacity/search.py)
        probe(b) = run_isolated(child, payload(batch=b))     one fresh process per probe
          local:  run_child   builds the engine's DecodeBench, allocates cache, runs the step
                  (RLIMIT_AS = the stated cap, so an oversized probe dies cleanly as "oom")
          tpu-*:  harness.capacity.aot:compile_child  compiles for the topology; HBM OOM = does not fit
          h100/h200: the same child, compiled through the CUDA plugin; peak > limit = does not fit
        every probe → a "probe" record in results.jsonl at once (nothing lost if one dies)
      → a "ceiling" record: max batch, KV tokens = ctx × max batch, memory breakdown of the
        compiled step at the ceiling, step time (measured locally; roofline and XLA's sanity-
        checked figure for a TPU target)

Reporting, the reference comparison and admission tables live in harness/capacity/report.py and
harness/capacity/admission.py; this module only searches and records.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from typing import Any

from harness.capacity.search import Probe, ProbeError, Search, classify, search_ceiling
from harness.results import is_failure
from harness.run import RunFolder

RUN_TARGET = "harness.capacity.probes:run_child"
TIMED_STEPS = 3  # the reference bisection: 1 warm + 3 timed steps at each probe


@dataclass(frozen=True)
class CapacityConfig:
    """One ceiling to find: a decode case (its batch is what varies) on a target, for a program."""

    case: Any  # g4bench.engine.bench.DecodeCase
    target: str  # "local" or a hardware id with an aot_topology
    program: str = "decode"  # "decode" | "prefill"
    tokens: int = 1  # prefill tokens per row per call (ctx = one-shot)
    compute: str | None = None  # compute dtype override ("f32" | "bf16"); None = platform default

    @property
    def name(self) -> str:
        c = self.case
        step = "donated" if c.donate else "copying"
        prog = (
            "decode"
            if self.program == "decode"
            else ("prefill-oneshot" if self.tokens >= c.ctx else f"prefill-chunk{self.tokens}")
        )
        paged = "/paged" if c.kv_layout == "paged" else ""  # contiguous names stay as they were
        return f"{prog}/{self.target}/layers-{c.layers}/ple-{c.ple}/kv-{c.kv_dtype}/{step}/sliding-{c.sliding_kv}{paged}/ctx{c.ctx}"

    def payload(self, batch: int) -> dict[str, Any]:
        return {
            "program": self.program,
            "case": asdict(replace(self.case, batch=batch)),
            "tokens": self.tokens,
            "target": self.target,
            "compute": self.compute,
        }

    def config(self) -> dict[str, Any]:
        c = self.case
        return {
            "model": c.model, "layers": c.layers, "ple": c.ple, "embed": c.embed, "kv_dtype": c.kv_dtype,
            "donate": c.donate, "sliding_kv": c.sliding_kv, "ctx": c.ctx, "target": self.target,
            "program": self.program, "tokens": self.tokens, "compute": self.compute,
        } | ({"kv_layout": c.kv_layout} if c.kv_layout != "contiguous" else {})  # fmt: skip


def per_seq_bytes(cfg_case: Any, program: str) -> int:
    """Bytes one more sequence adds to the step's live set: its cache row, twice when copying."""
    from g4bench.model.config import load_config
    from g4bench.model.kv_cache import cache_bytes

    row = cache_bytes(load_config(cfg_case.model), 1, cfg_case.layout)
    return row * (1 if cfg_case.donate else 2)


# Prefill activations per prompt token, for the first guess only: the reference engine's compiled
# prefill temps grew ≈ 2.13 MB per token of B × S (seed-engine-notes §4.8).
PREFILL_BYTES_PER_TOKEN_GUESS = 2_130_000


def estimate_batch(case: Any, program: str, limit: int, tokens: int = 1) -> int:
    """The arithmetic first guess (usable − weights) ÷ per-sequence bytes; decode temporaries are
    ignored (so it is an upper bound), prefill adds a per-token activation guess."""
    from g4bench.model.config import load_config
    from g4bench.model.params import param_bytes

    weights = param_bytes(load_config(case.model), case.weight_format)
    row = per_seq_bytes(case, program)
    if program == "prefill":
        row += tokens * PREFILL_BYTES_PER_TOKEN_GUESS
    return max(1, (limit - weights) // row)


# ------------------------------------------------------------------------------------- local child


def run_child(payload: dict[str, Any]) -> dict[str, Any]:
    """Isolated child for a local probe: allocate weights and cache, run the step; report peak memory.

    The compiled memory breakdown comes from the same compiled program that runs."""
    from g4bench.engine.bench import make_decode_bench
    from harness.capacity.aot import case_from, memory_fields, vm_peak_bytes
    from harness.env import device_info
    from harness.isolate import configure_jax_cache

    configure_jax_cache()
    bench = make_decode_bench(case_from(payload["case"]))
    compile_s = bench.compile()
    mem = memory_fields(bench.compiled.memory_analysis())
    times = []
    for i in range(1 + TIMED_STEPS):
        inputs = bench.fresh_inputs()
        t0 = time.perf_counter()
        bench.step(inputs)
        if i:
            times.append((time.perf_counter() - t0) * 1e3)
        del inputs
    return {
        "fits": True,
        "device": device_info(),
        "compile_s": compile_s,
        "step_ms_samples": times,
        "step_ms_median": statistics.median(times),
        "weights_bytes": bench.weights_bytes,
        "kv_bytes": bench.kv_bytes,
        "host_vm_peak_bytes": vm_peak_bytes(),
        **mem,
    }


# ------------------------------------------------------------------------------------- drivers


@dataclass
class Driver:
    """Runs probes for one configuration (children of the run `folder`) and records each one."""

    cfg: CapacityConfig
    limit: int
    folder: RunFolder
    record: Callable[..., object]  # (name, config, fields, device); its return value is unused
    progress: Callable[[str], None]
    started: float = 0.0

    def probe(self, batch: int) -> Probe:
        from harness.capacity.aot import COMPILE_TARGET, TPU_CHILD_ENV

        local = self.cfg.target == "local"
        n = len(self._probes) + 1
        t0 = time.perf_counter()
        result = self.folder.child(
            RUN_TARGET if local else COMPILE_TARGET,
            {**self.cfg.payload(batch), "limit_bytes": self.limit},
            f"{self.cfg.name}-b{batch}",
            env=None if local else TPU_CHILD_ENV,
        )
        fields = {"record": "probe", "batch": batch, **{k: v for k, v in result.items() if k != "device"}}
        self.record(
            f"{self.cfg.name}/probe-b{batch}",
            {**self.cfg.config(), "batch": batch},
            fields,
            result.get("device"),
        )
        try:
            fits = classify(result, compile_only=not local)
        except ProbeError as exc:
            self.progress(f"  probe {n}: batch {batch} [red]error[/red] ({time.perf_counter() - t0:.0f} s)")
            raise ProbeError(f"{self.cfg.name}, batch {batch}: {exc}") from exc
        nbytes = (
            (result.get("host_vm_peak_bytes") if local else result.get("peak_bytes"))
            if fits
            else result.get("oom_required_bytes", result.get("peak_bytes"))  # GPU: the peak over the limit
        )
        verdict = "[green]fits[/green]" if fits else "[yellow]does not fit[/yellow]"
        why = (
            ""
            if fits
            else f" ({result['failure']['kind']})"
            if is_failure(result)
            else " (compiled peak over the limit)"
            if "fits_rule" in result
            else " (compile-time HBM OOM)"
        )
        elapsed = time.perf_counter() - self.started
        self.progress(
            f"  probe {n}: batch {batch:>6} {verdict}{why}  {time.perf_counter() - t0:5.0f} s  (elapsed {elapsed:.0f} s)"
        )
        p = Probe(batch, fits, int(nbytes) if nbytes else None, result)
        self._probes.append(p)
        return p

    def run(self, estimate: int, tol: float) -> Search:
        self._probes: list[Probe] = []
        self.started = time.perf_counter()
        local = self.cfg.target == "local"

        def learn_limit(p: Probe) -> int | None:
            return p.result.get("oom_available_bytes")

        # A local probe's bytes are its peak address space, which also holds the runtime: the
        # slope (not the guess's absolute level) is what the linear guess needs there.
        return search_ceiling(
            self.probe,
            estimate,
            tol=tol,
            limit=self.limit,
            per_seq_bytes=per_seq_bytes(self.cfg.case, self.cfg.program)
            if self.cfg.program == "decode"
            else None,
            on_limit=None if local else learn_limit,
        )


def ceiling_fields(cfg: CapacityConfig, search: Search, limit: int, hw: Any) -> dict[str, Any]:
    """The ceiling record's metrics: batch, KV tokens, breakdown at the ceiling, step time."""
    from g4bench.model import costs
    from g4bench.model.config import load_config
    from harness.capacity.aot import check_cost

    c = cfg.case
    at = search.ceiling_probe.result if search.ceiling_probe else {}
    fields: dict[str, Any] = {
        "record": "ceiling",
        "max_batch": search.lo,
        "bracket_hi": search.hi,
        "n_probes": len(search.probes),
        "probes": [[p.batch, p.fits] for p in search.probes],
        "limit_bytes": int(search.limit or limit),
        "kv_tokens": c.ctx * search.lo if cfg.program == "decode" else search.lo * cfg.tokens,
        "per_seq_kv_bytes": per_seq_bytes(replace(c, donate=True), cfg.program),
    }
    keep = ("weights_bytes", "kv_bytes", "argument_bytes", "output_bytes", "alias_bytes", "temp_bytes",
            "generated_code_bytes", "peak_bytes", "xla_peak_memory_bytes", "host_vm_peak_bytes", "compile_s",
            "step_ms_median", "attention", "step_ms_samples", "xla_flops", "xla_bytes_accessed", "xla_optimal_s", "model_bytes")  # fmt: skip
    fields.update({k: at[k] for k in keep if k in at})
    if search.lo and cfg.program == "decode":
        mcfg = load_config(c.model)
        cost = costs.decode_cost(mcfg, c.weight_format, c.layout, search.lo, c.ctx, donated=c.donate)
        fields["model_bytes"] = cost.bytes
        bw = hw.value("peak_bandwidth_bytes_per_s") if hw else None
        if bw:
            fields["roofline_step_ms"] = cost.bytes / bw * 1e3
        if "xla_bytes_accessed" in at:
            fields.update(check_cost(at, cost.bytes, bw))
    return fields


# ------------------------------------------------------------------------------------- the sweep


@dataclass(frozen=True)
class Settings:
    """Everything a capacity run was made with (written to env.json and printed)."""

    model: str
    ctx: int
    target: str
    kv: tuple[str, ...]
    steps: tuple[str, ...]
    ple: tuple[str, ...]
    sliding: tuple[str, ...]
    layers: str
    compute: str | None
    limit_bytes: int
    limit_source: str
    mem_limit_bytes: int | None
    timeout_s: float
    tol: float
    prefill_tokens: tuple[int, ...]
    tpot_ms: float | None = None  # TPOT objective: adds latency ceilings (harness/capacity/latency.py)
    kv_layouts: tuple[str, ...] = ("contiguous",)  # decode configurations only; prefill is sized contiguous


def configurations(s: Settings) -> list[CapacityConfig]:
    """Decode configurations (KV layout × sliding × kv × step × PLE), then prefill ones (donated,
    contiguous, per kv and sliding, one per prompt length in `prefill_tokens`; a length ≥ ctx is
    one-shot)."""
    from g4bench.engine.bench import DecodeCase

    out = []
    for layout in s.kv_layouts:
        for sliding in s.sliding:
            for kv in s.kv:
                for step in s.steps:
                    for ple in s.ple:
                        case = DecodeCase(model=s.model, layers=s.layers, ple=ple, kv_dtype=kv, donate=step == "donated",
                                          sliding_kv=sliding, batch=1, ctx=s.ctx, kv_layout=layout)  # fmt: skip
                        out.append(CapacityConfig(case, s.target, compute=s.compute))
    for sliding in s.sliding:
        for kv in s.kv:
            for t in s.prefill_tokens:
                case = DecodeCase(model=s.model, layers=s.layers, ple=s.ple[0], kv_dtype=kv, donate=True,
                                  sliding_kv=sliding, batch=1, ctx=s.ctx)  # fmt: skip
                out.append(CapacityConfig(case, s.target, "prefill", min(t, s.ctx), compute=s.compute))
    return out


def local_prediction(
    cfg: CapacityConfig, s: Settings, batches: tuple[int, int], folder: RunFolder
) -> dict[str, Any]:
    """The compiled prediction for the local device: compile (never run) the same step at two
    batches in fresh children, fit peak(B) = a + b·B (args + out + temp − alias, linear in B),
    add the runtime's own address space (the compile child's peak: jax, XLA, the compiler) and
    solve peak ≤ cap. Returns the fitted figures and the predicted ceiling."""
    from harness.capacity.aot import COMPILE_TARGET

    points = []
    for b in batches:
        r = folder.child(COMPILE_TARGET, cfg.payload(b), f"{cfg.name}-compile-b{b}")
        if is_failure(r):
            return {
                "prediction_error": f"compile at batch {b}: {r['failure']['kind']}: {r['failure']['detail']}"
            }
        points.append((b, r))
    (b1, r1), (b2, r2) = points
    slope = (r2["peak_bytes"] - r1["peak_bytes"]) / (b2 - b1)
    base = r1["peak_bytes"] - slope * b1
    runtime = max(r1.get("host_vm_peak_bytes", 0), r2.get("host_vm_peak_bytes", 0))
    predicted = int((s.limit_bytes - runtime - base) // slope) if slope > 0 else 0
    return {
        "predicted_max_batch": max(0, predicted),
        "predicted_fixed_bytes": int(base),
        "predicted_per_seq_bytes": int(slope),
        "runtime_vm_bytes": int(runtime),
        "compiled_temp_bytes_at": {str(b1): r1["temp_bytes"], str(b2): r2["temp_bytes"]},
        "compiled_peak_bytes_at": {str(b1): r1["peak_bytes"], str(b2): r2["peak_bytes"]},
    }
