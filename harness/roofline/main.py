"""`g4bench roofline`: read the decode step against the device's measured streaming bandwidth.

Why: a step time means little until it is set against what the memory system can deliver. The
reference engine quoted bandwidth against a published peak with a byte count that streamed the
gathered PLE table, and took context slopes from deltas too small to trust (an 841 GB/s outlier);
seed-engine-notes §3.4, §4.10. Here every number comes from one procedure:

    probe_device (child) ──▶ RooflineSettings (defaults per platform, printed with the reason)
    calibrate_child (child): sum, max, matvec, copy over buffers sized to the device's memory
        ──▶ calibrated GB/s = the best reduction kernel's median (every kernel reported; copy,
            read + write, is shown beside it but is not a read bandwidth)
    for each (batch, ctx):  step_child (child, one per shape, via harness.isolate)
        DecodeBench (the engine's own step) → compile → cost_analysis → measure_bench
        parent: costs.decode_cost (the byte model) ÷ median step time ÷ calibrated = fraction
    kv_slope: per batch, adjacent contexts where time rises > 15% → Δ(KV bytes)/Δ(time), intercept
    breakdown_child (child, optional): the LM head, one layer of each kind, the sampler, timed alone
        and multiplied out, so the gap between the step and the roofline is attributed
    records (kind "roofline") → run folder; rich tables → stderr

The byte model (g4bench/model/costs.py) is the roofline. XLA's cost_analysis of the compiled step
is printed beside it with the ratio, never as the model: on the CPU it counts gathered tables and
converts in full, and for TPU it was 32–42 GB for a ~2 GB step (DESIGN, Contracts). The engine's
step is unrolled over layers (no scan), so cost_analysis covers every layer.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from g4bench.engine.served_step import SLIDING_KV, ServedStep
from harness.results import is_failure
from harness.run import CHILD_TIMEOUT_S, CPU_LAYERS, CPU_LAYERS_REASON, KV_LAYOUTS, RequestError, on_cpu

SLOPE_MIN_RISE = 0.15  # only adjacent points whose step time rises by more than 15% (reference rule)
STEP_TARGET = "harness.roofline.probes:step_child"
CALIBRATE_TARGET = "harness.roofline.probes:calibrate_child"
BREAKDOWN_TARGET = "harness.roofline.probes:breakdown_child"


class RooflineError(RequestError):
    """Unusable request (no device, bad shape); exit code 2."""


@dataclass(frozen=True)
class RooflineSettings:
    """What one roofline run measures; stored in env.json."""

    model: str
    layers: str
    kv_dtype: str
    batches: tuple[int, ...]
    ctxs: tuple[int, ...]
    samples: int
    warmup: int
    breakdown: bool
    timeout_s: float = CHILD_TIMEOUT_S
    mem_limit_bytes: int | None = None
    seed: int = 0
    kv_layout: str = "contiguous"  # resolve_settings: the served step's unless --kv-layout says otherwise
    sliding_kv: str = "full"

    def case(self, batch: int, ctx: int) -> dict[str, Any]:
        """The DecodeCase fields of one shape (the engine's donated step; block pools read by table
        when `kv_layout` is "paged"; window-sized rings for sliding layers when `sliding_kv` is "ring")."""
        case: dict[str, Any] = {
            "model": self.model,
            "layers": self.layers,
            "kv_dtype": self.kv_dtype,
            "batch": batch,
            "ctx": ctx,
        }
        if self.kv_layout != "contiguous":  # contiguous full runs keep their names and identities
            case["kv_layout"] = self.kv_layout
        if self.sliding_kv != "full":
            case["sliding_kv"] = self.sliding_kv
        return case

    def step_name(self, batch: int, ctx: int) -> str:
        paged = "/paged" if self.kv_layout == "paged" else ""
        ring = "/ring" if self.sliding_kv == "ring" else ""
        return f"decode/b{batch}/ctx{ctx}{paged}{ring}"


@dataclass(frozen=True)
class RooflineRequest:
    """The command line's values; None = not given (the platform's default)."""

    model: str | None = None
    layers: str | None = None
    kv_dtype: str | None = None
    batches: tuple[int, ...] | None = None
    ctxs: tuple[int, ...] | None = None
    samples: int | None = None
    warmup: int | None = None
    breakdown: bool | None = None
    timeout_s: float | None = None
    mem_limit_bytes: int | None = None
    kv_layout: str | None = None
    sliding_kv: str | None = None


SERVED = ServedStep.served()  # what `serve` runs: the default layout and sliding KV

ACCELERATOR_DEFAULTS = dict(
    layers="w4a16",
    kv_dtype="bf16",
    batches=(32,),
    ctxs=(1024, 2048, 4096, 8192),
    breakdown=False,
    reason="the reference shape (batch 32, ctx 8192) plus a context sweep for the marginal KV bandwidth",
)
CPU_DEFAULTS = dict(
    layers=CPU_LAYERS,
    kv_dtype="f32",
    batches=(1,),
    ctxs=(1024, 4096, 8192),
    breakdown=True,
    reason=(
        f"{CPU_LAYERS_REASON}; only f32 streams at memory speed, so f32 KV for the same reason (attention "
        "converts a bf16 cache to f32 at ~1 GB/s: --kv-dtype bf16 shows it); batch 1 and three contexts keep the "
        "run to a few minutes (a full-E2B f32 child holds ~16 GB, so children run one at a time)"
    ),
)


def default_sliding_kv(kv_layout: str) -> str:
    """The served step's ring with its paged layout; full (the reference article's) with contiguous."""
    return SERVED.sliding_kv if kv_layout == SERVED.kv_layout else "full"


def resolve_settings(platform: str | None, request: RooflineRequest) -> tuple[RooflineSettings, str | None]:
    """Fill options not given (None) from the platform's defaults; returns (settings, note to print)."""
    defaults = CPU_DEFAULTS if on_cpu(platform) else ACCELERATOR_DEFAULTS
    keys = ("layers", "kv_dtype", "batches", "ctxs", "breakdown")
    given = {k: getattr(request, k) for k in keys}
    applied = {k: defaults[k] for k in keys if given[k] is None}
    values: dict[str, Any] = {k: given[k] if given[k] is not None else defaults[k] for k in keys}
    settings = RooflineSettings(
        model=request.model or "e2b",
        kv_dtype=values["kv_dtype"],
        samples=request.samples or 15,
        warmup=request.warmup if request.warmup is not None else 2,
        timeout_s=request.timeout_s or CHILD_TIMEOUT_S,
        mem_limit_bytes=request.mem_limit_bytes,
        layers=values["layers"],
        batches=tuple(values["batches"]),
        ctxs=tuple(sorted(values["ctxs"])),
        breakdown=bool(values["breakdown"]),
        kv_layout=request.kv_layout or SERVED.kv_layout,
        sliding_kv=request.sliding_kv or default_sliding_kv(request.kv_layout or SERVED.kv_layout),
    )
    if settings.kv_layout not in KV_LAYOUTS:
        raise RooflineError(f"--kv-layout must be one of {', '.join(KV_LAYOUTS)}, got {settings.kv_layout!r}")
    if settings.sliding_kv not in SLIDING_KV:
        raise RooflineError(f"--sliding-kv must be one of {', '.join(SLIDING_KV)}, got {settings.sliding_kv!r}")
    if min(settings.batches) < 1 or min(settings.ctxs) < 1 or settings.samples < 1:
        raise RooflineError("batch, ctx and samples must be >= 1")
    if not applied:
        return settings, None
    shown = ", ".join(f"{k} {v}" for k, v in applied.items())
    return settings, f"defaults for {platform or 'cpu'}: {shown} — {defaults['reason']}"


