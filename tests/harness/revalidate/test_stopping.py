"""The stopping rule of a budgeted revalidate run (harness/revalidate/stopping.py), on scripted records:
it stops when settled, continues when not, says why, and respects the round cap and the budget."""

from __future__ import annotations

import pytest

from harness.revalidate.stopping import StopRule, cap_reason, comparison_state, settled_reason


def _ratio(ratio: float, lo: float, hi: float, verdict: str, floor_pct: float = 2.0) -> dict:
    return {
        "kind": "ratio",
        "ratio": ratio,
        "ci95_lo": lo,
        "ci95_hi": hi,
        "verdict": verdict,
        "floor_pct": floor_pct,
    }


def _meas(half_pct: float) -> dict:
    return {"kind": "revalidate", "name": "c", "step_ci95_half_width_pct": half_pct}


RULE = StopRule()


def test_a_clear_effect_is_decided_one_just_past_one_is_not():
    assert comparison_state(_ratio(2.0, 1.8, 2.2, "faster"), RULE) == "decided"
    # faster at 95%, but the CI twice as wide reaches below 1: not settled yet (peeking needs the margin)
    assert comparison_state(_ratio(1.10, 1.01, 1.20, "faster"), RULE) is None
    assert comparison_state(_ratio(0.5, 0.45, 0.55, "slower"), RULE) == "decided"
    assert comparison_state(_ratio(1.0, 0.995, 1.005, "equivalent"), RULE) == "decided"
    assert comparison_state(_ratio(1.0, 0.985, 1.015, "equivalent"), RULE) == "precise"  # ±1.5% ≤ ±2%
    assert comparison_state(_ratio(1.02, 0.95, 1.09, "inconclusive"), RULE) is None


def test_an_effect_on_the_floor_stops_once_precise():
    assert comparison_state(_ratio(1.02, 1.005, 1.035, "inconclusive"), RULE) == "precise"


def test_stops_only_when_every_comparison_is_settled_and_from_the_minimum_round():
    meas = [_meas(5.0), _meas(5.0)]
    settled = [_ratio(2.0, 1.8, 2.2, "faster"), _ratio(1.0, 0.995, 1.005, "equivalent")]
    assert settled_reason(meas, settled, 5, RULE) is None  # before round 6: never
    reason = settled_reason(meas, settled, 6, RULE)
    assert reason is not None and "every comparison settled after 6 rounds: 2 of 2 decided" in reason
    unsettled = [*settled, _ratio(1.05, 0.97, 1.14, "inconclusive")]
    assert settled_reason(meas, unsettled, 40, RULE) is None


def test_one_configuration_stops_at_the_precision_target():
    assert settled_reason([_meas(3.5)], [], 10, RULE) is None
    reason = settled_reason([_meas(1.8)], [], 10, RULE)
    assert reason is not None and "precision target met after 10 rounds" in reason and "±1.80%" in reason
    assert settled_reason([], [], 10, RULE) is None  # nothing measured: nothing is settled


def test_the_cap_and_the_budget_stop_an_unsettled_run():
    rule = StopRule(max_rounds=8)
    assert cap_reason(7, 70.0, rule, budget_s=600.0) is None
    assert "round cap reached: 8 rounds (--max-rounds 8)" in (cap_reason(8, 80.0, rule, budget_s=600.0) or "")
    # 3 rounds in 240 s: a fourth of the average length would end at 320 s > 300 s
    assert "time budget: 3 rounds took 4.0 min" in (cap_reason(3, 240.0, rule, budget_s=300.0) or "")
    assert cap_reason(3, 210.0, rule, budget_s=300.0) is None  # 280 s: it fits


def test_bad_rules_are_refused():
    with pytest.raises(ValueError, match="margin"):
        StopRule(margin=0.0)
    with pytest.raises(ValueError, match="max_rounds"):
        StopRule(max_rounds=0)
