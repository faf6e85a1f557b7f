"""Timing decode steps inside a measuring child: warm buffers, pinned threads, host load per sample.

Data flow (one child = one visit: one configuration, or a group of configurations sharing weights)::

    pin_threads(cpus)                 before jax starts: XLA sizes its CPU pool from the affinity mask
    measure_benches(benches, samples, warmup, rng)      (measure_bench: a group of one)
        compile_s = bench.compile()                for each bench
        state = bench.fresh_inputs()               for each, allocated once, outside the timing
        warmup × state = bench.advance(state)      untimed: the buffers are touched and warm
        samples × [each bench in a fresh random order: t0; state = bench.advance(state); t1]
        host load read over windows of ≥ MIN_WINDOW_S spanning whole passes (harness/hostload.py),
        and, on the CPU, the memory bandwidth probed once after each window, outside the timed steps
    → per bench {"step_ms_samples", "minor_faults", "host_other_cores", "host_steal_frac",
       "host_freq_mhz", "host_mem_gbs", "compile_s", "memory_pages": {"rss_bytes", "anon_huge_bytes"}, ...}

Only the step sits between the two `perf_counter` calls. The state carries the cache from step to
step (a donated step updates it in place, a copying one writes a new cache), so no sample pays for
an allocation a server would not make. Each sample also carries the minor page faults the step
took (getrusage): a step whose temporaries are faulted in afresh shows it there (harness/isolate.py's
malloc tuning keeps that near zero on Linux). Benches without `advance` (tests' fakes, older probes) fall
back to `step(fresh_inputs())` with the input building outside the timed region.
"""

from __future__ import annotations

import os
import resource
from collections.abc import Sequence
from pathlib import Path
from time import perf_counter  # a module attribute, so a test can put a fake clock here
from typing import Any

import numpy as np

from harness.hostload import MIN_WINDOW_S, HostLoadMeter, MemoryProbe


def pin_threads(cpus: Sequence[int] | None) -> list[int]:
    """Restrict this process (and the thread pool XLA sizes from it) to `cpus`; returns the set used.

    None keeps the inherited affinity. Call before importing jax."""
    if cpus:
        os.sched_setaffinity(0, set(cpus))
    return sorted(os.sched_getaffinity(0))


def _minor_faults() -> int:
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_minflt)


def _one_step(bench: Any, state: Any) -> tuple[Any, float, int]:
    """(next state, milliseconds of the step alone, minor page faults during it)."""
    if hasattr(bench, "advance"):
        f0, t0 = _minor_faults(), perf_counter()
        state = bench.advance(state)
        return state, (perf_counter() - t0) * 1e3, _minor_faults() - f0
    inputs = bench.fresh_inputs()
    f0, t0 = _minor_faults(), perf_counter()
    bench.step(inputs)
    elapsed, faults = (perf_counter() - t0) * 1e3, _minor_faults() - f0
    del inputs
    return state, elapsed, faults


def time_steps(bench: Any, samples: int, warmup: int) -> dict[str, list[Any]]:
    """`samples` timed steps after `warmup` untimed ones, with the host's other load per sample.

    Returns lists of equal length: ``step_ms``, ``faults``, ``other_cores``, ``steal_frac``, ``freq_mhz``,
    and ``mem_gbs`` (empty: no probe)."""
    return time_interleaved([bench], samples, warmup)[0]


