"""The simulated prefix-sharing check on hand prices: the shared prompt is computed once, and agents
released together wait for the one that computes it."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from harness.sim.prefix_share import prefix_share_ratios, ratio_line


@dataclass
class LinearPricer:
    basis: dict[str, str] = field(default_factory=dict)

    def __call__(self, call) -> float:
        if call.program in ("mixed", "prefill"):
            return 0.020 + 0.0005 * call.batched_tokens
        return 0.010


@dataclass
class FakeTarget:
    id: str = "test"
    model: str = "small"
    assumptions: list[str] = field(default_factory=list)

    def pricer_for(self, shape):
        return LinearPricer()


@pytest.fixture(scope="module")
def rows():
    return prefix_share_ratios(FakeTarget(), concurrencies=(1, 4), agents=8, prefix_len=512, input_len=64,
                               output_len=4, max_len=2048)  # fmt: skip


def test_rows_per_arrival_and_the_prefix_counted_once(rows):
    assert [(r["conc"], r["arrival"]) for r in rows] == [
        (c, a) for c in (1, 4) for a in ("after the lead", "released together")
    ]
    for r in rows:
        assert 1.0 <= r["computed_over_new"] < 1.1
        assert r["over_cold"][0] == pytest.approx(r["ttft_ms"][0] / r["cold_ttft_ms"][0])
        assert r["over_cold"][1] == pytest.approx(r["ttft_ms"][1] / r["cold_ttft_ms"][1])
        assert "÷ cold" in ratio_line(r)


def test_agents_released_together_wait_for_the_first_ones_prefix(rows):
    together = rows[3]
    assert together["ttft_ms"][1] >= together["first_agent_ttft_ms"]  # they wait for its blocks
    assert together["over_cold"][1] > 2


def test_after_the_lead_one_agent_at_a_time_costs_a_cold_prompt(rows):
    """The prefix cached, an agent computes only its 64 new tokens: the same call as a cold 64-token
    prompt under prices blind to the KV length."""
    after = rows[0]
    assert after["over_cold"] == pytest.approx([1.0, 1.0])
    assert after["first_agent_ttft_ms"] > 3 * after["ttft_ms"][0]
