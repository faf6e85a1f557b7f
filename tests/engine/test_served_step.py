"""The served-step description: validation, round trip, differences, and the engine config it builds."""

from __future__ import annotations

import pytest

from g4bench.engine.served_step import ServedStep


def test_the_default_is_what_serve_runs():
    step = ServedStep.served()
    assert (step.kv_layout, step.sliding_kv, step.policy) == ("paged", "ring", "mixed")
    ecfg = step.engine_config(max_slots=3, max_len=256)
    assert (ecfg.kv_layout, ecfg.sliding_kv, ecfg.max_batched_tokens, ecfg.policy) == (
        "paged", "ring", step.max_batched_tokens, "mixed")  # fmt: skip


def test_round_trip_and_differences_name_each_field():
    a = ServedStep.served()
    b = a.with_(kv_layout="contiguous", sliding_kv="full", chunk_size=None)
    assert ServedStep.from_dict(b.to_dict()).to_dict() == b.to_dict()
    assert (
        b.policy == "chunk" and b.to_dict()["prefill_policy"] == "chunk"
    )  # contiguous runs one chunk per turn
    assert a.differences(b) == [
        "kv_layout: paged vs contiguous",
        "sliding_kv: ring vs full",
        "prefill_policy: mixed vs chunk",
    ]
    assert a.differences(b, fields_=("kv_dtype",)) == []
    assert "contiguous" in b.describe() and "paged/16" in a.describe()


@pytest.mark.parametrize(
    "bad", [{"kv_layout": "blocks"}, {"prefill_policy": "eager"}, {"max_batched_tokens": 0}]
)
def test_bad_fields_are_named(bad):
    with pytest.raises(ValueError, match=next(iter(bad))):
        ServedStep(**bad)


def test_unknown_fields_in_a_record_are_named():
    with pytest.raises(ValueError, match="warp"):
        ServedStep.from_dict({"warp": 9})