# ---------------------------------------------------------------------------------- pure analysis


READ_KERNELS = ("sum", "max", "matvec")


def pick_calibration(kernels: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The reduction kernel × size with the highest median GB/s: the device's calibrated streaming
    (read) bandwidth. A decode step streams weights and KV in; the copy kernel (read + write) is
    measured and reported beside it, but a step that mostly reads is judged against reads."""
    usable = [k for k in kernels if k.get("gb_per_s_median") and k.get("kernel") in READ_KERNELS]
    if not usable:
        raise RooflineError(f"no reduction kernel ({', '.join(READ_KERNELS)}) produced a bandwidth")
    return max(usable, key=lambda k: k["gb_per_s_median"])


def kv_slope(points: Sequence[tuple[int, float, float]], min_rise: float = SLOPE_MIN_RISE) -> dict[str, Any]:
    """Marginal KV bandwidth from (ctx, kv_read_bytes, step_ms) at one batch.

    Only adjacent points (sorted by ctx) whose step time rises by more than `min_rise` count: small
    deltas are noise over noise (the reference's bogus 841 GB/s). Each qualifying pair's slope is
    ΔKV bytes / Δtime; the marginal bandwidth and the intercept (the step's fixed cost, time at zero
    KV) come from a least-squares line through the points of qualifying pairs."""
    pts = sorted(points)
    pairs: list[dict[str, Any]] = []
    used: set[tuple[int, float, float]] = set()
    for (c0, b0, t0), (c1, b1, t1) in zip(pts, pts[1:], strict=False):
        rise = t1 / t0 - 1.0
        ok = rise > min_rise and b1 > b0
        pairs.append(
            {
                "ctx_from": c0,
                "ctx_to": c1,
                "time_rise_pct": 100.0 * rise,
                "used": ok,
                "gb_per_s": (b1 - b0) / ((t1 - t0) * 1e-3) / 1e9 if ok else None,
            }
        )
        if ok:
            used |= {(c0, b0, t0), (c1, b1, t1)}
    out: dict[str, Any] = {"pairs": pairs, "min_rise_pct": 100.0 * min_rise}
    if not used:
        out |= {
            "marginal_kv_gb_per_s": None,
            "intercept_ms": None,
            "slope_note": _no_slope_note(pts, min_rise),
        }
        return out
    import numpy as np

    xs = np.array([b for _, b, _ in sorted(used)], dtype=np.float64)
    ys = np.array([t for _, _, t in sorted(used)], dtype=np.float64)
    slope_ms_per_byte, intercept = np.polyfit(xs, ys, 1)
    out["marginal_kv_gb_per_s"] = 1.0 / (slope_ms_per_byte * 1e-3) / 1e9 if slope_ms_per_byte > 0 else None
    out["intercept_ms"] = float(intercept)
    out["slope_note"] = (
        f"least squares over {len(used)} points of {sum(p['used'] for p in pairs)} qualifying pair(s)"
    )
    return out


def _no_slope_note(pts: Sequence[tuple[int, float, float]], min_rise: float) -> str:
    if len(pts) < 2:
        return "needs at least two contexts at this batch"
    rises = ", ".join(f"{100 * (b[2] / a[2] - 1):+.1f}%" for a, b in zip(pts, pts[1:], strict=False))
    return (
        f"no adjacent contexts with step time rising > {100 * min_rise:.0f}% ({rises}): KV is too small a share "
        "of the step at this batch; raise --batch or widen --ctx"
    )


# ------------------------------------------------------------------------------------- records


def _base(run_id: str, base_env: dict[str, Any], config: dict[str, Any], result: Any) -> dict[str, Any]:
    from harness.run import record_env

    return {"run_id": run_id, "env": record_env(base_env, config, (result or {}).get("device")), "config": config}


def calibration_record(result: dict[str, Any], run_id: str, base_env: dict[str, Any]) -> dict[str, Any]:
    """The calibration child's result as a record: every kernel, and the best as calibrated_gb_per_s."""
    from harness.results import make_record

    base = _base(
        run_id, base_env, {"fractions": list(result.get("fractions", [])), "reps": result.get("reps")}, result
    )
    if is_failure(result):
        return make_record(
            "roofline", "calibration", **base, failure=result["failure"], wall_s=result.get("wall_s", 0.0)
        )
    best = pick_calibration(result["kernels"])
    return make_record(
        "roofline",
        "calibration",
        **base,
        calibrated_gb_per_s=best["gb_per_s_median"],
        calibration_kernel=best["kernel"],
        calibration_buffer_bytes=best["buffer_bytes"],
        calibration_kernels=result["kernels"],
        device_memory_bytes=int(result["device_memory_bytes"]),
        wall_s=float(result.get("wall_s", 0.0)),
    )


def step_record(
    result: dict[str, Any],
    settings: RooflineSettings,
    batch: int,
    ctx: int,
    calibrated_gb_per_s: float | None,
    run_id: str,
    base_env: dict[str, Any],
) -> dict[str, Any]:
    """One decode shape: step statistics, the byte model by part, XLA's figures beside it, and the
    achieved bandwidth and fraction of the calibrated bandwidth."""
    from g4bench.engine.bench import DecodeCase
    from g4bench.model.config import load_config
    from g4bench.model.costs import decode_cost, describe
    from harness.results import make_record
    from harness.stats import summarize

    case_fields = settings.case(batch, ctx)
    config = {**case_fields, "samples": settings.samples, "warmup": settings.warmup, "seed": settings.seed}
    base = _base(run_id, base_env, config, result)
    name = settings.step_name(batch, ctx)
    if is_failure(result):
        return make_record(
            "roofline", name, **base, failure=result["failure"], wall_s=result.get("wall_s", 0.0)
        )
    case = DecodeCase(**case_fields)
    cost = decode_cost(
        load_config(case.model), case.weight_format, case.layout, batch, ctx, donated=case.donate
    )
    st = summarize([float(x) for x in result["step_ms_samples"]])
    achieved = cost.bytes / (st.median * 1e-3) / 1e9
    xla_bytes = result.get("xla_bytes_accessed")
    fields = {
        "batch": batch,
        "ctx": ctx,
        "step_ms_median": st.median,
        "step_ms_q1": st.q1,
        "step_ms_q3": st.q3,
        "step_ms_min": st.min,
        "step_ms_max": st.max,
        "step_rel_iqr_pct": st.rel_iqr_pct,
        "n_samples": st.n,
        "step_ms_samples": [float(x) for x in result["step_ms_samples"]],
        "agg_tok_per_s": batch * 1000.0 / st.median,
        **describe(cost),
        "xla_bytes_accessed": xla_bytes,
        "xla_flops": result.get("xla_flops"),
        "xla_over_model_bytes": xla_bytes / cost.bytes if xla_bytes else None,
        "xla_scope": "whole step: the decode step is unrolled over layers (no scan), so cost_analysis covers every layer",
        "achieved_gb_per_s": achieved,
        "weights_bytes": int(result["weights_bytes"]),
        "kv_bytes": int(result["kv_bytes"]),
        "compile_s": float(result["compile_s"]),
        "wall_s": float(result.get("wall_s", 0.0)),
    }
    if calibrated_gb_per_s:
        fields["calibrated_gb_per_s"] = calibrated_gb_per_s
        fields["fraction_of_calibrated"] = achieved / calibrated_gb_per_s
    return make_record("roofline", name, **base, **fields)


def slope_records(
    steps: Sequence[dict[str, Any]], run_id: str, base_env: dict[str, Any]
) -> list[dict[str, Any]]:
    """Per batch with two or more measured contexts: the marginal KV bandwidth (`kv_slope`)."""
    from harness.results import make_record

    by_batch: dict[int, list[dict[str, Any]]] = {}
    for r in steps:
        if not is_failure(r):
            by_batch.setdefault(r["batch"], []).append(r)
    out = []
    for batch, recs in sorted(by_batch.items()):
        if len(recs) < 2:
            continue
        pts = [(r["ctx"], float(r["model_bytes_by_part"]["kv_read"]), r["step_ms_median"]) for r in recs]
        fit = kv_slope(pts)
        config = {k: recs[0]["config"][k] for k in ("model", "layers", "kv_dtype")} | {
            "batch": batch,
            "ctxs": sorted(r["ctx"] for r in recs),
        }
        base = _base(
            run_id,
            {
                **base_env,
                "platform": recs[0]["env"]["platform"],
                "device_kind": recs[0]["env"]["device_kind"],
            },
            config,
            None,
        )
        out.append(make_record("roofline", f"kv-slope/b{batch}", **base, batch=batch, **fit))
    return out


def breakdown_record(
    result: dict[str, Any],
    step: dict[str, Any] | None,
    calibrated: float | None,
    run_id: str,
    base_env: dict[str, Any],
) -> dict[str, Any]:
    """The parts timed alone, multiplied by how often the step runs them, against the whole step."""
    from harness.results import make_record

    config = dict(step["config"]) if step else {}
    base = _base(run_id, base_env, config, result)
    name = f"breakdown/b{config.get('batch')}/ctx{config.get('ctx')}"
    if is_failure(result):
        return make_record(
            "roofline", name, **base, failure=result["failure"], wall_s=result.get("wall_s", 0.0)
        )
    parts = []
    for p in result["parts"]:
        gbs = p["bytes_each"] / (p["ms_each"] * 1e-3) / 1e9
        parts.append(
            p
            | {
                "ms_total": p["count"] * p["ms_each"],
                "gb_per_s": gbs,
                "fraction_of_calibrated": gbs / calibrated if calibrated else None,
            }
        )
    timed = sum(p["ms_total"] for p in parts)
    fields: dict[str, Any] = {"parts": parts, "parts_ms_total": timed}
    if step and not is_failure(step):
        fields["step_ms_median"] = step["step_ms_median"]
        fields["rest_ms"] = step["step_ms_median"] - timed
        fields["rest_note"] = (
            "attention over the KV cache, norms, RoPE, gathers, KV write, softcap (not timed alone)"
        )
    return make_record("roofline", name, **base, **fields)


# ------------------------------------------------------------------------------------- the run


@dataclass
class RooflineOutcome:
    """What a run produced: its folder and records (calibration, steps, slopes, breakdown)."""

    run_dir: Path
    calibration: dict[str, Any]
    steps: list[dict[str, Any]]
    slopes: list[dict[str, Any]]
    breakdown: dict[str, Any] | None

    @property
    def records(self) -> list[dict[str, Any]]:
        return [self.calibration, *self.steps, *self.slopes, *([self.breakdown] if self.breakdown else [])]

    @property
    def failures(self) -> list[dict[str, Any]]:
        return [r for r in self.records if is_failure(r)]


def run_roofline(
    *,
    request: RooflineRequest,
    out: Path | None,
    argv: Sequence[str],
    results_root: Path = Path("results"),
    console: Any = None,
) -> RooflineOutcome:
    """The whole command: settle settings, calibrate, measure each shape, fit slopes, attribute, print
    the tables; the run folder's lifecycle (probe, folder, command, env, summary, plots) is
    harness/run.py's. Raises `RooflineError` (a `RequestError`) for unusable requests."""
    from rich.console import Console

    from harness.roofline.report import headline, render
    from harness.run import finish, open_run, probe

    console = console or Console(stderr=True)
    device = probe()
    platform = device.get("platform")
    settings, note = resolve_settings(platform, request)
    if note:
        console.print(f"[yellow]{note}[/yellow]")
    run = open_run(
        out=out,
        results_root=results_root,
        short_name="roofline",
        argv=argv,
        settings=asdict(settings),
        identity=asdict(settings),
        device=device,
        timeout_s=settings.timeout_s,
        mem_limit_bytes=settings.mem_limit_bytes,
    )
    run_id, base_env = run.run_id, run.base_env
    console.print(
        f"roofline on {platform} ({device.get('device_kind')}): model {settings.model}, layers {settings.layers}, "
        f"KV {settings.kv_dtype} {settings.kv_layout} ({settings.sliding_kv} sliding), batch {list(settings.batches)}, ctx {list(settings.ctxs)}, {settings.samples} samples, "
        "one fresh process per shape"
    )
    with console.status("calibrating streaming bandwidth (sum, max, matvec, copy)…"):
        calibration = run.append(calibration_record(run.child(CALIBRATE_TARGET, {}, "calibration"), run_id, base_env))
    calibrated = calibration.get("calibrated_gb_per_s")
    steps = []
    for batch in settings.batches:
        for ctx in settings.ctxs:
            payload = {
                "case": settings.case(batch, ctx),
                "samples": settings.samples,
                "warmup": settings.warmup,
                "seed": settings.seed,
            }
            with console.status(f"decode step batch {batch} ctx {ctx} (fresh process)…"):
                result = run.child(STEP_TARGET, payload, f"decode-b{batch}-ctx{ctx}")
            rec = run.append(step_record(result, settings, batch, ctx, calibrated, run_id, base_env))
            steps.append(rec)
            console.print(_one_line(rec))
    slopes = [run.append(rec) for rec in slope_records(steps, run_id, base_env)]
    breakdown = None
    if settings.breakdown:
        head = headline(steps)
        shape = head or {"config": settings.case(settings.batches[0], settings.ctxs[-1])}
        with console.status("timing the step's parts alone (LM head, one layer of each kind, sampler)…"):
            case = settings.case(shape["config"]["batch"], shape["config"]["ctx"])
            result = run.child(BREAKDOWN_TARGET, {"case": case}, "breakdown")
        breakdown = run.append(breakdown_record(result, head, calibrated, run_id, base_env))
    outcome = RooflineOutcome(
        run_dir=run.path, calibration=calibration, steps=steps, slopes=slopes, breakdown=breakdown
    )
    render(outcome, console)
    finish(run, outcome.records, console)
    return outcome


def _one_line(rec: dict[str, Any]) -> str:
    from harness.run import failure_line

    if (line := failure_line(rec["name"], rec)) is not None:
        return line
    frac = rec.get("fraction_of_calibrated")
    shown = f", {frac:.2f} of calibrated" if frac is not None else ""
    return (
        f"[green]✓[/green] {rec['name']}: median {rec['step_ms_median']:.1f} ms (rel IQR {rec['step_rel_iqr_pct']:.1f}%), "
        f"model {rec['model_bytes'] / 1e9:.3f} GB → {rec['achieved_gb_per_s']:.1f} GB/s{shown}, compile {rec['compile_s']:.1f} s"
    )
