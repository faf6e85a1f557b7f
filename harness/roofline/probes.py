"""The measuring children of `g4bench roofline` (each runs in a fresh process via harness.isolate).

- `calibrate_child`: the device's streaming bandwidth. A single reduction under-reads memory on
  some devices (on the 2-core CPU a jnp.sum over 512 MiB reads 29.5 GB/s, a jnp.max 21.8 GB/s,
  both slower than a batch-1 matvec; DESIGN, Machines), so four kernels — sum, max, a matvec and a
  copy — stream f32 buffers sized as fractions of the device's memory, and the parent takes the
  best median as the calibrated bandwidth (harness/roofline/main.py `pick_calibration`).
- `step_child`: the engine's own decode step (g4bench/engine/bench.py) for one shape: compile,
  XLA's cost_analysis of the compiled step, then `measure_bench` (harness/timing.py): samples of
  one step each on fresh inputs built outside the timing.
- `breakdown_child`: the step's big parts timed alone at the step's shapes — the LM head exactly as
  forward computes it, the linears of one layer of each kind, the sampler — with the bytes each
  streams and how often the step runs it, so the parent can say where the step's time goes.

Each returns a JSON-ready dict with a `device` block (harness/env.py `device_info`).
"""

from __future__ import annotations

import time
from typing import Any

CALIBRATION_FRACTIONS = (1 / 96, 1 / 48, 1 / 24)  # buffer sizes as fractions of device memory
CALIBRATION_REPS = 10
MATVEC_COLS = 4096


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


