"""The host's visit-to-visit noise, pooled over a run's configurations, and the verdicts and power it gives.

Why: in a revalidate run every configuration is measured once per round, each time in a fresh
process. On the 2-core development VM a visit's median step time moves 9–21% (sd) from visit to
visit for reasons that belong to the host, not the configuration (the neighbours' memory traffic,
vCPU placement), and within one visit the samples agree far better. So a comparison is only as
good as its number of *visits*, and with the CPU default of 3 rounds a pair of configurations has 3
paired visits: a bootstrap over 3 clusters cannot see their spread (it called 3 and 4 of 40 A/A
pairs different, docs/findings.md §2), and an interval honest
for 3 clusters alone (Student t with 2 degrees of freedom) is ±25–35% wide there.

But the visit noise is a property of the host, and every configuration of the run sees it: the
residual spread is about the same for copying and donated steps, bf16 and int8 KV (11.7–14.2% over
every recorded run; docs/findings.md §1.4). So it is estimated once, from
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

**The memory bandwidth probe as a covariate.** Much of that visit noise is the host's memory
bandwidth: on the CPU every visit also reads a bandwidth probe between its timing windows
(harness/hostload.py), and where the step streams memory (E2B) a visit's log median follows the
probe's log median with a slope near −1 (r −0.5 to −0.9 in the 9 recorded E2B runs with it). Since
the visits are randomized and the probe is the host's, not the configuration's, it is a covariate
of the block design (analysis of covariance)::

    y[c, r] = mu[c] + rho[r] + beta · x[c, r] + e[c, r]      x = log(median probe GB/s of the visit)

    beta   = sum(ey · ex) / Sxx      ey, ex: the additive fit's residuals of y and x; Sxx = sum(ex²)
    sigma² = sum((ey − beta · ex)²) / ((C − 1)(R − 1) − 1)
    ratio  = exp(mean d − beta · (xbar[a] − xbar[b]))         the ratio at equal host bandwidth
    CI     = exp(log ratio ± t(0.975, df − 1) · sigma · sqrt(2 / R + (xbar[a] − xbar[b])² / Sxx))

It took the pooled noise of those runs from 8.2–16.5% to 4.8–11.8%
(docs/findings.md §1.3). It is used only where it is a host measure and
there is room for it: every configuration in its own process, probe readings on every visit, at
least PROBE_MIN_DF degrees of freedom, and no configuration effect on the probe (F test of the
configuration means of x, p ≥ PROBE_CONFIG_EFFECT_P: a configuration that moved the probe would
make the adjustment take part of its own effect away; copying steps at small b32 ctx8192 read it
0.9–5.9% lower than donated ones). A configuration's absolute median CI stays unadjusted: the
host's bandwidth is part of what a user's step costs.

The words are harness/revalidate/compare.py's (`word_for`, practical floor). Power (`Power`): the smallest
speedup the run calls *faster* with 80% probability, and the rounds that a 10% effect or a ±2%
median CI would need at this noise — so a run that cannot see the effect it is asked about says so,
and how much longer it would have to run.

Data flow: harness/revalidate/verdicts.py hands `pooled_noise` the per-visit samples of every configuration
(the samples taken while the host was busy left out, as for the verdicts), the process groups of
those that shared one and the visits' probe readings; `compare_pooled` judges each pair from
different processes; pairs from
one process keep the paired bootstrap (harness/revalidate/compare.py). harness/revalidate/records.py reads
`Power` into the run summary.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats

from harness.revalidate.compare import INCONCLUSIVE, MAX_ROUNDS_SHOWN, Comparison, Rounds, word_for

POWER = 0.80  # the probability at which `Power` quotes a detectable effect
CONFIDENCE = 0.95
TARGET_EFFECT = 0.10  # the effect `Power.rounds_for_effect` is quoted for
TARGET_MEDIAN_HALF_WIDTH = 0.02  # the median CI `Power.rounds_for_median` is quoted for
_MAX_ROUNDS_SEARCHED = 10_000
PROBE_CONFIG_EFFECT_P = 0.05  # below it the configurations moved the probe: it is not used as a covariate
PROBE_MIN_DF = 10  # the covariate costs a degree of freedom: below this many it costs more than it brings


@dataclass(frozen=True)
class ProbeCovariate:
    """The memory bandwidth probe as a covariate of the visit noise (module docstring).

    `slope`: beta, d log(step) / d log(GB/s) within configurations and rounds (≈ −1 where the step
    streams memory); `corr`: the correlation of the two residuals; `means[name]`: the configuration's
    mean log GB/s; `sxx`: the probe's residual sum of squares; `sigma_before`: the pooled noise
    without it and `sigma_after` with it; `config_effect_p`: the F test's p that the configurations
    moved the probe; `used`: whether the verdicts adjust for it (p ≥ PROBE_CONFIG_EFFECT_P)."""

    slope: float
    corr: float
    means: Mapping[str, float]
    sxx: float
    sigma_before: float
    sigma_after: float
    config_effect_p: float

    @property
    def used(self) -> bool:
        return self.config_effect_p >= PROBE_CONFIG_EFFECT_P


@dataclass(frozen=True)
class PooledNoise:
    """The run's visit-to-visit noise on the log scale, from C configurations × R rounds.

    `sigma`: residual sd of a visit's log median after configuration and round effects (ratios);
    `sigma_within`: sd of a visit's log median about its configuration's mean, round effects
    included (absolute times); `processes`: the processes per round (= configurations unless some
    share one). `visit_logs[name][r]` is y[c, r]. `probe`: the bandwidth probe covariate where the
    visits read it; where `probe.used`, `sigma` is the noise after it and `df` one fewer."""

    sigma: float
    sigma_within: float
    configurations: int
    rounds: int
    processes: int
    visit_logs: Mapping[str, tuple[float, ...]]
    probe: ProbeCovariate | None = None

    @property
    def covariates(self) -> int:
        return 1 if self.probe is not None and self.probe.used else 0

    @property
    def df(self) -> int:
        return _df(self.processes, self.rounds) - self.covariates

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


def _additive_residuals(m: np.ndarray) -> np.ndarray:
    """What is left of a [C, R] table after configuration and round effects."""
    return m - m.mean(axis=1, keepdims=True) - m.mean(axis=0, keepdims=True) + m.mean()


def _probe_covariate(names: Sequence[str], resid: np.ndarray, probe: Mapping[str, Rounds], sigma: float) -> ProbeCovariate | None:
    """The probe covariate of these residuals (module docstring); None where a visit has no reading,
    the probe did not vary, or the design has fewer than PROBE_MIN_DF degrees of freedom (with
    fewer, the wider t quantile of one df less can outweigh what the probe explains)."""
    if any(not probe.get(n) or len(probe[n]) != resid.shape[1] or any(not v for v in probe[n]) for n in names):
        return None
    x = np.log([[_visit_median(v) for v in probe[n]] for n in names])
    C, R = x.shape
    df = _df(C, R)
    ex = _additive_residuals(x)
    sxx = float((ex**2).sum())
    if df < PROBE_MIN_DF or sxx <= 1e-12:
        return None
    slope = float((resid * ex).sum() / sxx)
    syy = float((resid**2).sum())
    between = R * float(((x.mean(axis=1) - x.mean()) ** 2).sum()) / (C - 1)
    return ProbeCovariate(
        slope=slope,
        corr=float((resid * ex).sum() / math.sqrt(sxx * syy)) if syy > 0 else 0.0,
        means={n: float(v) for n, v in zip(names, x.mean(axis=1), strict=True)},
        sxx=sxx,
        sigma_before=sigma,
        sigma_after=float(math.sqrt(((resid - slope * ex) ** 2).sum() / (df - 1))),
        config_effect_p=float(stats.f.sf(between / (sxx / df), C - 1, df)),
    )


def pooled_noise(
    by_config: Mapping[str, Rounds],
    process_of: Mapping[str, str] | None = None,
    probe: Mapping[str, Rounds] | None = None,
) -> PooledNoise | None:
    """The pooled noise of configurations measured in the same R rounds; `process_of` names the
    process group of the configurations that share one per round (the rest have their own);
    `probe[name][r]`: the bandwidth probe's readings (GB/s) of that visit, a covariate where every
    configuration had its own process (module docstring). None when there is nothing to pool: fewer
    than 2 processes or 2 rounds, or configurations with different numbers of rounds (a run still in
    its first round)."""
    counts = {len(r) for r in by_config.values()}
    shared = process_of or {}
    processes = len({shared.get(n, f"own:{n}") for n in by_config})
    if processes < 2 or len(counts) != 1 or counts.pop() < 2:
        return None
    names = list(by_config)
    y = np.log([[_visit_median(v) for v in by_config[n]] for n in names])  # [C, R]
    within = y - y.mean(axis=1, keepdims=True)
    resid = _additive_residuals(y)
    C, R = y.shape
    sigma = float(math.sqrt((resid**2).sum() / (_df(processes, R) * C / processes)))
    covariate = _probe_covariate(names, resid, probe, sigma) if probe and processes == C else None
    return PooledNoise(
        sigma=covariate.sigma_after if covariate is not None and covariate.used else sigma,
        sigma_within=float(math.sqrt((within**2).sum() / (C * (R - 1)))),
        configurations=C,
        rounds=R,
        processes=processes,
        visit_logs={n: tuple(float(x) for x in row) for n, row in zip(names, y, strict=True)},
        probe=covariate,
    )


def _t(df: int) -> float:
    return float(stats.t.ppf(0.5 + CONFIDENCE / 2.0, df))


def _ratio_half_width(sigma: float, processes: int, rounds: int, covariates: int = 0) -> float:
    """Log-scale half-width of a comparison's CI at this noise with `rounds` rounds (with a
    covariate, leaving out its (xbar[a] − xbar[b])² / Sxx term: small, and unknown for rounds to come)."""
    return _t(_df(processes, rounds) - covariates) * sigma * math.sqrt(2.0 / rounds)


def _settle_rounds(effect: float, noise: PooledNoise, floor: float) -> int | None:
    """More rounds after which a CI this wide would likely decide: exclude 1 (an effect beyond the
    floor) or fit inside ±floor (one within it). None when the effect sits on the floor."""
    room = effect if effect > math.log1p(floor) else math.log1p(floor) - effect
    if room <= 1e-9 or noise.sigma <= 0:
        return None
    for more in range(1, MAX_ROUNDS_SHOWN + 1):
        if _ratio_half_width(noise.sigma, noise.processes, noise.rounds + more, noise.covariates) <= room:
            return more
    return MAX_ROUNDS_SHOWN + 1


def compare_pooled(reference: str, variant: str, noise: PooledNoise, *, floor: float) -> Comparison:
    """median(reference) / median(variant) judged with the run's pooled noise (module docstring)."""
    if floor < 0:
        raise ValueError(f"floor must be >= 0, got {floor}")
    d = np.asarray(noise.visit_logs[reference]) - np.asarray(noise.visit_logs[variant])
    center, spread = float(d.mean()), 2.0 / noise.rounds
    if noise.probe is not None and noise.probe.used:
        dx = noise.probe.means[reference] - noise.probe.means[variant]
        center -= noise.probe.slope * dx
        spread += dx * dx / noise.probe.sxx
    half = _t(noise.df) * noise.sigma * math.sqrt(spread)
    ratio, lo, hi = math.exp(center), math.exp(center - half), math.exp(center + half)
    word = word_for(ratio, lo, hi, floor)
    more = _settle_rounds(abs(center), noise, floor) if word == INCONCLUSIVE else None
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
    P, sigma, k = noise.processes, noise.sigma, noise.covariates

    def detectable(rounds: int) -> float:
        # faster needs the CI to exclude 1 and the ratio to clear the floor: the estimate must pass
        # max(half-width, floor), which it does with probability POWER from z standard errors beyond it
        return max(_ratio_half_width(sigma, P, rounds, k), math.log1p(floor)) + z * sigma * math.sqrt(2.0 / rounds)

    return Power(
        noise_pct=100.0 * sigma,
        noise_df=noise.df,
        detectable_effect=math.expm1(detectable(noise.rounds)),
        rounds_for_effect=_smallest_rounds(lambda r: detectable(r) <= math.log1p(TARGET_EFFECT)),
        rounds_for_median=_smallest_rounds(
            lambda r: _t(P * (r - 1)) * noise.sigma_within / math.sqrt(r) <= math.log1p(TARGET_MEDIAN_HALF_WIDTH)
        ),
    )
