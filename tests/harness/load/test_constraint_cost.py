"""constraint-cost on the tiny model: both variants run max_tokens tokens per request (with the
budget keeper a constrained reply may close early; its JSON parses), the
rounds interleave the variants, and the mask counters cover the constrained steps."""

from __future__ import annotations

import pytest

pytest.importorskip("g4bench.engine.engine")

from harness.load.constraint_cost import CostSettings, run_constraint_cost  # noqa: E402


@pytest.mark.parametrize(
    "budget", [pytest.param(True, marks=pytest.mark.slow), False], ids=["budget-keeper", "bare-grammar"]
)
def test_constraint_cost_record_on_tiny(budget):
    # the keeper's schema closes in ~30 tokens: 64 of them (slow on a shared CPU)
    tokens = 64 if budget else 8
    s = CostSettings(
        model="tiny-a",
        concurrencies=(1, 2),
        rounds=2,
        max_tokens=tokens,
        prompt_len=16,
        max_len=128,
        budget=budget,
    )
    rec = run_constraint_cost(s)
    assert [lv["concurrency"] for lv in rec["levels"]] == [1, 2]
    for lv in rec["levels"]:
        assert len(lv["rounds"]) == 2
        for r in lv["rounds"]:
            assert sorted(r["order"]) == ["free", "json"]
            assert r["ratio"] == pytest.approx(r["json_tpot_ms"] / r["free_tpot_ms"])
            assert r["mask_fill_ms_per_step"] > 0 and r["mask_wait_ms_per_step"] >= 0
        assert lv["ratio_min"] <= lv["ratio_median"] <= lv["ratio_max"]