def _time_chained(fn: Any, x: Any, reps: int) -> tuple[list[float], Any]:
    """Milliseconds of `reps` calls x = fn(x) (a donated in-place kernel); returns the last x too."""
    import jax

    x = jax.block_until_ready(fn(x))
    out = []
    for _ in range(reps):
        t0 = time.perf_counter()
        x = jax.block_until_ready(fn(x))
        out.append((time.perf_counter() - t0) * 1e3)
    return out, x


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
        # donated and fed back, so each call rewrites the same pages (a fresh output buffer per
        # call would time first-touch page faults, not streaming)
        "copy": (jax.jit(lambda x: x + 1.0, donate_argnums=0), 2),
    }
    results = []
    for frac in fractions:
        n = max(MATVEC_COLS, int(memory * frac) // 4 // MATVEC_COLS * MATVEC_COLS)
        x = jax.block_until_ready(jnp.ones((n,), jnp.float32))
        v = jnp.ones((MATVEC_COLS,), jnp.float32)
        for name, (fn, factor) in kernels.items():
            if name == "copy":
                times, x = _time_chained(fn, x, reps)
            else:
                times = _time_ms(fn, *((x, v) if name == "matvec" else (x,)), reps=reps)
            st = summarize(times)
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
    return {
        "kernels": results,
        "device_memory_bytes": memory,
        "fractions": list(fractions),
        "reps": reps,
        "device": device_info(),
    }


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
    from harness.timing import measure_bench

    configure_jax_cache()
    from g4bench.engine.bench import DecodeCase, make_decode_bench

    bench = make_decode_bench(DecodeCase(**payload["case"]), seed=int(payload.get("seed", 0)))
    result = measure_bench(bench, int(payload["samples"]), int(payload["warmup"]))
    result |= _xla_cost(bench.compiled)
    result["device"] = device_info()
    return result


def _random_like(spec: Any, key: Any) -> Any:
    """Random values of a parameter leaf's shape and dtype (packed int4 words: random bits)."""
    import jax
    import jax.numpy as jnp

    if spec.dtype == jnp.int32:
        return jax.lax.bitcast_convert_type(jax.random.bits(key, spec.shape, jnp.uint32), jnp.int32)
    if jnp.issubdtype(spec.dtype, jnp.integer):
        return jnp.zeros(spec.shape, spec.dtype)
    scale = 0.004 if len(spec.shape) == 2 and spec.shape[1] < spec.shape[0] // 8 else 0.02
    return (jax.random.normal(key, spec.shape, jnp.float32) * scale).astype(spec.dtype)


def _layer_linears(lp: dict[str, Any], x: Any) -> Any:
    """Every linear of one layer in forward's order (q, k, v, o, gate/up/down, PLE gate/up) at the
    step's shapes; attention, norms and RoPE left out. x [B, 1, H] → [B, 1, H]."""
    import jax

    from g4bench.model.forward import linear

    out = x + linear(linear(x, lp["q"]), lp["o"])
    if "k" in lp:
        out = out + linear(x, lp["k"]).sum() + linear(x, lp["v"]).sum()
    out = out + linear(
        jax.nn.gelu(linear(out, lp["gate"]), approximate=True) * linear(out, lp["up"]), lp["down"]
    )
    if "ple_gate" in lp:
        out = out + linear(jax.nn.gelu(linear(out, lp["ple_gate"]), approximate=True), lp["ple_up"])
    return out


def layer_groups(cfg: Any) -> dict[str, list[int]]:
    """Layers grouped by what their linears look like: KV-owning or shared × sliding or full."""
    groups: dict[str, list[int]] = {}
    for i in range(cfg.num_hidden_layers):
        kind = f"linears: {'owning' if cfg.owns_kv(i) else 'shared'} {'full' if cfg.is_full(i) else 'sliding'} layer"
        groups.setdefault(kind, []).append(i)
    return groups


def breakdown_child(payload: dict[str, Any]) -> dict[str, Any]:
    """Isolated child: the step's big parts timed alone at the step's shapes — the LM head exactly
    as forward computes it, the linears of one layer of each kind, the sampler — each with the
    bytes it streams and how many times the step runs it, so the parent can attribute the step time."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    from g4bench.engine.bench import DecodeCase
    from g4bench.engine.engine import platform_compute_dtype
    from g4bench.engine.sampling import SamplingState, sample
    from g4bench.model.config import load_config
    from g4bench.model.params import param_specs, tree_bytes
    from harness.env import device_info

    case = DecodeCase(**payload["case"])
    reps = int(payload.get("reps", 7))
    cfg, cdt, B = load_config(case.model), platform_compute_dtype(), case.batch
    specs = param_specs(cfg, case.weight_format)
    key = jax.random.PRNGKey(0)
    parts = []

    def add(name: str, count: int, fn: Any, args: tuple[Any, ...], nbytes: int) -> None:
        ms = float(np.median(_time_ms(fn, *args, reps=reps)))
        parts.append({"part": name, "count": count, "ms_each": ms, "bytes_each": int(nbytes)})

    embed = _random_like(specs["embed"], key)
    h = jnp.ones((B, 1, cfg.hidden_size), cdt)
    lm_head = jax.jit(
        lambda h, e: jnp.einsum("bth,vh->btv", h, e.astype(cdt), preferred_element_type=jnp.float32)
    )
    add("lm_head", 1, lm_head, (h, embed), embed.nbytes)
    del embed
    for name, layers in layer_groups(cfg).items():
        leaves, treedef = jax.tree_util.tree_flatten(specs["layers"][layers[0]])
        keys = jax.random.split(key, len(leaves))
        lp = jax.tree_util.tree_unflatten(
            treedef, [_random_like(s, k) for s, k in zip(leaves, keys, strict=True)]
        )
        add(name, len(layers), jax.jit(_layer_linears), (lp, h), tree_bytes(specs["layers"][layers[0]]))
        del lp
    logits = jax.random.normal(key, (B, cfg.vocab_size), jnp.float32)
    positions = jnp.zeros((B,), jnp.int32)
    add(
        "sampler",
        1,
        jax.jit(sample),
        (logits, positions, SamplingState.greedy(B)),
        logits.nbytes,
    )
    return {"parts": parts, "device": device_info()}
