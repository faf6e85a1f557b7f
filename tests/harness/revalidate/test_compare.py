"""Comparisons with power (harness/revalidate/compare.py): CI coverage, the four words, rounds to settle."""

from __future__ import annotations

import numpy as np
import pytest

from harness.revalidate.compare import (
    EQUIVALENT,
    FASTER,
    INCONCLUSIVE,
    SLOWER,
    compare_rounds,
    median_ci,
    rounds_to_settle,
    word_for,
)


def rounds_of(rng, median, rel_sd, rounds=3, k=5, round_sd=0.0):
    """Samples by round: a per-round (per-process) offset plus within-round noise."""
    out = []
    for _ in range(rounds):
        offset = 1.0 + rng.normal(0, round_sd)
        out.append(list(median * offset * (1.0 + rng.normal(0, rel_sd, size=k))))
    return out


def aa_false_positive_rate(*, seed: int, pairs: int, rel_sd: float, k: int, round_sd: float) -> float:
    """Share of identical synthetic pairs (3 rounds each) that compare_rounds calls faster/slower."""
    rng = np.random.default_rng(seed)
    calls = []
    for i in range(pairs):
        a = rounds_of(rng, 100.0, rel_sd, rounds=3, k=k, round_sd=round_sd)
        b = rounds_of(rng, 100.0, rel_sd, rounds=3, k=k, round_sd=round_sd)
        calls.append(compare_rounds(a, b, seed=i, n_boot=1000).word in (FASTER, SLOWER))
    return sum(calls) / len(calls)


def test_words_follow_the_rule():
    assert word_for(1.30, 1.20, 1.40, 0.02) == FASTER
    assert word_for(0.70, 0.60, 0.80, 0.02) == SLOWER
    assert word_for(1.005, 0.99, 1.015, 0.02) == EQUIVALENT
    assert word_for(1.015, 1.005, 1.025, 0.02) == INCONCLUSIVE  # real but below the practical floor
    assert word_for(1.10, 0.95, 1.25, 0.02) == INCONCLUSIVE


def test_a_true_ten_percent_effect_is_seen_through_twenty_percent_sample_noise():
    """The old rule needs |ratio − 1| > 2 × rel IQR (~27% here): it cannot see 10%."""
    rng = np.random.default_rng(1)
    ref = rounds_of(rng, 110.0, 0.05, rounds=3, k=15)
    var = rounds_of(rng, 100.0, 0.05, rounds=3, k=15)
    cmp = compare_rounds(ref, var)
    assert cmp.word == FASTER and cmp.ci_lo > 1.02 and cmp.ratio == pytest.approx(1.1, abs=0.04)


def test_identical_configurations_are_rarely_called_different():
    """A/A on synthetic data with a process-level offset: the false-positive rate stays low."""
    assert aa_false_positive_rate(seed=7, pairs=200, rel_sd=0.08, k=5, round_sd=0.01) <= 0.05


def test_process_to_process_variation_with_few_rounds_is_not_called_an_effect():
    """A/A where each process (round) is off by ~3% and 3 rounds hold 10 samples each: the plain
    bootstrap over 3 clusters called ~7% of these pairs different; the widened CI keeps it ≤ 5%."""
    assert aa_false_positive_rate(seed=11, pairs=300, rel_sd=0.06, k=10, round_sd=0.03) <= 0.05


def test_ci_brackets_and_shrinks_with_more_rounds():
    rng = np.random.default_rng(3)
    few = rounds_of(rng, 50.0, 0.1, rounds=2, k=5)
    many = rounds_of(rng, 50.0, 0.1, rounds=32, k=5)
    lo, hi = median_ci(few)
    assert lo <= np.median(np.concatenate(few)) <= hi
    lo2, hi2 = median_ci(many)
    assert hi2 - lo2 < hi - lo


def test_paired_rounds_cancel_common_drift():
    """Both configurations slow down together in round 2 (host drift): the paired CI stays tight."""
    base = [[100.0, 101.0, 99.0], [150.0, 151.0, 149.0], [100.0, 100.5, 99.5]]
    faster = [[t / 1.2 for t in r] for r in base]
    cmp = compare_rounds(base, faster)
    assert cmp.word == FASTER and cmp.ci_lo > 1.15


def test_rounds_to_settle_and_bad_input():
    more = rounds_to_settle(1.10, 0.95, 1.27, 0.02, rounds=3)
    assert more is not None and more >= 3
    assert rounds_to_settle(1.0199, 0.9, 1.15, 0.02, rounds=3) >= 50  # at the floor: hardly decidable
    with pytest.raises(ValueError, match="paired"):
        compare_rounds([[1.0]], [[1.0], [2.0]])
    with pytest.raises(ValueError, match="at least one sample"):
        median_ci([[1.0], []])


def test_fitted_table_folds_long_names_and_keeps_every_figure_whole():
    """Verdict and per-configuration tables in an 80-column log: a long configuration name folds
    onto a second line; no figure or verdict is cut to "…" (it once printed "ra…" and "medi…")."""
    import io

    from rich.console import Console

    from harness.tables import fitted_table

    name = "ple-bf16/kv-bf16/copying/paged/b32/ctx8192/with/a/very/long/tail"
    cells = [[name, "1.807", "1.169–2.036", "noise", "inconclusive (+100r)"]] * 3
    out = io.StringIO()
    Console(file=out, width=80).print(fitted_table("t", ["comparison", "ratio", "95% CI", "2×IQR", "verdict"], cells))
    text = out.getvalue()
    assert "…" not in text and all(len(line) <= 80 for line in text.splitlines())
    assert text.count("inconclusive (+100r)") == 3 and text.count("1.169–2.036") == 3
    assert "".join(line.split()[0] for line in text.splitlines()[4:6]).startswith(name[:40])


def interleaved_pair(rng, ratio, *, rounds=3, k=8, round_sd=0.08, pass_sd=0.15, own_sd=0.02):
    """Two configurations stepped in turn in one process per round: a per-process speed and a
    per-pass slowdown common to both sides, plus a little noise of each side's own."""
    ref, var = [], []
    for _ in range(rounds):
        common = (1.0 + rng.normal(0, round_sd)) * (1.0 + np.abs(rng.normal(0, pass_sd, size=k)))
        ref.append(list(100.0 * ratio * common * (1.0 + rng.normal(0, own_sd, size=k))))
        var.append(list(100.0 * common * (1.0 + rng.normal(0, own_sd, size=k))))
    return ref, var


def test_pass_pairing_narrows_the_ci_of_an_interleaved_pair():
    """Slow passes hit both sides of an interleaved pair; pairing samples keeps that out of the CI."""
    ref, var = interleaved_pair(np.random.default_rng(3), 1.10)
    apart = compare_rounds(ref, var)
    paired = compare_rounds(ref, var, paired_samples=True)
    assert paired.ratio == apart.ratio
    assert paired.ci_hi / paired.ci_lo - 1 < (apart.ci_hi / apart.ci_lo - 1) / 2
    assert paired.word == FASTER and paired.ci_lo > 1.02
    # unequal counts cannot be paired: the sides are resampled apart
    assert compare_rounds(ref, [v[:-1] for v in var], paired_samples=True).ci_lo != paired.ci_lo


def test_pass_pairing_keeps_identical_pairs_rarely_called_different():
    rng = np.random.default_rng(11)
    calls = []
    for i in range(200):
        ref, var = interleaved_pair(rng, 1.0)
        calls.append(compare_rounds(ref, var, seed=i, n_boot=1000, paired_samples=True).word in (FASTER, SLOWER))
    assert sum(calls) / len(calls) <= 0.05
