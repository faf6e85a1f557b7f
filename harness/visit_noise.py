"""The host's visit-to-visit noise, pooled over a run's configurations, and the verdicts and power it gives.

Why: in a revalidate run every configuration is measured once per round, each time in a fresh
process. On the 2-core development VM a visit's median step time moves 9–21% (sd) from visit to
visit for reasons that belong to the host, not the configuration (the neighbours' memory traffic,
vCPU placement), and within one visit the samples agree far better. So a comparison is only as
good as its number of *visits*, and with the CPU default of 3 rounds a pair of configurations has 3
paired visits: a bootstrap over 3 clusters cannot see their spread (it called 3 and 4 of 40 A/A
pairs different, results/reference/revalidate-cpu-small-aa40 and -aa40-s15), and an interval honest
for 3 clusters alone (Student t with 2 degrees of freedom) is ±25–35% wide there.

But the visit noise is a property of the host, and every configuration of the run sees it: the
residual spread is about the same for copying and donated steps, bf16 and int8 KV (11.7–14.2% over
every recorded run; results/reference/session15/noise_by_kind.txt). So it is estimated once, from
all of them, as in a randomized complete block design with rounds as blocks::

    y[c, r] = log(median of configuration c's samples in round r)
            = mu[c] + rho[r] + e[c, r]          e ~ N(0, sigma²), the same sigma for every c

    sigma² = sum(residuals²) / ((C − 1)(R − 1))      (the additive fit's residual mean square)

A comparison of configurations a and b (`compare_pooled`):

    d[r]   = y[a, r] − y[b, r]                       (per-round log ratio of medians: drift
                                                      common to a round cancels)
    ratio  = exp(mean d)                             geometric mean over rounds of the ratio of medians
    CI     = exp(mean d ± t(0.975, df) · sigma · sqrt(2 / R)),     df = (C − 1)(R − 1)

With 12 configurations × 3 rounds that is 22 degrees of freedom instead of 2. A configuration's own
median (`median_half_width`) uses the spread of its visits about their mean, pooled the same way
(round effects included: they move an absolute time, not a ratio). The units of the noise are
processes: where configurations share a process per round (``--visit shared-weights``), their
residuals share its speed, so the degrees of freedom count processes, df = (P − 1)(R − 1), and the
residual sum is divided by df · C/P (the process effects span (P − 1)(R − 1) directions of it, each
carrying a process's C/P configurations: an upper bound on the variance a pair from two processes
sees; with one process per configuration it is the usual mean square). Only pairs from different
processes are judged here (a shared pair's own bootstrap pairs its samples).

The words are harness/compare.py's (`word_for`, practical floor). Power (`Power`): the smallest
speedup the run calls *faster* with 80% probability, and the rounds that a 10% effect or a ±2%
median CI would need at this noise — so a run that cannot see the effect it is asked about says so,
and how much longer it would have to run.

Data flow: harness/verdicts.py hands `pooled_noise` the per-visit samples of every configuration
(the samples taken while the host was busy left out, as for the verdicts) and the process groups
of those that shared one; `compare_pooled` judges each pair from different processes; pairs from
one process keep the paired bootstrap (harness/compare.py). harness/revalidate_records.py reads
`Power` into the run summary.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats

from harness.compare import INCONCLUSIVE, MAX_ROUNDS_SHOWN, Comparison, Rounds, word_for

POWER = 0.80  # the probability at which `Power` quotes a detectable effect
CONFIDENCE = 0.95
TARGET_EFFECT = 0.10  # the effect `Power.rounds_for_effect` is quoted for
TARGET_MEDIAN_HALF_WIDTH = 0.02  # the median CI `Power.rounds_for_median` is quoted for
_MAX_ROUNDS_SEARCHED = 10_000


@dataclass(frozen=True)
class PooledNoise:
    """The run's visit-to-visit noise on the log scale, from C configurations × R rounds.

    `sigma`: residual sd of a visit's log median after configuration and round effects (ratios);
    `sigma_within`: sd of a visit's log median about its configuration's mean, round effects
    included (absolute times); `processes`: the processes per round (= configurations unless some
    share one). `visit_logs[name][r]` is y[c, r]."""

    sigma: float
    sigma_within: float
    configurations: int
    rounds: int
    processes: int
    visit_logs: Mapping[str, tuple[float, ...]]

    @property
    def df(self) -> int:
        return _df(self.processes, self.rounds)

    @property
    def df_within(self) -> int:
        return self.processes * (self.rounds - 1)


def _df(processes: int, rounds: int) -> int:
    return (processes - 1) * (rounds - 1)


def _visit_median(samples: Sequence[float]) -> float:
    arr = np.asarray(samples, dtype=np.float64)
    if arr.size == 0 or not np.all(np.isfinite(arr)) or np.any(arr <= 0):
        raise ValueError("every visit needs at least one positive, finite sample")
    return float(np.median(arr))


def pooled_noise(by_config: Mapping[str, Rounds], process_of: Mapping[str, str] | None = None) -> PooledNoise | None:
    """The pooled noise of configurations measured in the same R rounds; `process_of` names the
    process group of the configurations that share one per round (the rest have their own). None
    when there is nothing to pool: fewer than 2 processes or 2 rounds, or configurations with
    different numbers of rounds (a run still in its first round)."""
    counts = {len(r) for r in by_config.values()}
    shared = process_of or {}
    processes = len({shared.get(n, f"own:{n}") for n in by_config})
    if processes < 2 or len(counts) != 1 or counts.pop() < 2:
        return None
    names = list(by_config)
    y = np.log([[_visit_median(v) for v in by_config[n]] for n in names])  # [C, R]
    within = y - y.mean(axis=1, keepdims=True)
    resid = within - y.mean(axis=0, keepdims=True) + y.mean()
    C, R = y.shape
    return PooledNoise(
        sigma=float(math.sqrt((resid**2).sum() / (_df(processes, R) * C / processes))),
        sigma_within=float(math.sqrt((within**2).sum() / (C * (R - 1)))),
        configurations=C,
        rounds=R,
        processes=processes,
        visit_logs={n: tuple(float(x) for x in row) for n, row in zip(names, y, strict=True)},
    )


def _t(df: int) -> float:
    return float(stats.t.ppf(0.5 + CONFIDENCE / 2.0, df))


def _ratio_half_width(sigma: float, processes: int, rounds: int) -> float:
    """Log-scale half-width of a comparison's CI at this noise with `rounds` rounds."""
    return _t(_df(processes, rounds)) * sigma * math.sqrt(2.0 / rounds)


