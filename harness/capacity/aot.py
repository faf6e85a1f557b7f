"""Compile the engine's decode step (or a batched prefill) for a device, and read what the compiler says.

Why: "can one chip hold my fleet?" is answered without the chip. With libtpu installed, JAX compiles
for a TPU topology on any x86-64 Linux host (`jax.experimental.topologies`); the TPU compiler
refuses a program whose buffers exceed the chip's usable HBM (``CompileTimeHbmOom``) and otherwise
reports `memory_analysis()` and `cost_analysis()` (capacity-anchors A7, A8). For the local device
the same compile gives the breakdown the bisection's runs are read against. With jax's CUDA plugin
installed (no GPU needed), a GPU target compiles for XLA's description of the part
(`cuda_topology`); XLA:GPU never refuses for memory, so there a probe fits when its compiled peak is
within the payload's `limit_bytes`.

Data flow (one compile per fresh child, `harness.isolate.run_isolated(COMPILE_TARGET, payload)`)::

    payload {program: "decode"|"prefill", case: DecodeCase fields, tokens, target, compute}
      → program_for(): the engine's own step (`DecodeBench.jitted`, `abstract_args(sharding)`), or
        `prefill_batch` over B rows × T tokens (g4bench.model.forward.forward, the engine's forward)
      → jitted.lower(*abstract args placed on the target's compile-only device).compile()
      → {"fits": True, memory breakdown, XLA cost figures, the bytes-moved model}   or
        {"fits": False, "oom_required_bytes", "oom_available_bytes"}  (the compiler's own limit)

Findings on this host (jax 0.10.2, libtpu 0.0.52): the topology API works with JAX_PLATFORMS=cpu
set (the compile-only TPU devices come from the libtpu plugin, independent of the default
backend), so children keep JAX_PLATFORMS=cpu and never touch an accelerator. A rejected E2B
decode compile returns in ~10 s; one that fits takes ~100 s (code generation), and leaves ~1-2 GB
of host RSS behind, which is one reason each probe is its own process.

Peak memory is args + outputs + temps − aliased (donated) bytes. `peak_memory_in_bytes` is
reported too but not used: on the CPU it excludes temps, on TPU it includes a cross-program
prefetch copy (capacity-anchors A7). XLA's `optimal_seconds` and "bytes accessed" are checked
against the bytes-moved model (g4bench.model.costs) before they are shown, and are never the
prediction: for this step they come out negative or several times the real traffic.
"""

from __future__ import annotations

import re
import resource
import time
from dataclasses import fields as dc_fields
from pathlib import Path
from typing import Any

COMPILE_TARGET = "harness.capacity.aot:compile_child"
# Why a GPU target's step is plain JAX (recorded with every GPU probe).
GPU_ATTENTION_NOTE = (
    "plain JAX attention: jax.experimental.pallas.ops.gpu paged_attention / decode_attention are not "
    "wired to the engine's block pools (two pools per layer, int8 per-token scales, ring windows)"
)
# libtpu takes /tmp/libtpu_lockfile even for compile-only devices, so without the last variable a
# second compiling process (a test, another run) fails with "Internal error when accessing libtpu
# multi-process lockfile". Compile-only children hold no chip, so sharing is safe.
TPU_CHILD_ENV = {"TPU_SKIP_MDS_QUERY": "1", "JAX_PLATFORMS": "cpu", "ALLOW_MULTIPLE_LIBTPU_LOAD": "1"}
# The compiler words a compile-time HBM OOM two ways (both seen for v6e:1x1, libtpu 0.0.52):
#   "... required for HLO temporaries (31.50G) exceeds available HBM (31.24G) ..."
#   "... Ran out of memory in memory space hbm. Used 31.26G of 31.24G hbm. ..."
_OOM_RES = (
    re.compile(r"required for HLO temporaries \(([\d.]+)([KMGT])\) exceeds available HBM \(([\d.]+)([KMGT])\)"),
    re.compile(r"Used ([\d.]+)([KMGT]) of ([\d.]+)([KMGT]) hbm"),
)
_UNITS = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}
# An XLA figure is "plausible" within this factor of the bytes-moved model (both directions).
COST_SANITY_FACTOR = 3.0


