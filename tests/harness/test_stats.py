"""harness.stats: the reference's IQR rule, the verdict rule, and a reproducible bootstrap."""

from __future__ import annotations

import numpy as np
import pytest

from harness.stats import REAL, WITHIN_NOISE, bootstrap_ci, compare, iqr_bounds, summarize, verdict


def test_iqr_index_rule_n15():
    samples = list(range(15, 0, -1))  # unsorted on purpose: 15..1
    q1, q3 = iqr_bounds(samples)
    # sorted s = 1..15; s[15 // 4] = s[3] = 4; s[45 // 4] = s[11] = 12
    assert (q1, q3) == (4.0, 12.0)


@pytest.mark.parametrize("n,expected", [(1, (5.0, 5.0)), (2, (5.0, 6.0)), (4, (6.0, 8.0)), (8, (7.0, 11.0))])
def test_iqr_small_n(n, expected):
    assert iqr_bounds([5.0 + i for i in range(n)]) == expected


def test_summarize_matches_hand_computation():
    s = summarize([10.0, 11.0, 9.0, 10.5, 30.0])
    # sorted 9, 10, 10.5, 11, 30: median 10.5, q1 = s[1] = 10, q3 = s[3] = 11
    assert s.n == 5
    assert s.median == 10.5
    assert (s.min, s.max) == (9.0, 30.0)
    assert (s.q1, s.q3, s.iqr) == (10.0, 11.0, 1.0)
    assert s.rel_iqr == pytest.approx(1.0 / 10.5)
    assert s.rel_iqr_pct == pytest.approx(100.0 / 10.5)
    assert s.mean == pytest.approx(14.1)


def test_summarize_rejects_bad_input():
    with pytest.raises(ValueError):
        summarize([])
    with pytest.raises(ValueError):
        summarize([1.0, float("nan")])


def test_reference_table_verdicts():
    """The reference revalidation's own rows (seed-engine-notes §4.5) give its verdicts back."""
    # ple-bf16/kv-bf16: nodonate 21.262 ms rel IQR 0.69 %, donate 13.143 ms 0.37 %
    v = verdict(21.262 / 13.143, max(0.69, 0.37) / 100)
    assert v.ratio == pytest.approx(1.618, abs=1e-3)
    assert v.real and v.label == REAL
    # PLE effect under donation: 13.143 (bf16, 0.37 %) vs 13.179 (int8, 1.32 %) → within noise
    v = verdict(13.143 / 13.179, max(0.37, 1.32) / 100)
    assert not v.real and v.label == WITHIN_NOISE


def test_verdict_boundary_is_strict():
    assert not verdict(1.5, 0.25).real  # |0.5| is not > 2·0.25 (exact in binary floating point)
    assert verdict(1.5, 0.2499).real
    assert verdict(0.97, 0.01).real  # slower counts too: the rule is symmetric in |ratio − 1|
    assert verdict(1.5, 0.25).threshold == 0.5


def test_compare_uses_larger_noise():
    a = summarize([10.0] * 7 + [10.5] * 8)  # noisy
    b = summarize([8.0] * 15)  # no spread at all
    v = compare(a, b)
    assert v.ratio == pytest.approx(a.median / 8.0)
    assert v.noise == pytest.approx(a.rel_iqr)


def test_verdict_rejects_nonsense():
    with pytest.raises(ValueError):
        verdict(0.0, 0.01)
    with pytest.raises(ValueError):
        verdict(1.0, -0.1)


def test_bootstrap_ci_reproducible_and_brackets_median():
    rng = np.random.default_rng(1)
    samples = list(10.0 + rng.normal(0, 0.2, size=15))
    lo, hi = bootstrap_ci(samples, seed=3)
    assert (lo, hi) == bootstrap_ci(samples, seed=3)
    assert lo <= float(np.median(samples)) <= hi
    assert hi - lo < 1.0
    mlo, mhi = bootstrap_ci(samples, lambda x: np.mean(x, axis=1), confidence=0.9)
    assert mlo <= float(np.mean(samples)) <= mhi


def test_bootstrap_checks_statistic_shape():
    with pytest.raises(ValueError):
        bootstrap_ci([1.0, 2.0, 3.0], lambda x: np.median(x))
