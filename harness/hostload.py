"""What else the host was doing while a sample was timed: other processes' CPU, steal, frequency,
and the memory bandwidth left to us.

Why: on a shared CPU (CI runners, a laptop, a busy GPU box's host) a timed step competes with
whatever else runs. A benchmark that cannot see that blames the configuration for the host. Each
sample therefore carries the CPU time *other* processes used during it (in cores: 1.0 = one core
fully busy), the hypervisor's steal time and the clock frequency where the kernel exposes it, and
the verdicts leave out samples taken while others used more than `CONTAMINATED_CORES` or the
hypervisor stole `CONTAMINATED_STEAL` of the CPUs (`contaminated`).

Why steal has its own, lower bar: a decode step's threads meet at barriers, so a vCPU taken away for
a moment stalls every thread. On the 2-core dev VM (docs/findings.md §1.1)
samples with no steal ran at 0.96× their configuration's median (5% of them over 1.3×), samples with
≥ 1% steal at 1.17–1.36× (43–53% over 1.3×) — while other_cores (steal included) stayed under 0.2.
1% is one 10 ms tick in a 0.5 s window of two cores: the smallest steal the counter can show.

Why memory bandwidth too: a decode step streams its weights and cache from memory, and on a shared
VM the neighbours' memory traffic slows it without showing in any CPU counter. On the 2-core dev VM
one process stepping E2B (batch 4, ctx 8192) drifted between 1,000 and 1,600 ms within a minute
with other_cores and steal near zero, and a one-thread 1 GiB read timed between the steps followed it
(r = 0.45–0.68; docs/findings.md §1.2). So on the CPU each timing window
also times `MemoryProbe`, a read of `PROBE_BYTES` held by the child (harness/timing.py), and the
run summary says how far that bandwidth wandered and how much of the step-time spread it explains
(harness/revalidate/records.py). It is reported, not subtracted: the verdicts use the step times as
measured. A host counts as quiet only when the
probe's readings also stayed within `STEADY_BANDWIDTH_IQR_PCT` (relative IQR over the run): a
`revalidate --all` run flagged 6 of 180 samples by CPU time alone while the probe wandered
14.9% and the configurations' medians carried ±10% CIs.

Data flow (inside the measuring child)::

    meter = HostLoadMeter()             # remembers this process
    meter.start(); <timed step>; load = meter.stop()
        other_cores = (Δ system busy CPU time − Δ this process's CPU time) / Δ wall
        steal_frac  = Δ steal / (Δ wall × cores)
        freq_mhz    = psutil.cpu_freq().current (None where the kernel does not say)
    probe = MemoryProbe()               # allocates and touches PROBE_BYTES once
    mem_gbs = probe.read_gbs()          # after a window's steps, outside their timing

System busy time is user + nice + system + irq + softirq + steal summed over all cores
(psutil.cpu_times); this process's time includes every thread (XLA's pool too). Both clocks tick at
10 ms, so a reading is only as good as its window is long: the timing loop (harness/timing.py)
brackets consecutive samples until at least `MIN_WINDOW_S` has passed and gives each sample of the
window that window's reading.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import psutil

CONTAMINATED_CORES = 0.2  # samples during which other processes used more than this are flagged
CONTAMINATED_STEAL = 0.01  # ... or during which the hypervisor stole at least this share of the CPUs
MIN_WINDOW_S = 0.5  # shortest window read (10 ms ticks on both clocks: ≤ ~0.06 cores of error)
STEADY_BANDWIDTH_IQR_PCT = 5.0  # a quiet host's probe readings spread less than this (relative IQR)
PROBE_BYTES = 256 * 2**20  # the bandwidth probe's buffer: far past any cache, ~25 ms at 10 GB/s
_BUSY_FIELDS = ("user", "nice", "system", "irq", "softirq", "steal")


def contaminated(other_cores: float, steal_frac: float) -> bool:
    """Whether a sample was taken while the host was busy (module docstring)."""
    return other_cores > CONTAMINATED_CORES or steal_frac >= CONTAMINATED_STEAL


@dataclass(frozen=True)
class HostLoad:
    """The host's other activity during one timed sample."""

    other_cores: float  # CPU time of other processes ÷ wall time (cores)
    steal_frac: float  # hypervisor steal ÷ (wall × cores)
    freq_mhz: float | None

    @property
    def contaminated(self) -> bool:
        return contaminated(self.other_cores, self.steal_frac)


def _busy(times: object) -> float:
    return sum(float(getattr(times, f, 0.0)) for f in _BUSY_FIELDS)


def _own(proc: psutil.Process) -> float:
    t = proc.cpu_times()
    return float(t.user + t.system)


def _freq() -> float | None:
    freq = psutil.cpu_freq()
    return float(freq.current) if freq is not None and freq.current else None


class HostLoadMeter:
    """Brackets one timed region: `start()` before it, `stop()` after it returns its `HostLoad`."""

    def __init__(self) -> None:
        self._proc = psutil.Process()
        self._cores = psutil.cpu_count() or 1
        self._t0 = self._busy0 = self._own0 = self._steal0 = 0.0

    def start(self) -> None:
        sys_times = psutil.cpu_times()
        self._own0 = _own(self._proc)
        self._busy0 = _busy(sys_times)
        self._steal0 = float(getattr(sys_times, "steal", 0.0))
        self._t0 = time.perf_counter()

    def stop(self) -> HostLoad:
        wall = time.perf_counter() - self._t0
        sys_times = psutil.cpu_times()
        own = _own(self._proc) - self._own0
        busy = _busy(sys_times) - self._busy0
        steal = float(getattr(sys_times, "steal", 0.0)) - self._steal0
        # cpu_times tick at 10 ms: a short sample can read slightly negative; clamp at zero.
        other = max(0.0, busy - own) / wall if wall > 0 else 0.0
        return HostLoad(
            other_cores=other,
            steal_frac=max(0.0, steal) / (wall * self._cores) if wall > 0 else 0.0,
            freq_mhz=_freq(),
        )


class MemoryProbe:
    """A one-thread read bandwidth probe: times a sum over `nbytes` of float32 held for its life.

    The buffer is allocated and read once at construction, so every `read_gbs` streams memory that
    is already faulted in: it measures bandwidth, not page faults."""

    def __init__(self, nbytes: int = PROBE_BYTES) -> None:
        if nbytes < 4:
            raise ValueError(f"the probe needs at least one float32, got {nbytes} bytes")
        self._buf = np.ones(nbytes // 4, dtype=np.float32)
        self._buf.sum()

    @property
    def nbytes(self) -> int:
        return int(self._buf.nbytes)

    def read_gbs(self) -> float:
        """GB/s (10⁹ bytes) of one read of the buffer."""
        t0 = time.perf_counter()
        self._buf.sum()
        return self.nbytes / max(time.perf_counter() - t0, 1e-9) / 1e9
