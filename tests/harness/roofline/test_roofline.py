"""`g4bench roofline` pieces: the 15% slope rule, the calibration choice, records against the schema."""

from __future__ import annotations

import pytest

from harness.env import host_env
from harness.isolate import run_isolated
from harness.results import validate_record
from harness.roofline.main import (
    RooflineError,
    RooflineRequest,
    RooflineSettings,
    breakdown_record,
    calibration_record,
    kv_slope,
    pick_calibration,
    resolve_settings,
    slope_records,
    step_record,
)
from harness.roofline.report import limiting_note

BASE_ENV = {**host_env({"t": 1}, git_rev="abc"), "platform": "cpu", "device_kind": "cpu", "device_count": 1}
DEVICE = {"platform": "cpu", "device_kind": "cpu", "device_count": 1}


def _line(kv_gb: float) -> float:
    """Step ms on an exact line: 50 ms fixed + KV at 40 GB/s."""
    return 50.0 + kv_gb / 40.0 * 1e3


def test_slope_uses_only_rises_above_15_percent():
    pts = [(1024, 1e9, 96.0), (2048, 2e9, _line(2)), (4096, 4e9, _line(4)), (8192, 8e9, _line(8))]
    fit = kv_slope(pts)
    # 1024 → 2048 rises 4%: excluded (its naive slope would read a bogus 250 GB/s)
    assert [p["used"] for p in fit["pairs"]] == [False, True, True]
    assert fit["pairs"][0]["gb_per_s"] is None
    assert fit["marginal_kv_gb_per_s"] == pytest.approx(40.0)
    assert fit["intercept_ms"] == pytest.approx(50.0)


def test_slope_boundary_is_strict():
    fit = kv_slope([(1, 1e9, 100.0), (2, 2e9, 115.0)])
    assert not fit["pairs"][0]["used"]
    assert fit["marginal_kv_gb_per_s"] is None and "15%" in fit["slope_note"]


def test_slope_without_pairs_says_why():
    assert "two contexts" in kv_slope([(1, 1e9, 100.0)])["slope_note"]


def test_calibration_picks_the_best_kernel():
    kernels = [
        {
            "kernel": "sum",
            "buffer_bytes": 1 << 29,
            "gb_per_s_median": 29.5,
            "gb_per_s_best": 31.0,
            "rel_iqr_pct": 1,
        },
        {
            "kernel": "max",
            "buffer_bytes": 1 << 29,
            "gb_per_s_median": 21.8,
            "gb_per_s_best": 40.0,
            "rel_iqr_pct": 1,
        },
        {
            "kernel": "matvec",
            "buffer_bytes": 1 << 28,
            "gb_per_s_median": 37.6,
            "gb_per_s_best": 38.0,
            "rel_iqr_pct": 1,
        },
        {
            "kernel": "copy",
            "buffer_bytes": 1 << 29,
            "gb_per_s_median": 53.0,
            "gb_per_s_best": 54.0,
            "rel_iqr_pct": 1,
        },
    ]
    # best median of the reductions, not the best single call, and not the read+write copy
    assert pick_calibration(kernels)["kernel"] == "matvec"
    rec = calibration_record(
        {
            "kernels": kernels,
            "device_memory_bytes": 1 << 34,
            "fractions": [0.01],
            "reps": 3,
            "device": DEVICE,
        },
        "run",
        BASE_ENV,
    )
    validate_record(rec)
    assert rec["calibrated_gb_per_s"] == 37.6 and rec["calibration_kernel"] == "matvec"
    with pytest.raises(RooflineError):
        pick_calibration([])


def test_calibrate_child_measures_every_kernel():
    from harness.roofline.probes import calibrate_child

    result = calibrate_child({"fractions": [1e-5], "reps": 3})
    assert sorted(k["kernel"] for k in result["kernels"]) == ["copy", "matvec", "max", "sum"]
    assert all(k["gb_per_s_median"] > 0 for k in result["kernels"])
    validate_record(calibration_record(result, "run", BASE_ENV))