def _settle_rounds(effect: float, sigma: float, processes: int, rounds: int, floor: float) -> int | None:
    """More rounds after which a CI this wide would likely decide: exclude 1 (an effect beyond the
    floor) or fit inside ±floor (one within it). None when the effect sits on the floor."""
    room = effect if effect > math.log1p(floor) else math.log1p(floor) - effect
    if room <= 1e-9 or sigma <= 0:
        return None
    for more in range(1, MAX_ROUNDS_SHOWN + 1):
        if _ratio_half_width(sigma, processes, rounds + more) <= room:
            return more
    return MAX_ROUNDS_SHOWN + 1


def compare_pooled(reference: str, variant: str, noise: PooledNoise, *, floor: float) -> Comparison:
    """median(reference) / median(variant) judged with the run's pooled noise (module docstring)."""
    if floor < 0:
        raise ValueError(f"floor must be >= 0, got {floor}")
    d = np.asarray(noise.visit_logs[reference]) - np.asarray(noise.visit_logs[variant])
    center = float(d.mean())
    half = _ratio_half_width(noise.sigma, noise.processes, noise.rounds)
    ratio, lo, hi = math.exp(center), math.exp(center - half), math.exp(center + half)
    word = word_for(ratio, lo, hi, floor)
    more = (
        _settle_rounds(abs(center), noise.sigma, noise.processes, noise.rounds, floor)
        if word == INCONCLUSIVE
        else None
    )
    return Comparison(ratio, lo, hi, word, floor, noise.rounds, more)


def median_half_width(noise: PooledNoise) -> float:
    """Log-scale 95% half-width of one configuration's median over the run's R visits."""
    return _t(noise.df_within) * noise.sigma_within / math.sqrt(noise.rounds)


@dataclass(frozen=True)
class Power:
    """What this run's noise lets a run of this size see, and what it would take to see more.

    `detectable_effect`: the smallest speedup (0.25 = 1.25×) the run would call *faster* with
    probability POWER (the CI must clear both 1 and the floor); `rounds_for_effect`: the rounds a
    TARGET_EFFECT speedup would need for that; `rounds_for_median`: the rounds a
    ±TARGET_MEDIAN_HALF_WIDTH CI of a configuration's median would need."""

    noise_pct: float
    noise_df: int
    detectable_effect: float
    rounds_for_effect: int | None
    rounds_for_median: int | None


def _smallest_rounds(ok: Callable[[int], bool]) -> int | None:
    return next((r for r in range(2, _MAX_ROUNDS_SEARCHED) if ok(r)), None)


def power(noise: PooledNoise, floor: float) -> Power:
    """Power figures of a run with this pooled noise (class docstring); the rounds are totals."""
    z = float(stats.norm.ppf(POWER))
    P, sigma = noise.processes, noise.sigma

    def detectable(rounds: int) -> float:
        # faster needs the CI to exclude 1 and the ratio to clear the floor: the estimate must pass
        # max(half-width, floor), which it does with probability POWER from z standard errors beyond it
        return max(_ratio_half_width(sigma, P, rounds), math.log1p(floor)) + z * sigma * math.sqrt(2.0 / rounds)

    return Power(
        noise_pct=100.0 * sigma,
        noise_df=noise.df,
        detectable_effect=math.expm1(detectable(noise.rounds)),
        rounds_for_effect=_smallest_rounds(lambda r: detectable(r) <= math.log1p(TARGET_EFFECT)),
        rounds_for_median=_smallest_rounds(
            lambda r: _t(P * (r - 1)) * noise.sigma_within / math.sqrt(r) <= math.log1p(TARGET_MEDIAN_HALF_WIDTH)
        ),
    )
