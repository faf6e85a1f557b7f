"""A profile records the step it was fitted on; plan refuses one fitted on another step, naming the difference."""

from __future__ import annotations

import pytest

from g4bench.engine.served_step import ServedStep
from harness.calibrate.main import load_profile, profile_toml
from harness.calibrate.step_record import StepMismatchError, check, config_step, fitted_step, profile_step
from harness.calibrate.steptime import Profile


def _profile(step: dict, engine: str = "g4bench") -> Profile:
    return Profile("cpu-test", engine, {}, {"runs": []}, step)


def test_fitted_step_lists_what_varies_and_old_records_ran_the_chunk_policy():
    engine = {"program": "decode", "kv_dtype": "bf16", "sliding_kv": "ring", "chunk_size": 256}
    reval = {"batch": 1, "ctx": 512, "donate": False, "sliding_kv": "full", "kv_dtype": "int8"}
    assert config_step(engine)["kv_layout"] == "paged" and config_step(reval)["kv_layout"] == "contiguous"
    step = fitted_step([engine, reval])
    assert step["kv_layout"] == ["contiguous", "paged"] and step["prefill_policy"] == "chunk"
    assert step["kv_dtype"] == ["bf16", "int8"]


def test_a_decode_only_sweep_on_the_served_layout_feeds_plan():
    """revalidate's default records (paged, ring) carry no prefill policy: the step they fit is accepted
    for the served step; the reference grid's contiguous records are not."""
    served = {"batch": 4, "ctx": 512, "donate": True, "sliding_kv": "ring", "kv_layout": "paged"}
    step = fitted_step([served])
    assert "prefill_policy" not in step
    check(_profile(step), ServedStep.served())
    with pytest.raises(StepMismatchError, match="kv_layout: paged vs contiguous"):
        check(_profile(fitted_step([{**served, "kv_layout": "contiguous"}])), ServedStep.served())


def test_plan_refuses_a_profile_of_another_step_with_the_difference_and_the_fix():
    prof = _profile({"kv_layout": "contiguous", "sliding_kv": "full", "prefill_policy": "chunk"})
    with pytest.raises(StepMismatchError) as err:
        check(prof, ServedStep.served())
    msg = str(err.value)
    assert "kv_layout: paged vs contiguous" in msg and "prefill_policy: mixed vs chunk" in msg
    assert "g4bench engine-steps" in msg and "g4bench calibrate" in msg
    check(prof, ServedStep.served(kv_layout="contiguous"))  # the step it was fitted on: accepted


def test_the_token_budget_counts_only_between_two_mixed_steps():
    prof = _profile({"kv_layout": "paged", "prefill_policy": "mixed", "max_batched_tokens": 512})
    check(prof, ServedStep.served())
    with pytest.raises(StepMismatchError, match="max_batched_tokens: 1024 vs 512"):
        check(prof, ServedStep.served(max_batched_tokens=1024))


def test_the_step_record_round_trips_through_the_profile_file(tmp_path):
    prof = _profile({"kv_layout": "paged", "prefill_policy": "mixed", "donate": [False, True]})
    path = tmp_path / "p.toml"
    path.write_text(profile_toml(prof, {}))
    assert load_profile(path).step == prof.step
    assert profile_step(load_profile(path))[1] == "its step record"


def test_committed_profiles_without_a_record_read_their_fit_notes():
    step, source = profile_step(load_profile("tpu-v6e"))
    assert step["kv_layout"] == "contiguous" and "reference" in source
    check(load_profile("tpu-v6e"), ServedStep.served())  # another engine's rates: a transfer, not refused
    step, source = profile_step(load_profile("cpu-2core-engine"))  # the simulator's local profile: the served step
    assert (step["kv_layout"], step["prefill_policy"]) == ("paged", "mixed") and source == "its step record"
    check(load_profile("cpu-2core-engine"), ServedStep.served())