def test_settings_defaults_per_platform():
    cpu, note = resolve_settings("cpu", RooflineRequest())
    assert (cpu.layers, cpu.kv_dtype, cpu.batches, cpu.breakdown) == ("f32", "f32", (1,), True)
    assert note and "W4A16" in note
    acc, _ = resolve_settings("gpu", RooflineRequest(ctxs=(8192, 1024)))
    assert (acc.layers, acc.batches, acc.ctxs) == ("w4a16", (32,), (1024, 8192))
    given, note = resolve_settings(
        "cpu", RooflineRequest(layers="bf16", kv_dtype="bf16", batches=(2,), ctxs=(64,), breakdown=False)
    )
    assert note is None and given.layers == "bf16"
    with pytest.raises(RooflineError):
        resolve_settings("cpu", RooflineRequest(batches=(0,)))
    # the default is the served step: paged blocks, ring sliding KV
    assert (given.kv_layout, given.sliding_kv) == ("paged", "ring")
    assert given.case(2, 64)["sliding_kv"] == "ring" and given.step_name(2, 64) == "decode/b2/ctx64/paged/ring"
    reference, _ = resolve_settings("cpu", RooflineRequest(kv_layout="contiguous", batches=(2,), ctxs=(64,)))
    assert "kv_layout" not in reference.case(2, 64) and reference.step_name(2, 64) == "decode/b2/ctx64"
    paged, _ = resolve_settings("cpu", RooflineRequest(kv_layout="paged", sliding_kv="full", batches=(2,), ctxs=(64,)))
    assert paged.case(2, 64)["kv_layout"] == "paged" and paged.step_name(2, 64) == "decode/b2/ctx64/paged"
    with pytest.raises(RooflineError, match="--sliding-kv"):
        resolve_settings("cpu", RooflineRequest(sliding_kv="window"))
    with pytest.raises(RooflineError, match="--kv-layout"):
        resolve_settings("cpu", RooflineRequest(kv_layout="ring"))


TINY = RooflineSettings(
    model="tiny-a",
    layers="f32",
    kv_dtype="f32",
    batches=(1,),
    ctxs=(16,),
    samples=2,
    warmup=1,
    breakdown=False,
)


def test_step_child_record_validates():
    """The real child (tiny-a, a fresh process) → a roofline record the schema accepts and the plot reads."""
    settings = TINY
    payload = {"case": settings.case(1, 16), "samples": 2, "warmup": 1}
    result = run_isolated("harness.roofline.probes:step_child", payload, timeout_s=300)
    assert "failure" not in result, result.get("failure")
    rec = step_record(result, settings, 1, 16, 20.0, "run", BASE_ENV)
    validate_record(rec)
    assert rec["kind"] == "roofline" and rec["name"] == "decode/b1/ctx16"
    assert rec["achieved_gb_per_s"] == pytest.approx(rec["model_bytes"] / rec["step_ms_median"] / 1e6)
    assert rec["fraction_of_calibrated"] == pytest.approx(rec["achieved_gb_per_s"] / 20.0)
    assert rec["xla_bytes_accessed"] is None or rec["xla_over_model_bytes"] > 0
    # a second context → a slope record that validates too
    second = {**rec, "ctx": 64, "step_ms_median": rec["step_ms_median"] * 2}
    second["model_bytes_by_part"] = {
        **rec["model_bytes_by_part"],
        "kv_read": rec["model_bytes_by_part"]["kv_read"] * 4,
    }
    (slope,) = slope_records([rec, second], "run", BASE_ENV)
    validate_record(slope)


def test_failure_becomes_a_record():
    settings = TINY
    failed = {"failure": {"kind": "oom", "detail": "x", "stderr_tail": "", "returncode": -9}, "wall_s": 1.0}
    rec = step_record(failed, settings, 1, 16, 20.0, "run", BASE_ENV)
    validate_record(rec)
    assert rec["failure"]["kind"] == "oom"


def test_breakdown_attributes_the_step():
    step = {
        "name": "decode/b1/ctx8",
        "config": {"batch": 1, "ctx": 8},
        "step_ms_median": 100.0,
        "fraction_of_calibrated": 0.3,
    }
    parts = [
        {"part": "lm_head", "count": 1, "ms_each": 40.0, "bytes_each": int(4e8)},
        {"part": "linears: shared sliding layer", "count": 2, "ms_each": 10.0, "bytes_each": int(3e8)},
    ]
    rec = breakdown_record({"parts": parts, "device": DEVICE}, step, 30.0, "run", BASE_ENV)
    validate_record(rec)
    assert rec["rest_ms"] == pytest.approx(40.0)
    assert rec["parts"][0]["gb_per_s"] == pytest.approx(10.0)
    note = limiting_note(step, rec)
    assert "lm_head 40 ms at 10.0 GB/s" in note and "0.30" in note
