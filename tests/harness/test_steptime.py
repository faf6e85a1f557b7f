"""The step-time model and the committed TPU v6e profile (pure numerics from committed tables)."""

from __future__ import annotations

import numpy as np
import pytest

from harness.calibrate import fit_model, load_profile, point_rows, profile_toml, reference_points
from harness.steptime import COEFFS, Profile, smax


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
