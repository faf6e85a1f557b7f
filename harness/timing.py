"""Timing decode steps inside a measuring child: warm buffers, pinned threads, host load per sample.

Data flow (one child = one visit of one configuration)::

    pin_threads(cpus)                 before jax starts: XLA sizes its CPU pool from the affinity mask
    measure_bench(bench, samples, warmup)
        compile_s = bench.compile()
        state = bench.fresh_inputs()               allocated once, outside the timing
        warmup × state = bench.advance(state)      untimed: the buffers are touched and warm
        samples × [t0; state = bench.advance(state); t1]
        host load read over windows of ≥ MIN_WINDOW_S spanning whole samples (harness/hostload.py)
    → {"step_ms_samples", "minor_faults", "host_other_cores", "host_steal_frac", "host_freq_mhz",
       "compile_s", "memory_pages": {"rss_bytes", "anon_huge_bytes"}, ...}

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
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from harness.hostload import MIN_WINDOW_S, HostLoadMeter


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
        f0, t0 = _minor_faults(), time.perf_counter()
        state = bench.advance(state)
        return state, (time.perf_counter() - t0) * 1e3, _minor_faults() - f0
    inputs = bench.fresh_inputs()
    f0, t0 = _minor_faults(), time.perf_counter()
    bench.step(inputs)
    elapsed, faults = (time.perf_counter() - t0) * 1e3, _minor_faults() - f0
    del inputs
    return state, elapsed, faults


def time_steps(bench: Any, samples: int, warmup: int) -> dict[str, list[Any]]:
    """`samples` timed steps after `warmup` untimed ones, with the host's other load per sample.

    Returns lists of equal length: ``step_ms``, ``faults``, ``other_cores``, ``steal_frac``, ``freq_mhz``."""
    state = bench.fresh_inputs() if hasattr(bench, "advance") else None
    for _ in range(warmup):
        state, _, _ = _one_step(bench, state)
    meter = HostLoadMeter()
    out: dict[str, list[Any]] = {"step_ms": [], "faults": [], "other_cores": [], "steal_frac": [], "freq_mhz": []}
    window: list[float] = []
    window_start = time.perf_counter()
    meter.start()
    for i in range(samples):
        state, ms, faults = _one_step(bench, state)
        window.append(ms)
        out["faults"].append(faults)
        last = i == samples - 1
        if last or time.perf_counter() - window_start >= MIN_WINDOW_S:
            load = meter.stop()
            out["step_ms"].extend(window)
            out["other_cores"].extend([load.other_cores] * len(window))
            out["steal_frac"].extend([load.steal_frac] * len(window))
            out["freq_mhz"].extend([load.freq_mhz] * len(window))
            window = []
            window_start = time.perf_counter()
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


def measure_bench(bench: Any, samples: int, warmup: int) -> dict[str, Any]:
    """Compile `bench` (timed apart), then `time_steps`; the child's result fields."""
    compile_s = float(bench.compile())
    timed = time_steps(bench, samples, warmup)
    pages = memory_pages()
    return {
        "step_ms_samples": timed["step_ms"],
        "minor_faults": timed["faults"],
        "host_other_cores": timed["other_cores"],
        "host_steal_frac": timed["steal_frac"],
        "host_freq_mhz": timed["freq_mhz"],
        "compile_s": compile_s,
        "weights_bytes": int(bench.weights_bytes),
        "kv_bytes": int(bench.kv_bytes),
        **({"memory_pages": pages} if pages is not None else {}),
    }
