"""Bisection for the largest load level whose SLO attainment still meets the target.

    result = bisect_max(measure, target=0.9, lo=1, hi=8, integer=True)

`measure(level)` returns the attainment measured (or simulated) at that level, None when nothing
completed (counts as a miss). The search probes `lo`, then `hi`, then midpoints, keeping the
invariant "lo meets the target, hi does not":

- `lo` misses → no level meets it (best None);
- `hi` meets it → best = hi, and the bound, not the server, stopped the search (raise `hi`);
- else bisect: integers until hi − lo = 1 (agents), rates by geometric midpoints until
  hi / lo ≤ 1 + rel_tol, or until `max_probes` probes were spent (best = the last level that met it).

Attainment is assumed to fall as load rises (more agents share one decode batch and one prefill
queue); a measured level that breaks that is still followed, and every probe is kept so the reader
can see it.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Probe:
    level: float
    attainment: float | None
    passed: bool
    detail: dict[str, Any] = field(default_factory=dict)


@dataclass
class SearchResult:
    best: float | None
    reason: str
    probes: list[Probe] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"best": self.best, "reason": self.reason,
                "probes": [{"level": p.level, "attainment": p.attainment, "passed": p.passed} for p in self.probes]}  # fmt: skip


def midpoint(lo: float, hi: float, integer: bool, rel_tol: float) -> float | None:
    """The next level to probe between a passing `lo` and a failing `hi`, or None when resolved."""
    if integer:
        return (int(lo) + int(hi)) // 2 if hi - lo > 1 else None
    return math.sqrt(lo * hi) if hi / lo > 1 + rel_tol else None


def bisect_max(
    measure: Callable[[float], float | None],
    target: float,
    lo: float,
    hi: float,
    *,
    integer: bool,
    rel_tol: float = 0.1,
    max_probes: int = 8,
) -> SearchResult:
    """The largest level in [lo, hi] whose attainment ≥ target (module docstring)."""
    if not 0 < lo <= hi:
        raise ValueError(f"search bounds need 0 < lo ≤ hi, got {lo:g}, {hi:g}")
    res = SearchResult(None, "")

    def probe(level: float) -> bool:
        att = measure(level)
        ok = att is not None and att >= target
        res.probes.append(Probe(level, att, ok))
        return ok

    if not probe(lo):
        res.reason = f"the lower bound {lo:g} already misses the target"
        return res
    if hi == lo or probe(hi):
        res.best, res.reason = hi, f"the upper bound {hi:g} meets the target (raise it to look further)"
        return res
    while (mid := midpoint(lo, hi, integer, rel_tol)) is not None:
        if len(res.probes) >= max_probes:
            res.best, res.reason = lo, f"probe budget ({max_probes}) spent; the answer lies in [{lo:g}, {hi:g})"
            return res
        lo, hi = (mid, hi) if probe(mid) else (lo, mid)
    res.best = lo
    res.reason = f"bisected: {lo:g} meets the target, {hi:g} does not" + (
        "" if integer else f" (within {rel_tol:.0%})"
    )
    return res
