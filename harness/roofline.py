"""`g4bench roofline`: read the decode step against the device's measured streaming bandwidth.

Why: a step time means little until it is set against what the memory system can deliver. The
reference engine quoted bandwidth against a published peak with a byte count that streamed the
gathered PLE table, and took context slopes from deltas too small to trust (an 841 GB/s outlier);
seed-engine-notes §3.4, §4.10. Here every number comes from one procedure:

    probe_device (child) ──▶ RooflineSettings (defaults per platform, printed with the reason)
    calibrate_child (child): sum, max, matvec, copy over buffers sized to the device's memory
        ──▶ calibrated GB/s = the best kernel's median (each kernel reported)
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

import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

SLOPE_MIN_RISE = 0.15  # only adjacent points whose step time rises by more than 15% (reference rule)
CALIBRATION_FRACTIONS = (1 / 96, 1 / 48, 1 / 24)  # buffer sizes as fractions of device memory
CALIBRATION_REPS = 10
MATVEC_COLS = 4096
STEP_TARGET = "harness.roofline:step_child"
CALIBRATE_TARGET = "harness.roofline:calibrate_child"
BREAKDOWN_TARGET = "harness.roofline:breakdown_child"


class RooflineError(ValueError):
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
    timeout_s: float = 1800.0
    mem_limit_bytes: int | None = None
    seed: int = 0

    def case(self, batch: int, ctx: int) -> dict[str, Any]:
        """The DecodeCase fields of one shape (the engine's donated step, full-length sliding KV)."""
        return {"model": self.model, "layers": self.layers, "kv_dtype": self.kv_dtype, "batch": batch, "ctx": ctx}


ACCELERATOR_DEFAULTS = dict(
    layers="w4a16",
    batches=(32,),
    ctxs=(1024, 2048, 4096, 8192),
    breakdown=False,
    reason="the reference shape (batch 32, ctx 8192) plus a context sweep for the marginal KV bandwidth",
)
CPU_DEFAULTS = dict(
    layers="f32",
    batches=(1,),
    ctxs=(1024, 4096, 8192),
    breakdown=True,
    reason=(
        "CPU: full E2B dimensions with f32 dense layers — W4A16 unpacked inside the step does not fuse "
        "on XLA CPU (~21 ms per 1536×12288 projection vs 2.7 ms dense f32 at batch 1) and bf16 weights "
        "convert at ~1 GB/s, so only f32 streams at memory speed; batch 1 and three contexts keep the "
        "run to a few minutes (a full-E2B f32 child holds ~16 GB, so children run one at a time)"
    ),
)


def resolve_settings(platform: str | None, requested: dict[str, Any]) -> tuple[RooflineSettings, str | None]:
    """Fill options not given (None) from the platform's defaults; returns (settings, note to print)."""
    defaults = CPU_DEFAULTS if platform in (None, "cpu") else ACCELERATOR_DEFAULTS
    applied = {k: defaults[k] for k in ("layers", "batches", "ctxs", "breakdown") if requested.get(k) is None}
    values = {k: requested.get(k) if requested.get(k) is not None else defaults.get(k) for k in applied} | {
        k: requested[k] for k in ("layers", "batches", "ctxs", "breakdown") if requested.get(k) is not None
    }
    settings = RooflineSettings(
        model=requested.get("model") or "e2b",
        kv_dtype=requested.get("kv_dtype") or "bf16",
        samples=requested.get("samples") or 15,
        warmup=requested.get("warmup") if requested.get("warmup") is not None else 2,
        timeout_s=requested.get("timeout_s") or 1800.0,
        mem_limit_bytes=requested.get("mem_limit_bytes"),
        layers=values["layers"],
        batches=tuple(values["batches"]),
        ctxs=tuple(sorted(values["ctxs"])),
        breakdown=bool(values["breakdown"]),
    )
    if min(settings.batches) < 1 or min(settings.ctxs) < 1 or settings.samples < 1:
        raise RooflineError("batch, ctx and samples must be >= 1")
    if not applied:
        return settings, None
    shown = ", ".join(f"{k} {v}" for k, v in applied.items())
    return settings, f"defaults for {platform or 'cpu'}: {shown} — {defaults['reason']}"


# ---------------------------------------------------------------------------------- pure analysis


def pick_calibration(kernels: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The kernel × size with the highest median GB/s: the device's calibrated streaming bandwidth."""
    usable = [k for k in kernels if k.get("gb_per_s_median")]
    if not usable:
        raise RooflineError("no calibration kernel produced a bandwidth")
    return max(usable, key=lambda k: k["gb_per_s_median"])


def kv_slope(points: Sequence[tuple[int, float, float]], min_rise: float = SLOPE_MIN_RISE) -> dict[str, Any]:
    """Marginal KV bandwidth from (ctx, kv_read_bytes, step_ms) at one batch.

    Only adjacent points (sorted by ctx) whose step time rises by more than `min_rise` count: small
    deltas are noise over noise (the reference's bogus 841 GB/s). Each qualifying pair's slope is
    ΔKV bytes / Δtime; the marginal bandwidth and the intercept (the step's fixed cost, time at zero
    KV) come from a least-squares line through the points of qualifying pairs."""
    pts = sorted(points)
    pairs, used = [], set()
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
        out |= {"marginal_kv_gb_per_s": None, "intercept_ms": None, "slope_note": _no_slope_note(pts, min_rise)}
        return out
    import numpy as np

    xs = np.array([b for _, b, _ in sorted(used)], dtype=np.float64)
    ys = np.array([t for _, _, t in sorted(used)], dtype=np.float64)
    slope_ms_per_byte, intercept = np.polyfit(xs, ys, 1)
    out["marginal_kv_gb_per_s"] = 1.0 / (slope_ms_per_byte * 1e-3) / 1e9 if slope_ms_per_byte > 0 else None
    out["intercept_ms"] = float(intercept)
    out["slope_note"] = f"least squares over {len(used)} points of {sum(p['used'] for p in pairs)} qualifying pair(s)"
    return out


def _no_slope_note(pts: Sequence[tuple[int, float, float]], min_rise: float) -> str:
    if len(pts) < 2:
        return "needs at least two contexts at this batch"
    rises = ", ".join(f"{100 * (b[2] / a[2] - 1):+.1f}%" for a, b in zip(pts, pts[1:], strict=False))
    return (
        f"no adjacent contexts with step time rising > {100 * min_rise:.0f}% ({rises}): KV is too small a share "
        "of the step at this batch; raise --batch or widen --ctx"
    )


# ------------------------------------------------------------------------------------- children


def _device_memory_bytes() -> int:
    """Memory the device may hold: the allocator's bytes_limit on an accelerator, RAM on the CPU."""
    import jax
    import psutil

    stats = jax.devices()[0].memory_stats() or {}
    return int(stats.get("bytes_limit") or psutil.virtual_memory().total)


def _time_ms(fn: Any, *args: Any, reps: int) -> list[float]:
    import jax

    jax.block_until_ready(fn(*args))
    out = []
    for _ in range(reps):
        t0 = time.perf_counter()
        jax.block_until_ready(fn(*args))
        out.append((time.perf_counter() - t0) * 1e3)
    return out


def calibrate_child(payload: dict[str, Any]) -> dict[str, Any]:
    """Isolated child: stream f32 buffers of several sizes through sum, max, a matvec and a copy.

    Bytes per call: the buffer for the reductions and the matvec (its vector is negligible), twice
    the buffer for the copy (read + write). Returns each kernel × size with median and best GB/s."""
    import jax
    import jax.numpy as jnp

    from harness.env import device_info
    from harness.stats import summarize

    memory = _device_memory_bytes()
    fractions = payload.get("fractions") or CALIBRATION_FRACTIONS
    reps = int(payload.get("reps", CALIBRATION_REPS))
    kernels = {
        "sum": (jax.jit(lambda x: jnp.sum(x)), 1),
        "max": (jax.jit(lambda x: jnp.max(x)), 1),
        "matvec": (jax.jit(lambda x, v: x.reshape(-1, MATVEC_COLS) @ v), 1),
        "copy": (jax.jit(lambda x: x + 1.0), 2),
    }
    results = []
    for frac in fractions:
        n = max(MATVEC_COLS, int(memory * frac) // 4 // MATVEC_COLS * MATVEC_COLS)
        x = jax.block_until_ready(jnp.ones((n,), jnp.float32))
        v = jnp.ones((MATVEC_COLS,), jnp.float32)
        for name, (fn, factor) in kernels.items():
            args = (x, v) if name == "matvec" else (x,)
            st = summarize(_time_ms(fn, *args, reps=reps))
            moved = factor * x.nbytes
            results.append(
                {
                    "kernel": name,
                    "buffer_bytes": int(x.nbytes),
                    "gb_per_s_median": moved / (st.median * 1e-3) / 1e9,
                    "gb_per_s_best": moved / (st.min * 1e-3) / 1e9,
                    "rel_iqr_pct": st.rel_iqr_pct,
                }
            )
        del x
    return {"kernels": results, "device_memory_bytes": memory, "device": device_info()}


def _xla_cost(compiled: Any) -> dict[str, Any]:
    """flops and bytes accessed from XLA's cost_analysis (dict, or a list of dicts on older jax)."""
    try:
        raw = compiled.cost_analysis()
    except NotImplementedError:
        return {"xla_flops": None, "xla_bytes_accessed": None}
    if isinstance(raw, list | tuple):
        raw = raw[0] if raw else {}
    raw = raw or {}
    flops, accessed = raw.get("flops"), raw.get("bytes accessed")
    return {
        "xla_flops": float(flops) if flops is not None and flops >= 0 else None,
        "xla_bytes_accessed": float(accessed) if accessed is not None and accessed >= 0 else None,
    }


def step_child(payload: dict[str, Any]) -> dict[str, Any]:
    """Isolated child: the engine's decode step for one shape: compile, cost_analysis, time it."""
    from harness.env import device_info
    from harness.isolate import configure_jax_cache
    from harness.revalidate import measure_bench

    configure_jax_cache()
    from g4bench.engine.bench import DecodeCase, make_decode_bench

    bench = make_decode_bench(DecodeCase(**payload["case"]), seed=int(payload.get("seed", 0)))
    result = measure_bench(bench, int(payload["samples"]), int(payload["warmup"]))
    result |= _xla_cost(bench.compiled)
    result["device"] = device_info()
    return result


