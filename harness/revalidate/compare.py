"""Comparisons with power: ratio of medians, a hierarchical bootstrap 95% CI, and one of four words.

Why: the reference article's rule (real only if |ratio − 1| > 2 × the larger relative IQR) was built
for a TPU whose samples spread 0.3–1.3%. On a shared CPU the IQR is 5–70%, so that rule calls even a
1.4× effect noise. The noise that matters is the uncertainty of the *median*, not the spread of the
samples, and a design that measures every configuration in interleaved rounds (harness/revalidate/rounds.py)
lets us estimate it honestly.

Data: for each configuration, samples grouped by round (one fresh process per round). A bootstrap
replicate draws R rounds with replacement — the *same* round indices for both sides of a
comparison, since both were measured in each round (paired: drift common to a round cancels) —
then, inside each drawn round, that configuration's samples with replacement; the replicate's
statistic is the median of the pooled draw. So the CI carries both the within-process noise and
the process-to-process (round-to-round) variation.

Few rounds: a bootstrap over R clusters sees their spread with the plug-in variance, which is
(R − 1)/R of the unbiased one, so with R = 3 the interval is too narrow exactly when process-to-process
variation dominates. Both intervals are therefore widened about the point estimate by √(R / (R − 1))
on the log scale (`_widen`). In A/A simulations at 3 rounds × 10 samples that takes the identical
pairs called different from 7% to 4% with 3% process-to-process offsets, and from 13% to 8% with 6%
ones: there only more rounds help, and `rounds_to_settle` says how many.

Pairs measured in one process (revalidate's shared-weights visits) are paired sample by sample as
well (`paired_samples`): the replicate draws the same sample indices on both sides.

Words, for ``ratio = median(reference) / median(variant)`` (> 1: the variant is faster), with a
practical floor f (default 2%):

    faster        CI lower bound > 1  and ratio > 1 + f
    slower        CI upper bound < 1  and ratio < 1 − f
    equivalent    CI inside [1 − f, 1 + f]
    inconclusive  anything else; `rounds_to_settle` estimates the rounds that would decide it
                  (the CI half-width shrinks as 1/√rounds)
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

FASTER, SLOWER, EQUIVALENT, INCONCLUSIVE = "faster", "slower", "equivalent", "inconclusive"
DEFAULT_FLOOR = 0.02
N_BOOT = 4000
MAX_ROUNDS_SHOWN = 99

Rounds = Sequence[Sequence[float]]  # samples of one configuration, one inner list per round


def _padded(rounds: Rounds) -> tuple[np.ndarray, np.ndarray]:
    """[R, kmax] float array (NaN-padded) and the per-round counts; rejects empty rounds."""
    counts = np.array([len(r) for r in rounds], dtype=np.int64)
    if counts.size == 0 or counts.min() < 1:
        raise ValueError("every round needs at least one sample")
    out = np.full((len(rounds), int(counts.max())), np.nan)
    for i, r in enumerate(rounds):
        arr = np.asarray(r, dtype=np.float64)
        if not np.all(np.isfinite(arr)):
            raise ValueError("samples contain NaN or inf")
        out[i, : arr.size] = arr
    return out, counts


def _draw_medians(rounds: Rounds, round_idx: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Median of each replicate: for replicate b, rounds round_idx[b] each resampled within."""
    values, counts = _padded(rounds)
    n_boot, n_rounds = round_idx.shape
    kmax = values.shape[1]
    k = counts[round_idx]  # [n_boot, R]: size of each drawn round
    u = rng.random((n_boot, n_rounds, kmax))
    pick = np.minimum((u * k[..., None]).astype(np.int64), k[..., None] - 1)
    drawn = values[round_idx[..., None], pick]  # [n_boot, R, kmax]
    drawn = np.where(np.arange(kmax)[None, None, :] < k[..., None], drawn, np.nan)
    return np.nanmedian(drawn.reshape(n_boot, -1), axis=1)


def _round_draws(n_rounds: int, n_boot: int, rng: np.random.Generator) -> np.ndarray:
    if n_rounds == 1:
        return np.zeros((n_boot, 1), dtype=np.int64)
    return rng.integers(0, n_rounds, size=(n_boot, n_rounds))


def pooled_median(rounds: Rounds) -> float:
    return float(np.median(np.concatenate([np.asarray(r, dtype=np.float64) for r in rounds])))


