"""The step-time model and the committed TPU v6e profile (pure numerics from committed tables)."""

from __future__ import annotations

import numpy as np
import pytest

from harness.calibrate.main import fit_model, load_profile, point_rows, profile_toml, reference_points
from harness.calibrate.steptime import COEFFS, Profile, smax


def test_smax_limits():
    x, y = np.array([3.0]), np.array([4.0])
    assert smax(x, y, 1.0)[0] == pytest.approx(7.0)
    assert smax(x, y, 2.0)[0] == pytest.approx(5.0)
    assert smax(x, y, 64.0)[0] == pytest.approx(4.0, rel=1e-2)


@pytest.fixture(scope="module")
def v6e():
    pts = reference_points()
    fit = [p for p in pts if p.role == "fit"]
    hold = [p for p in pts if p.role == "holdout"]
    assert (len(fit), len(hold)) == (20, 12)
    return fit, hold, fit_model(fit, hold)


def test_v6e_heldout_error_bounds(v6e):
    """Fixed protocol: fit on revalidate + roofline only, predict ple_run's 12 ceilings unrefitted."""
    _, hold, model = v6e
    rows = point_rows(model, hold)
    errs = np.abs([r["error_pct"] for r in rows])
    assert np.median(errs) <= 3.0, rows
    assert errs.max() <= 6.0, rows
    assert model.validation["holdout_max_abs_pct"] == pytest.approx(errs.max())


def test_v6e_int8_long_context_is_compute_bound(v6e):
    """The physical reading: int8 attention at ctx 8192 is bound by attention FLOPs, bf16 by bytes."""
    fit, _, model = v6e
    c = model.coef
    for p in fit:
        if p.config["ctx"] == 8192 and p.config["donate"]:
            mem = p.feats["kv_gb"] * c["kv_ms_per_gb"]
            comp = p.feats["attention_tflop"] * c["attention_ms_per_tflop"]
            assert (comp > mem) == (p.config["kv_dtype"] == "int8"), p.label


def test_committed_profile_matches_a_refit(v6e):
    _, _, model = v6e
    prof = load_profile("tpu-v6e")
    assert prof is not None
    d = prof.model("decode")
    assert d.overlap_p == model.overlap_p
    for n in COEFFS:
        assert d.coef[n] == pytest.approx(model.coef[n], rel=1e-3, abs=1e-6)
    assert d.error_band_pct == pytest.approx(model.validation["holdout_max_abs_pct"], rel=1e-3)


def test_profile_toml_round_trip(tmp_path, v6e):
    fit, _, model = v6e
    prof = Profile("tpu-v6e", "test", {"decode": model}, {"runs": ["a", "b"], "fit_points": 20})
    path = tmp_path / "p.toml"
    path.write_text(profile_toml(prof, {"decode": point_rows(model, fit[:2])}))
    back = load_profile(path)
    assert back.provenance["runs"] == ["a", "b"]
    assert back.model("decode").coef == pytest.approx(model.coef)
    assert back.model("decode").predict is not None


# ------------------------------------------------------------------ run folders → profile (synthetic steps)
def _write_run(root, name, grid, truth):
    from harness.calibrate.main import Point, with_features
    from harness.calibrate.steptime import COEFFS as NAMES
    from harness.calibrate.steptime import predict_ms
    from harness.env import host_env, merge_device
    from harness.results import append_record, make_record

    run = root / name
    run.mkdir()
    env = merge_device(
        host_env({"n": name}, git_rev="abc"), {"platform": "cpu", "device_kind": "cpu", "device_count": 1}
    )
    rng = np.random.default_rng(len(name))
    for batch, ctx, kv, donate in grid:
        cfg = {"model": "e2b", "layers": "w4a16", "ple": "bf16", "kv_dtype": kv, "donate": donate,
               "sliding_kv": "full", "batch": batch, "ctx": ctx}  # fmt: skip
        p = with_features([Point(cfg, 0.0, "x")])[0]
        ms = predict_ms(
            [truth.coef[n] for n in NAMES], truth.overlap_p, {k: np.array([v]) for k, v in p.feats.items()}
        )
        noisy = float(ms[0]) * (1 + rng.normal(0, 0.01))
        append_record(run, make_record("roofline", f"b{batch}/c{ctx}/{kv}/{donate}", run_id=name, env=env,
                                       config=cfg, step_ms_median=noisy))  # fmt: skip
    return run


