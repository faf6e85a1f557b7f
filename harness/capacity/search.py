"""Find the largest batch that fits: bracket from an estimate, then bisect, one probe at a time.

Why not a doubling ladder: the reference engine's ladders landed every ceiling on a power-of-two
product and invented a "0.0% spread" invariant (seed-engine-notes §3.3). Here the first probe is
the arithmetic estimate (usable memory − weights) ÷ KV bytes per sequence; the bracket widens by
at most 25% a step from there, and bisection narrows it until hi − lo ≤ max(1, tol·lo).

Probes may report bytes: a fitting compile its peak, a rejected TPU compile the bytes it
required, a local run its peak address space. Then the next probe is the linear guess
b + (limit − bytes) ÷ (bytes per sequence) when it falls inside the bracket (the per-sequence
slope comes from the last two probes with bytes, else from the caller's KV arithmetic). A guess
that fails to halve the bracket is followed by a plain midpoint, so the probe count stays
O(log n) whatever the guesses do; good guesses end the search in two or three probes, which
matters when a fitting E2B compile costs ~100 s.

Failure classification (`classify`), decided once for every driver:

- fits: the child reported success (`fits` true);
- does not fit: a compile-time HBM OOM (`fits` false), a failure of kind "oom" (RESOURCE_EXHAUSTED,
  MemoryError, bad_alloc, SIGKILL under the cap), or death by a signal (an allocation that fails
  under RLIMIT_AS inside C++ often surfaces as SIGABRT/SIGSEGV);
- a real error, which stops the search (`ProbeError`, with the child's message): for a compile
  probe any failure of the compiling process (its host memory is not the target's HBM); a Python exception
  that is not about memory (a bug or a bad configuration would otherwise read as "capacity 0"),
  a timeout (a slow step is not a full memory; counting it as "does not fit" would understate the
  ceiling silently — raise --timeout instead), and a child that printed no result.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

GROW = 1.25  # bracket steps: at most ×1.25 up or ×0.8 down from the last probe
MAX_PROBES = 60


class ProbeError(RuntimeError):
    """A probe failed for a reason other than memory; the search cannot continue."""


@dataclass(frozen=True)
class Probe:
    batch: int
    fits: bool
    bytes: int | None = None  # peak (fit) or required (compile OOM) bytes, when known
    result: dict[str, Any] = field(default_factory=dict, repr=False)


@dataclass
class Search:
    """Outcome: `lo` is the largest batch seen to fit (0: not even batch 1), `hi` the smallest seen
    not to (None: never bounded above, i.e. `upper` fit)."""

    lo: int = 0
    hi: int | None = None
    probes: list[Probe] = field(default_factory=list)
    limit: int | None = None

    @property
    def ceiling_probe(self) -> Probe | None:
        return next((p for p in reversed(self.probes) if p.fits and p.batch == self.lo), None)


def classify(result: dict[str, Any], *, compile_only: bool = False) -> bool:
    """True = fits, False = does not fit; raises ProbeError for a real error (module docstring).

    `compile_only`: the probe compiled for a remote target, so only the compiler's verdict
    (`fits`) speaks about the target's memory; any failure of the compiling process (including
    running out of *host* memory) is a real error."""
    fail = result.get("failure")
    if fail is None:
        if "fits" not in result:
            raise ProbeError("probe result has neither 'fits' nor 'failure'")
        return bool(result["fits"])
    kind, rc = fail.get("kind"), fail.get("returncode")
    if compile_only:
        raise ProbeError(
            f"the compiling process failed ({kind}: {fail.get('detail')}); this says nothing about the target's memory"
        )
    if kind == "oom":
        return False
    if kind == "crash" and rc is not None and rc < 0:
        return False
    if kind == "timeout":
        raise ProbeError(
            f"probe timed out ({fail.get('detail')}); a slow step is not a full memory: raise --timeout"
        )
    raise ProbeError(f"probe failed ({kind}): {fail.get('detail')}\n{fail.get('stderr_tail', '')[-1500:]}")


def _slope(probes: list[Probe], per_seq: float | None) -> float | None:
    with_bytes = [p for p in probes if p.bytes is not None]
    for a in reversed(with_bytes):
        for b in reversed(with_bytes):
            if b.batch != a.batch:
                assert a.bytes is not None and b.bytes is not None  # filtered above
                s = (a.bytes - b.bytes) / (a.batch - b.batch)
                if s > 0:
                    return s
    return per_seq


def _guess(probes: list[Probe], limit: int | None, per_seq: float | None) -> int | None:
    """Where the line through the latest probe that reported bytes crosses `limit` (None: no basis)."""
    last = next((p for p in reversed(probes) if p.bytes is not None), None)
    slope = _slope(probes, per_seq)
    if last is None or last.bytes is None or limit is None or not slope:
        return None
    g = last.batch + math.floor((limit - last.bytes) / slope)
    return max(g, last.batch + 1) if last.fits else min(g, last.batch - 1)


def search_ceiling(
    probe: Callable[[int], Probe],
    estimate: int,
    *,
    tol: float = 0.02,
    limit: int | None = None,
    per_seq_bytes: float | None = None,
    upper: int = 1 << 20,
    on_limit: Callable[[Probe], int | None] | None = None,
) -> Search:
    """Largest batch b ≤ `upper` with probe(b).fits, to within max(1, tol·lo).

    `limit`/`per_seq_bytes` enable the linear guess; `on_limit(probe)` may return a better limit
    learned from a probe (the TPU compiler states its own in an OOM message)."""
    s = Search(limit=limit)

    def run(b: int) -> Probe:
        if len(s.probes) >= MAX_PROBES:
            raise ProbeError(f"no convergence after {MAX_PROBES} probes (bracket {s.lo}..{s.hi})")
        p = probe(b)
        s.probes.append(p)
        if on_limit is not None:
            s.limit = on_limit(p) or s.limit
        if p.fits:
            s.lo = max(s.lo, b)
        else:
            s.hi = b if s.hi is None else min(s.hi, b)
        return p

    b = min(max(1, estimate), upper)
    while True:  # bracket
        p = run(b)
        if s.hi is not None and (s.lo or s.hi == 1):
            break
        if s.hi is None and b >= upper:
            return s
        g = _guess(s.probes, s.limit, per_seq_bytes)
        if p.fits:
            step = math.ceil(b * GROW)
            b = min(upper, min(g, step) if g is not None else step)
        else:
            step = max(1, math.floor(b / GROW))
            b = max(step, g) if g is not None and g >= 1 else step
    if s.lo == 0:
        return s
    halved = True
    while s.hi - s.lo > max(1, math.floor(s.lo * tol)):  # bisect
        width = s.hi - s.lo
        g = _guess(s.probes, s.limit, per_seq_bytes)
        # a guess at or past an end of the bracket still says which end the boundary hugs
        b = min(max(g, s.lo + 1), s.hi - 1) if halved and g is not None else (s.lo + s.hi) // 2
        run(b)
        halved = (s.hi - s.lo) * 2 <= width
    return s