def _widen(center: float, lo: float, hi: float, rounds: int) -> tuple[float, float]:
    """(lo, hi) stretched about `center` by √(R / (R − 1)) on the log scale (module docstring)."""
    if rounds < 2 or min(center, lo, hi) <= 0:
        return lo, hi
    f = math.sqrt(rounds / (rounds - 1))
    c = math.log(center)
    return math.exp(c + (math.log(lo) - c) * f), math.exp(c + (math.log(hi) - c) * f)


def median_ci(rounds: Rounds, *, seed: int = 0, n_boot: int = N_BOOT) -> tuple[float, float]:
    """Hierarchical-bootstrap 95% CI of one configuration's median (widened for few rounds)."""
    rng = np.random.default_rng(seed)
    meds = _draw_medians(rounds, _round_draws(len(rounds), n_boot, rng), rng)
    lo, hi = np.quantile(meds, [0.025, 0.975])
    return _widen(pooled_median(rounds), float(lo), float(hi), len(rounds))


@dataclass(frozen=True)
class Comparison:
    """ratio = median(reference) / median(variant), its CI, and the word."""

    ratio: float
    ci_lo: float
    ci_hi: float
    word: str
    floor: float
    rounds: int
    rounds_to_settle: int | None  # more rounds likely to settle an inconclusive one (None otherwise)


def word_for(ratio: float, lo: float, hi: float, floor: float) -> str:
    """The four-word rule (module docstring)."""
    if lo > 1.0 and ratio > 1.0 + floor:
        return FASTER
    if hi < 1.0 and ratio < 1.0 - floor:
        return SLOWER
    if lo >= 1.0 - floor and hi <= 1.0 + floor:
        return EQUIVALENT
    return INCONCLUSIVE


def rounds_to_settle(ratio: float, lo: float, hi: float, floor: float, rounds: int) -> int | None:
    """More rounds that would likely turn an inconclusive CI into a word (1/√rounds scaling).

    Beyond the floor, the CI must shrink until it excludes 1; inside it, until it fits within
    ±floor. None when the effect sits on the floor itself (no number of rounds decides it)."""
    half = (math.log(hi) - math.log(lo)) / 2.0
    effect = abs(math.log(ratio))
    room = effect if effect > math.log1p(floor) else math.log1p(floor) - effect
    if room <= 1e-9 or half <= 0:
        return None
    needed = math.ceil(rounds * (half / room) ** 2)
    return min(max(1, needed - rounds), MAX_ROUNDS_SHOWN + 1)


def compare_rounds(
    reference: Rounds,
    variant: Rounds,
    *,
    floor: float = DEFAULT_FLOOR,
    seed: int = 0,
    n_boot: int = N_BOOT,
    paired_samples: bool = False,
) -> Comparison:
    """Paired hierarchical bootstrap of median(reference) / median(variant) (both measured in the same
    rounds, in the same order of rounds).

    `paired_samples`: sample i of a round was taken next to sample i of the other side (one process
    stepping both in turn, harness/timing.py's interleaving), so a replicate draws the *same* sample
    indices on both sides and a slow moment common to both stays paired. Needs equal counts per
    round; otherwise the sides are resampled apart."""
    if len(reference) != len(variant):
        raise ValueError(f"paired rounds differ in number: {len(reference)} vs {len(variant)}")
    if floor < 0:
        raise ValueError(f"floor must be >= 0, got {floor}")
    rng = np.random.default_rng(seed)
    idx = _round_draws(len(reference), n_boot, rng)
    same_counts = [len(r) for r in reference] == [len(v) for v in variant]
    if paired_samples and same_counts:
        state = rng.bit_generator.state  # the same uniform draws pick the same indices on both sides
        ref_meds = _draw_medians(reference, idx, rng)
        rng.bit_generator.state = state
        ratios = ref_meds / _draw_medians(variant, idx, rng)
    else:
        ratios = _draw_medians(reference, idx, rng) / _draw_medians(variant, idx, rng)
    lo, hi = (float(x) for x in np.quantile(ratios, [0.025, 0.975]))
    ratio = pooled_median(reference) / pooled_median(variant)
    lo, hi = _widen(ratio, lo, hi, len(reference))
    word = word_for(ratio, lo, hi, floor)
    more = rounds_to_settle(ratio, lo, hi, floor, len(reference)) if word == INCONCLUSIVE else None
    return Comparison(ratio, lo, hi, word, floor, len(reference), more)
