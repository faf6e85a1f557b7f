"""When a budgeted revalidate run stops adding rounds: every comparison settled, a precision target met,
the round cap, or the time budget — and the sentence saying which.

Why: on the CPU a run adds rounds after its minimum while another fits in the time budget
(harness/revalidate/sweep.py), because each round narrows every CI. But once the answers are in, more
rounds only cost time: a one-configuration tiny run did 79 rounds in 2.5 minutes and went on for the
whole quarter hour. So after every round from `min_rounds` on, the sweep asks `stop_reason`.

Peeking honestly. Stopping the first time a CI excludes 1 would make the false-positive rate grow
with the number of looks (under the null, some look eventually strays). The rule therefore looks
through a stricter lens than the verdict it reports:

- **decided** — the comparison's 95% CI, stretched about its ratio by 1/`margin` on the log scale
  (`margin` 0.5: twice as wide, a z of 3.92 instead of 1.96, about the 99.99% interval), still gives
  the same word (faster / slower / equivalent). Under a normal approximation one look at that level
  errs with probability ~9e-5, so over at most `max_rounds` looks (100 by default) the chance that
  peeking stops on a false word is ≤ 100 × 9e-5 ≈ 0.9% (Bonferroni), on top of the 95% CI's own 5%
  at the round the run ends. The reported verdicts are the ordinary 95% ones (compare.py,
  visit_noise.py), unchanged.
- **precise** — the comparison's CI half-width is at most `target` (±2%, visit_noise's
  TARGET_MEDIAN_HALF_WIDTH) even though its word is *inconclusive* (an effect sitting on the floor:
  no number of rounds decides it, and it is already known to ±2%). A stop on the interval's width
  does not look at where the interval lies, so it leaves the verdict's error rate as at a fixed
  number of rounds ("precision as the goal").
- a run without comparisons (one configuration, or every pair failed): every configuration's median
  CI half-width is at most `target` (again width only).

No stop on CIs before `min_rounds` (6): with fewer visits the round-level bootstrap sees too few
processes, and its small-sample widening (√(R/(R−1))) is still above 10%.

Data flow: sweep.py, after each round r ≥ min_rounds of a budgeted run: write_outcome → measurement and
ratio records → `settled_reason(measurements, ratios, rule)` → a reason (stop, printed and stored as
the summary's ``stop_reason``) or None; then `cap_reason(rounds_done, elapsed_s, rule, budget_s)` for
the round cap and the time budget.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from harness.results import is_failure
from harness.revalidate.compare import EQUIVALENT, FASTER, SLOWER, word_for
from harness.revalidate.visit_noise import TARGET_MEDIAN_HALF_WIDTH

MIN_ROUNDS_TO_STOP = 6
STOP_MARGIN = 0.5
MAX_ROUNDS = 100  # the looks the Bonferroni bound above counts


@dataclass(frozen=True)
class StopRule:
    """The stopping rule's parameters (module docstring)."""

    min_rounds: int = MIN_ROUNDS_TO_STOP
    margin: float = STOP_MARGIN
    target: float = TARGET_MEDIAN_HALF_WIDTH  # relative CI half-width that counts as precise
    max_rounds: int | None = MAX_ROUNDS

    def __post_init__(self) -> None:
        if not 0 < self.margin <= 1:
            raise ValueError(f"margin must be in (0, 1], got {self.margin}")
        if self.target <= 0:
            raise ValueError(f"target must be > 0, got {self.target}")
        if self.max_rounds is not None and self.max_rounds < 1:
            raise ValueError(f"max_rounds must be >= 1, got {self.max_rounds}")


def _stretched(ratio: float, lo: float, hi: float, factor: float) -> tuple[float, float]:
    """(lo, hi) stretched about `ratio` by `factor` on the log scale."""
    c = math.log(ratio)
    return math.exp(c + (math.log(lo) - c) * factor), math.exp(c + (math.log(hi) - c) * factor)


def comparison_state(ratio: dict[str, Any], rule: StopRule) -> str | None:
    """ "decided", "precise" or None (not settled) for one ``kind: "ratio"`` record."""
    r, lo, hi, floor = ratio["ratio"], ratio["ci95_lo"], ratio["ci95_hi"], ratio["floor_pct"] / 100.0
    if min(r, lo, hi) <= 0:
        return None
    word = ratio["verdict"]
    if word in (FASTER, SLOWER, EQUIVALENT):
        wide_lo, wide_hi = _stretched(r, lo, hi, 1.0 / rule.margin)
        if word_for(r, wide_lo, wide_hi, floor) == word:
            return "decided"
    half = (math.log(hi) - math.log(lo)) / 2.0
    return "precise" if half <= math.log1p(rule.target) else None


def settled_reason(
    measurements: Sequence[dict[str, Any]], ratios: Sequence[dict[str, Any]], rounds_done: int, rule: StopRule
) -> str | None:
    """Why the run can stop after `rounds_done` rounds, or None while something is unsettled."""
    if rounds_done < rule.min_rounds:
        return None
    ok = [m for m in measurements if m.get("kind") == "revalidate" and not is_failure(m)]
    if not ok:
        return None
    if ratios:
        states = [comparison_state(r, rule) for r in ratios]
        if any(s is None for s in states):
            return None
        decided = sum(s == "decided" for s in states)
        return (
            f"every comparison settled after {rounds_done} rounds: {decided} of {len(states)} decided with the CI "
            f"{1 / rule.margin:g}× as wide, {len(states) - decided} known to ±{100 * rule.target:g}%"
        )
    widest = max(m["step_ci95_half_width_pct"] for m in ok)
    if widest <= 100.0 * rule.target:
        return (
            f"precision target met after {rounds_done} rounds: every configuration's median to "
            f"±{widest:.2f}% (target ±{100 * rule.target:g}%; no comparison in this selection)"
        )
    return None


def cap_reason(rounds_done: int, elapsed_s: float, rule: StopRule, budget_s: float | None) -> str | None:
    """The round cap or the time budget (another round of the average length would not fit), or None."""
    if rule.max_rounds is not None and rounds_done >= rule.max_rounds:
        return f"round cap reached: {rounds_done} rounds (--max-rounds {rule.max_rounds}), some CIs unsettled"
    if budget_s is not None and elapsed_s * (rounds_done + 1) / rounds_done > budget_s:
        return (
            f"time budget: {rounds_done} rounds took {elapsed_s / 60:.1f} min and another would pass "
            f"{budget_s / 60:g} min, some CIs unsettled"
        )
    return None