def test_calibrate_from_run_folders_with_holdout(tmp_path, v6e):
    """Two fit folders (batch {1, 8, 32} × ctx {1024, 8192}) and one held-out folder (batch {4, 16} ×
    ctx {2048, 4096}), steps drawn from a known model with 1% noise: the fit predicts the held-out
    folder within a few per cent and writes a profile with its provenance."""
    from rich.console import Console

    from harness.calibrate.main import run_calibrate

    _, _, truth = v6e
    fit_a = [(b, c, kv, True) for b in (1, 8, 32) for c in (1024, 8192) for kv in ("bf16", "int8")]
    fit_b = [(b, c, "bf16", False) for b in (1, 8, 32) for c in (1024, 8192)]
    hold = [(b, c, kv, True) for b in (4, 16) for c in (2048, 4096) for kv in ("bf16", "int8")]
    runs = [_write_run(tmp_path, "a", fit_a, truth), _write_run(tmp_path, "b", fit_b, truth)]
    held = _write_run(tmp_path, "h", hold, truth)
    out = tmp_path / "cpu.toml"
    prof, path, rows = run_calibrate(
        runs, [held], reference=False, device=None, out=out, console=Console(quiet=True)
    )
    assert path == out and prof.device == "cpu"
    v = prof.model("decode").validation
    assert (v["n_fit"], v["n_holdout"]) == (18, 8)
    assert v["holdout_median_abs_pct"] < 3.0
    back = load_profile(out)
    assert back.provenance["runs"] == [str(r) for r in runs] and back.provenance["git_rev"] == "abc"
    assert {r["role"] for r in rows} == {"fit", "holdout"}


def test_decode_only_runs_name_the_run_that_adds_prefill_and_mixed(tmp_path, v6e):
    """A profile fitted on revalidate/roofline runs alone has no prefill or mixed model: calibrate says
    so and prints the engine-steps command (batches as slots, the longest context) that adds them."""
    from rich.console import Console

    from harness.calibrate.main import run_calibrate

    _, _, truth = v6e
    run = _write_run(tmp_path, "a", [(b, c, "bf16", True) for b in (1, 4, 8) for c in (512, 1024)], truth)
    console = Console(record=True, width=200)
    prof, _, _ = run_calibrate([run], [], reference=False, device=None, out=tmp_path / "p.toml", console=console)
    assert prof.model("prefill") is None
    text = console.export_text()
    assert "no prefill or mixed points" in text
    assert "g4bench engine-steps --model e2b --kv-dtype bf16 --max-slots 1,4,8 --max-len 1024 --out STEPS_DIR" in text
    assert f"g4bench calibrate {run} STEPS_DIR" in text


def test_v6e_prefill_refits_only_the_attention_rate():
    """The reference's one-shot prefill (three sizes) refits the decode model's attention FLOP rate:
    prefill attention (S query rows) runs faster than decode's (8 rows); the rest is decode's."""
    from harness.calibrate.main import reference_prefill_model

    dec = load_profile("tpu-v6e").model("decode")
    pre, rows = reference_prefill_model(dec)
    assert pre.coef["attention_ms_per_tflop"] < dec.coef["attention_ms_per_tflop"]
    assert {k: v for k, v in pre.coef.items() if k != "attention_ms_per_tflop"} == {
        k: v for k, v in dec.coef.items() if k != "attention_ms_per_tflop"
    }
    assert pre.validation["n_fit"] == len(rows) == 3 and pre.error_band_pct is not None
    assert load_profile("tpu-v6e").model("prefill").coef == pytest.approx(pre.coef)


def test_print_profile_marks_a_rate_the_points_do_not_resolve(v6e):
    """A coefficient whose term stays under 1% of every fit step prints as unresolved, not as a
    speed (a 0.006 ms/GB term read as 165,531 GB/s once); a resolved one prints its rate."""
    from dataclasses import replace

    from rich.console import Console

    from harness.calibrate.main import print_profile

    fit, _, model = v6e
    share = model.validation["term_max_share"]
    assert share["kv_ms_per_gb"] > 0.01  # bf16 KV at ctx 8192 is most of a v6e step
    tiny = replace(model, coef={**model.coef, "linear_ms_per_tflop": 1e-5},
                   validation={**model.validation, "term_max_share": {**share, "linear_ms_per_tflop": 1e-4}})  # fmt: skip
    console = Console(record=True, width=400)
    print_profile(Profile("dev", "g4bench", {"decode": tiny}), [], console)
    text = console.export_text()
    assert "linears not resolved by these points" in text
    assert f"KV + logits stream {1e3 / model.coef['kv_ms_per_gb']:.3g} GB/s" in text


def test_load_profile_reads_every_program_it_was_written_with(tmp_path, v6e):
    """A profile written with decode, prefill and mixed models loads all three (plan once dropped
    [mixed] and priced the served step with the prefill rates)."""
    from harness.calibrate.steptime import PROGRAMS

    _, _, model = v6e
    prof = Profile("dev", "g4bench", {p: model for p in PROGRAMS})
    path = tmp_path / "p.toml"
    path.write_text(profile_toml(prof, {p: [] for p in PROGRAMS}), encoding="utf-8")
    back = load_profile(str(path))
    assert back is not None and set(back.programs) == set(PROGRAMS)
    assert back.model("mixed").coef == pytest.approx(model.coef)