def parse_hbm_oom(text: str) -> tuple[int, int] | None:
    """(required, available) bytes from a CompileTimeHbmOom message, or None if it is not one.
    The compiler prints binary units with two decimals ("31.77G" = 31.77 GiB), ±5 MiB."""
    m = next((m for m in (r.search(text) for r in _OOM_RES) if m is not None), None)
    if m is None:
        return None
    return int(float(m.group(1)) * _UNITS[m.group(2)]), int(float(m.group(3)) * _UNITS[m.group(4)])


def is_compile_oom(text: str) -> bool:
    return "CompileTimeHbmOom" in text or ("RESOURCE_EXHAUSTED" in text and "HBM" in text)


def memory_fields(ma: Any) -> dict[str, int]:
    """A CompiledMemoryStats as record fields, plus the peak estimate args + out + temp − alias."""
    out = {
        "argument_bytes": int(ma.argument_size_in_bytes),
        "output_bytes": int(ma.output_size_in_bytes),
        "alias_bytes": int(ma.alias_size_in_bytes),
        "temp_bytes": int(ma.temp_size_in_bytes),
        "generated_code_bytes": int(ma.generated_code_size_in_bytes),
    }
    out["peak_bytes"] = out["argument_bytes"] + out["output_bytes"] + out["temp_bytes"] - out["alias_bytes"]
    xla_peak = getattr(ma, "peak_memory_in_bytes", None)
    if xla_peak is not None:
        out["xla_peak_memory_bytes"] = int(xla_peak)
    return out


def cost_fields(ca: Any) -> dict[str, float]:
    """XLA's cost_analysis (a dict in jax 0.10; a one-element list in older versions)."""
    if isinstance(ca, list | tuple):
        ca = ca[0] if ca else {}
    ca = ca or {}
    out = {}
    for key, name in (
        ("flops", "xla_flops"),
        ("bytes accessed", "xla_bytes_accessed"),
        ("optimal_seconds", "xla_optimal_s"),
    ):
        if key in ca:
            out[name] = float(ca[key])
    return out


def check_cost(xla: dict[str, float], model_bytes: int, bandwidth: float | None) -> dict[str, Any]:
    """Judge XLA's figures against the bytes-moved model; a figure outside [1/F, F]× the model
    (F = COST_SANITY_FACTOR), or a non-positive time, is flagged with the reason and not used."""
    notes = []
    ok_bytes = ok_time = False
    b = xla.get("xla_bytes_accessed")
    if b is not None and model_bytes > 0:
        r = b / model_bytes
        ok_bytes = 1 / COST_SANITY_FACTOR <= r <= COST_SANITY_FACTOR
        if not ok_bytes:
            notes.append(
                f"bytes accessed {b / 1e9:.1f} GB is {r:.2f}x the bytes-moved model ({model_bytes / 1e9:.2f} GB)"
            )
    t = xla.get("xla_optimal_s")
    if t is not None:
        if t <= 0:
            notes.append(f"optimal_seconds {t:.3g} s is not a time (non-positive)")
        elif bandwidth:
            r = t / (model_bytes / bandwidth)
            ok_time = 1 / COST_SANITY_FACTOR <= r <= COST_SANITY_FACTOR
            if not ok_time:
                notes.append(f"optimal_seconds {t * 1e3:.1f} ms is {r:.2f}x the roofline time")
    return {
        "xla_bytes_plausible": ok_bytes,
        "xla_time_plausible": ok_time,
        "xla_cost_notes": "; ".join(notes),
    }


# ---------------------------------------------------------------------------------- programs


def case_from(payload_case: dict[str, Any]) -> Any:
    from g4bench.engine.bench import DecodeCase

    names = {f.name for f in dc_fields(DecodeCase)}
    return DecodeCase(**{k: v for k, v in payload_case.items() if k in names})


def prefill_batch(params, cache, tokens, start, n_valid, *, cfg, layout, cdt, kv_len):
    """B rows × T tokens through the engine's forward, written into a B-row cache; next-token logits.
    The engine prefills one slot per call; this batched form is what admission needs to size."""
    from g4bench.model.forward import forward

    logits, cache = forward(
        params, tokens, start, n_valid, cache, cfg, layout, kv_len=kv_len, compute_dtype=cdt
    )
    return cache, logits


