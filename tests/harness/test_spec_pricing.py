"""`plan --spec-k`: the speculative pricing arithmetic and the command on the v6e profile.

Checks: E[tokens/round] at the limits; the break-even α solves E(α) = round ÷ decode; a verify
step's cost is a decode step's weights with (k+1)× the FLOPs and the KV read once; a drafter step
is far cheaper than a target step; `plan --target tpu-v6e --spec-k 3 --accept-rate 0.7` prints a
row per batch and writes speculative.json whose figures are self-consistent.
"""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from g4bench.model import costs
from g4bench.model.config import load_config
from g4bench.model.drafter import load_drafter_config
from g4bench.model.kv_cache import CacheLayout
from g4bench.model.params import WeightFormat
from harness.sim.speculative import break_even, draft_cost, expected_tokens, verify_cost

FMT = WeightFormat(layers="w4a16", ple="bf16", embed="bf16")
LAYOUT = CacheLayout(max_len=8448, kv_dtype="bf16", ring=True)


def test_expected_tokens_limits():
    assert expected_tokens(0.0, 3) == 1.0
    assert expected_tokens(1.0, 3) == 4.0
    assert expected_tokens(0.5, 2) == pytest.approx(1.75)
    with pytest.raises(ValueError, match="acceptance rate"):
        expected_tokens(1.5, 3)


@pytest.mark.parametrize("ratio", [1.3, 2.0, 3.5])
def test_break_even_solves_the_round_cost(ratio):
    a = break_even(ratio, 3)
    assert a is not None and expected_tokens(a, 3) == pytest.approx(ratio, rel=1e-6)


def test_break_even_never_when_a_round_costs_more_than_k_plus_1_steps():
    assert break_even(4.01, 3) is None
    assert break_even(0.9, 3) == 0.0


def test_verify_cost_scales_queries_not_weights():
    cfg = load_config("e2b")
    dec = costs.decode_cost(cfg, FMT, LAYOUT, 8, 8192)
    ver = verify_cost(cfg, FMT, LAYOUT, 8, 3, 8192)
    assert ver.bytes_by_part["weights"] == dec.bytes_by_part["weights"]
    assert ver.bytes_by_part["kv_read"] == dec.bytes_by_part["kv_read"]
    assert ver.flops == pytest.approx(4 * dec.flops)
    assert ver.bytes_by_part["logits"] == 4 * dec.bytes_by_part["logits"]


def test_draft_step_is_cheap_beside_a_target_step():
    cfg = load_config("e2b")
    d = draft_cost(load_drafter_config("e2b-assistant"), cfg, FMT, LAYOUT, 8, 8192)
    t = costs.decode_cost(cfg, FMT, LAYOUT, 8, 8192)
    assert d.bytes < 0.2 * t.bytes and d.flops < 0.2 * t.flops


def test_plan_spec_k_on_v6e(tmp_path):
    from g4bench.cli import app

    out = tmp_path / "plan"
    res = CliRunner().invoke(
        app, ["plan", "--target", "tpu-v6e", "--spec-k", "3", "--accept-rate", "0.7", "--out", str(out)]
    )
    assert res.exit_code == 0, res.output
    doc = json.loads((out / "speculative.json").read_text())
    assert [r["batch"] for r in doc["rows"]] == [1, 4, 8, 32]
    for r in doc["rows"]:
        assert r["round_ms"] == pytest.approx(3 * r["draft_ms"] + r["verify_ms"])
        assert r["spec_tpot_ms"] == pytest.approx(r["round_ms"] / expected_tokens(0.7, 3))
        assert r["verify_ms"] > r["decode_ms"]  # k+1 queries are never free
        if r["break_even_accept"] is not None:
            assert (r["speedup"] > 1) == (r["break_even_accept"] < 0.7)
    assert "break-even" in res.output


def test_plan_spec_k_rejects_bad_acceptance(tmp_path):
    from g4bench.cli import app

    res = CliRunner().invoke(app, ["plan", "--target", "tpu-v6e", "--spec-k", "3", "--accept-rate", "1.4",
                                   "--out", str(tmp_path / "p")])  # fmt: skip
    assert res.exit_code == 2
    assert "acceptance rate" in res.output
