"""The simulated burst-prefill check on hand-checkable prices: the burst's calls follow from the token
budget, the figures are the measured check's, and a shape that cannot be priced is recorded."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
import typer

from harness.sim.burst import SimBurstSettings, main, run_sim_burst

CALL_S, TOKEN_S, DECODE_S = 0.020, 0.0005, 0.010


@dataclass
class LinearPricer:
    """A prefill or mixed call: CALL_S + TOKEN_S per computed token position; a decode call: DECODE_S."""

    basis: dict[str, str] = field(
        default_factory=lambda: {"mixed": "test", "prefill": "test", "decode": "test"}
    )

    def __call__(self, call) -> float:
        if call.program in ("mixed", "prefill"):
            return CALL_S + TOKEN_S * call.batched_tokens
        return DECODE_S


@dataclass
class FakeTarget:
    id: str = "test"
    refuse: str | None = None  # a policy this target cannot price
    assumptions: list[str] = field(default_factory=lambda: ["test prices"])

    def pricer_for(self, shape):
        if shape.prefill_policy == self.refuse:
            raise ValueError(f"no prices for the {shape.prefill_policy} policy")
        return LinearPricer()


SETTINGS = SimBurstSettings(model="small", policies=("mixed", "chunk"), stream_tokens=200)


@pytest.fixture(scope="module")
def result():
    return run_sim_burst(SETTINGS, FakeTarget(), log=lambda line: None)


def test_mixed_burst_takes_the_calls_its_budget_needs(result):
    """8 prompts of 200 tokens are 56 rows of 32; 512 tokens less 2 decode rows leave 15 rows a call:
    4 mixed calls, each carrying the streams' decode rows; the one decode call is the one already
    running when the burst is sent (a send reaches the scheduler at the next call boundary)."""
    f = result["budgets"]["512"]["mixed"]
    assert f["burst_calls"]["mixed"]["calls"] == 4
    assert f["burst_calls"]["decode"]["calls"] == 1
    assert len(f["burst_ttft_ms"]) == 8
    # the streams' median gap is a decode call; their largest gap in the burst a 16-row mixed call
    mixed_16 = CALL_S + TOKEN_S * (16 * 32 + SETTINGS.max_slots)
    assert f["stream_median_gap_ms"] == pytest.approx(1e3 * DECODE_S)
    assert f["stream_max_gap_during_burst_ms"] == pytest.approx(1e3 * mixed_16)
    assert f["max_gap_over_median"] == pytest.approx(mixed_16 / DECODE_S)


def test_lone_prompt_is_one_call_and_the_ratio_is_the_measured_definition(result):
    f = result["budgets"]["512"]["mixed"]
    lone_call = CALL_S + TOKEN_S * (8 * 32 + SETTINGS.max_slots)  # 7 rows → the 8-row bucket
    assert f["lone_ttft_ms"] == pytest.approx(1e3 * lone_call)
    assert f["last_over_lone"] == pytest.approx(f["burst_ttft_ms"][-1] / f["lone_ttft_ms"])


def test_chunk_policy_prefills_one_prompt_a_turn_and_trails_the_mixed_step(result):
    chunk, mixed = result["budgets"]["512"]["chunk"], result["budgets"]["512"]["mixed"]
    assert chunk["burst_calls"]["prefill"]["calls"] == 8
    assert chunk["burst_calls"]["decode"]["calls"] >= 7  # a decode call between the prompts' chunks
    assert chunk["last_over_lone"] > mixed["last_over_lone"]


def test_a_shape_that_cannot_be_priced_is_recorded_and_the_rest_still_run():
    out = run_sim_burst(SimBurstSettings(model="small", policies=("chunk", "mixed"), budgets=(256, 512),
                                         stream_tokens=200), FakeTarget(refuse="chunk"), log=lambda line: None)  # fmt: skip
    for budget in ("256", "512"):
        assert "no prices for the chunk policy" in out["budgets"][budget]["chunk"]["failure"]
        assert out["budgets"][budget]["mixed"]["burst_calls"]["mixed"]["calls"] >= 4
    # a smaller budget: more, shorter calls (the stall shrinks, the 8th first token comes later)
    small, large = out["budgets"]["256"]["mixed"], out["budgets"]["512"]["mixed"]
    assert small["burst_calls"]["mixed"]["calls"] > large["burst_calls"]["mixed"]["calls"]
    assert small["max_gap_over_median"] < large["max_gap_over_median"]
    assert small["burst_ttft_ms"][-1] > large["burst_ttft_ms"][-1]


def test_streams_that_end_before_the_burst_are_a_clear_failure():
    out = run_sim_burst(
        SimBurstSettings(model="small", stream_tokens=40), FakeTarget(), log=lambda line: None
    )
    assert "raise --stream-tokens" in out["budgets"]["512"]["mixed"]["failure"]


def test_cli_rejects_a_bad_budget_list():
    with pytest.raises(typer.BadParameter, match="max-batched-tokens"):
        main(target="local", budgets="512,lots")