def program_for(
    payload: dict[str, Any], sharding: Any, compute_dtype: Any, attention_block: Any = None
) -> tuple[Any, tuple[Any, ...], dict[str, Any]]:
    """(jitted program, abstract args, facts) for a decode step or a batched prefill call.

    Prefill: T = `tokens` new tokens per row written at positions ctx − T … ctx − 1 and attending
    over the whole ctx (the last chunk of a chunked prefill is the largest); T = ctx is one-shot."""
    from functools import partial

    import jax
    import jax.numpy as jnp

    from g4bench.engine.bench import make_decode_bench
    from g4bench.model import costs
    from g4bench.model.kv_cache import cache_specs

    bench = make_decode_bench(case_from(payload["case"]), compute_dtype=compute_dtype, attention_block=None)
    bench.attention_block = attention_block  # an int, None or a PagedKernel (target_attention)
    case, cfg = bench.case, bench.cfg
    facts = {"weights_bytes": bench.weights_bytes, "kv_bytes": bench.kv_bytes}
    if payload.get("program", "decode") == "decode":
        cost = costs.decode_cost(
            cfg, case.weight_format, case.layout, case.batch, case.ctx, donated=case.donate
        )
        facts["model_bytes"] = cost.bytes
        return bench.jitted, bench.abstract_args(sharding), facts
    T = int(payload["tokens"])
    if not 1 <= T <= case.ctx:
        raise ValueError(f"prefill tokens must be 1..ctx ({case.ctx}), got {T}")
    B = case.batch
    fn = partial(prefill_batch, cfg=cfg, layout=case.layout, cdt=compute_dtype, kv_len=case.ctx)

    def place(s: Any) -> Any:
        return jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sharding) if sharding is not None else s

    from g4bench.model.params import param_specs

    args = (
        param_specs(cfg, case.weight_format),
        cache_specs(cfg, B, case.layout),
        jax.ShapeDtypeStruct((B, T), jnp.int32),
        jax.ShapeDtypeStruct((B,), jnp.int32),
        jax.ShapeDtypeStruct((B,), jnp.int32),
    )
    cost = costs.prefill_cost(cfg, case.weight_format, case.layout, T, case.ctx, rows=B)
    facts["model_bytes"] = cost.bytes
    return jax.jit(fn, donate_argnums=bench.donate_argnums), jax.tree_util.tree_map(place, args), facts


def target_device(target: str) -> tuple[Any, dict[str, Any]]:
    """(sharding or None, device facts) for "local" (the default JAX device) or a hardware id
    with an `aot_topology` (a compile-only device from libtpu)."""
    if target == "local":
        from harness.env import device_info

        return None, device_info()
    from jax.experimental import topologies
    from jax.sharding import SingleDeviceSharding

    from harness.hardware import load_hardware

    hw = load_hardware(target)
    if not hw.aot_topology:
        raise ValueError(
            f"{target}: no aot_topology in its hardware definition; cannot compile for it offline"
        )
    if hw.platform == "gpu":
        topo = cuda_topology(hw)
    else:
        topo = topologies.get_topology_desc(hw.aot_topology, platform=hw.platform)
    dev = topo.devices[0]
    info = {
        "platform": hw.platform,
        # jax's stubs leave the topology's device type unresolved (`Device?`); it has device_kind
        "device_kind": dev.device_kind,  # type: ignore[attr-defined]
        "device_count": len(topo.devices),
    }
    return SingleDeviceSharding(dev), info


def has_cuda_plugin() -> bool:
    """Whether jax's CUDA plugin is importable here (what a deviceless GPU compile needs)."""
    import importlib.util

    try:
        return importlib.util.find_spec("jax_plugins.xla_cuda12") is not None
    except ModuleNotFoundError:  # no jax_plugins namespace at all
        return False


def cuda_plugin_needed(target: str) -> str:
    """What to say when a GPU target is asked for on a host without the CUDA plugin."""
    import jax

    return (
        f"{target}: a deviceless GPU compile needs jax's CUDA plugin on this host (no GPU needed): "
        f'pip install "jax-cuda12-plugin[with-cuda]=={jax.__version__}"; or on the GPU itself run '
        "`g4bench capacity --target local`"
    )


def cuda_topology(hw: Any) -> Any:
    """The compile-only CUDA device `hw` describes (its topology and GpuTargetConfig), on a host
    with no GPU: jax's CUDA plugin compiles for it (openxla/xla #16913). Without the plugin jax
    says "topology not implemented for cuda"; the error here says what to install instead."""
    from jax.experimental import topologies

    try:
        return topologies.get_topology_desc(
            platform="cuda", topology=hw.aot_topology, target_config=hw.target_config_text()
        )
    except NotImplementedError as exc:
        raise RuntimeError(f"{cuda_plugin_needed(hw.id)} ({exc})") from exc