def time_interleaved(
    benches: Sequence[Any],
    samples: int,
    warmup: int,
    rng: np.random.Generator | None = None,
    probe: MemoryProbe | None = None,
) -> list[dict[str, list[Any]]]:
    """`time_steps` for several benches in one process, their samples interleaved: `warmup` untimed
    steps of each (in list order), then `samples` passes, each stepping every bench once in a fresh
    random order (`rng`; list order when None). Whatever slows the process for a while (a steal
    burst, a neighbour) then lands on every bench alike instead of on whichever ran at that moment.

    Host load is read over windows of whole steps lasting at least MIN_WINDOW_S; every step of a
    window gets its reading, and the memory bandwidth `probe` (none when None) reads
    once right after the window closes, outside the timed steps. Returns one `time_steps` dict per
    bench, in list order."""
    states = [b.fresh_inputs() if hasattr(b, "advance") else None for b in benches]
    for i, bench in enumerate(benches):
        for _ in range(warmup):
            states[i], _, _ = _one_step(bench, states[i])
    keys = ("step_ms", "faults", "other_cores", "steal_frac", "freq_mhz", "mem_gbs")
    out: list[dict[str, list[Any]]] = [{k: [] for k in keys} for _ in benches]
    meter = HostLoadMeter()
    window: list[tuple[int, float]] = []  # (bench index, ms) of the steps in the open window
    window_start = perf_counter()
    meter.start()
    for s in range(samples):
        order = range(len(benches)) if rng is None else rng.permutation(len(benches)).tolist()
        for j in order:
            states[j], ms, faults = _one_step(benches[j], states[j])
            window.append((j, ms))
            out[j]["faults"].append(faults)
        last = s == samples - 1
        if last or perf_counter() - window_start >= MIN_WINDOW_S:
            load = meter.stop()
            mem_gbs = probe.read_gbs() if probe is not None else None
            for j, ms in window:
                out[j]["step_ms"].append(ms)
                out[j]["other_cores"].append(load.other_cores)
                out[j]["steal_frac"].append(load.steal_frac)
                out[j]["freq_mhz"].append(load.freq_mhz)
                if mem_gbs is not None:
                    out[j]["mem_gbs"].append(mem_gbs)
            window = []
            window_start = perf_counter()
            if not last:
                meter.start()
    return out


def memory_pages() -> dict[str, int] | None:
    """This process's resident bytes and how many of them sit in transparent huge pages (Linux
    /proc/self/smaps_rollup; None elsewhere). A step streaming 10 GB of weights through 4 KiB pages
    misses the TLB far more than through 2 MiB ones, so the share is kept beside each visit."""
    try:
        text = Path("/proc/self/smaps_rollup").read_text(encoding="ascii")
    except OSError:
        return None
    kib = {}
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        if key in ("Rss", "AnonHugePages") and (fields := rest.split()):
            kib[key] = int(fields[0])
    if "Rss" not in kib:
        return None
    return {"rss_bytes": kib["Rss"] * 1024, "anon_huge_bytes": kib.get("AnonHugePages", 0) * 1024}


def _steps_on_cpu() -> bool:
    import jax

    return jax.default_backend() == "cpu"


def measure_bench(bench: Any, samples: int, warmup: int) -> dict[str, Any]:
    """Compile `bench` (timed apart), then `time_steps`; the child's result fields."""
    return measure_benches([bench], samples, warmup)[0]


def measure_benches(
    benches: Sequence[Any],
    samples: int,
    warmup: int,
    rng: np.random.Generator | None = None,
    probe: MemoryProbe | None = None,
) -> list[dict[str, Any]]:
    """Compile every bench (each timed apart), then `time_interleaved`; one result per bench.

    `probe`: the memory bandwidth probe; None reads a fresh MemoryProbe where the steps run on the
    host's CPU (JAX's default backend), and none on an accelerator, whose steps do not stream host
    memory."""
    if probe is None and _steps_on_cpu():
        probe = MemoryProbe()
    compile_s = [float(b.compile()) for b in benches]
    timed = time_interleaved(benches, samples, warmup, rng, probe)
    pages = memory_pages()  # the process's, shared by every bench it measured
    return [
        {
            "step_ms_samples": t["step_ms"],
            "minor_faults": t["faults"],
            "host_other_cores": t["other_cores"],
            "host_steal_frac": t["steal_frac"],
            "host_freq_mhz": t["freq_mhz"],
            **({"host_mem_gbs": t["mem_gbs"]} if t["mem_gbs"] else {}),
            "compile_s": c,
            "weights_bytes": int(b.weights_bytes),
            "kv_bytes": int(b.kv_bytes),
            **({"memory_pages": pages} if pages is not None else {}),
        }
        for b, c, t in zip(benches, compile_s, timed, strict=True)
    ]