def target_attention(payload: dict[str, Any], platform: str) -> tuple[Any, str]:
    """(forward's attention argument, its name) for the step compiled for `platform`.

    `payload["attention"]`: "auto" (default) is what the engine serves there: the Pallas paged
    kernel (g4bench/model/paged_kernels.py) for a paged layout on TPU, one XLA pass otherwise;
    "xla" forces the plain-JAX paged read (a gather) for comparison; "pallas" demands the kernel
    and is an error where it cannot run."""
    from g4bench.engine.engine import platform_attention_block
    from g4bench.model.paged_kernels import PagedKernel

    choice = payload.get("attention") or "auto"
    paged = payload["case"].get("kv_layout") == "paged"
    if choice not in ("auto", "xla", "pallas"):
        raise ValueError(f"attention must be auto, xla or pallas; got {choice!r}")
    if choice == "pallas" and not (paged and platform == "tpu"):
        raise ValueError("the Pallas paged kernel needs a paged KV layout and a TPU target")
    if paged and platform == "tpu" and choice != "xla":
        return PagedKernel(), "pallas-paged"
    if platform == "local-cpu":
        block = platform_attention_block()
        return block, f"xla-blocked-{block}" if block else "xla"
    return None, "xla"


def compile_program(payload: dict[str, Any]) -> dict[str, Any]:
    """Compile one program for `payload["target"]`; see the module docstring for the result.
    Compile-time HBM OOM is an answer (fits False); any other compiler error propagates."""
    import jax
    import jax.numpy as jnp

    from harness.isolate import configure_jax_cache

    configure_jax_cache()
    target = payload["target"]
    sharding, device = target_device(target)
    on_cpu = target == "local" and jax.default_backend() == "cpu"
    compute = payload.get("compute") or ("f32" if on_cpu else "bf16")
    cdt = {"f32": jnp.float32, "bf16": jnp.bfloat16}[compute]
    # the program the engine serves there: key-blocked attention on this host's CPU, the Pallas
    # paged kernel for a paged layout on TPU, one pass otherwise (target_attention)
    platform = "local-cpu" if on_cpu else device.get("platform", "local")
    attention, attention_name = target_attention(payload, platform)
    jitted, args, facts = program_for(payload, sharding, cdt, attention)
    result: dict[str, Any] = {"device": device, "compute": compute, "attention": attention_name, **facts}
    if platform == "gpu":
        result["attention_note"] = GPU_ATTENTION_NOTE
    t0 = time.perf_counter()
    lowered = jitted.lower(*args)
    try:
        compiled = lowered.compile()
    except jax.errors.JaxRuntimeError as exc:
        text = str(exc)
        if not is_compile_oom(text):
            raise
        parsed = parse_hbm_oom(text)
        result.update(fits=False, compile_s=time.perf_counter() - t0, oom_message=text.splitlines()[0][:400])
        if parsed:
            result.update(oom_required_bytes=parsed[0], oom_available_bytes=parsed[1])
        return result
    result.update(fits=True, compile_s=time.perf_counter() - t0, **memory_fields(compiled.memory_analysis()))
    if platform == "gpu":
        # XLA:GPU allocates at run time, so its compiler never refuses a program for memory: the
        # probe fits when the compiled peak (args + out + temps − donated) is within the limit.
        limit = int(payload["limit_bytes"])
        result.update(fits=result["peak_bytes"] <= limit, fits_rule=f"peak_bytes <= limit_bytes {limit}")
    try:
        result.update(cost_fields(compiled.cost_analysis()))
    except NotImplementedError:
        result["xla_cost_notes"] = "cost_analysis not implemented for this backend"
    result["host_vm_peak_bytes"] = vm_peak_bytes()
    return result


def vm_peak_bytes() -> int:
    """This process's peak virtual size (what RLIMIT_AS caps), from /proc; max RSS elsewhere."""
    status = Path("/proc/self/status")
    if status.is_file():
        for line in status.read_text(encoding="ascii").splitlines():
            if line.startswith("VmPeak:"):
                return int(line.split()[1]) * 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def compile_child(payload: dict[str, Any]) -> dict[str, Any]:
    """`harness.isolate` target: one compile, one result dict."""
    return compile_program(payload)
