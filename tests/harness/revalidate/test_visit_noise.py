"""The pooled visit noise: its estimate, the comparisons and median CIs built on it, their calibration
against A/A pairs with process-to-process noise (where a 3-cluster bootstrap is too narrow), and the
power figures."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from harness.revalidate.compare import compare_rounds
from harness.revalidate.visit_noise import (
    TARGET_EFFECT,
    compare_pooled,
    median_half_width,
    pooled_noise,
    power,
)


def _run(rng: np.random.Generator, levels: dict[str, float], rounds: int, *, visit_sd: float = 0.10,
         drift_sd: float = 0.05, sample_sd: float = 0.03, samples: int = 5) -> dict[str, list[list[float]]]:
    """Samples (ms) of configurations with the given median levels: each round shifts everything
    alike (drift), each visit has its own speed (the process), each sample its own noise."""  # fmt: skip
    drift = rng.normal(0.0, drift_sd, rounds)
    return {
        name: [
            list(level * np.exp(drift[r] + rng.normal(0.0, visit_sd) + rng.normal(0.0, sample_sd, samples)))
            for r in range(rounds)
        ]
        for name, level in levels.items()
    }


def test_noise_is_the_residual_of_the_additive_fit():
    # y = log visit medians: rows a, b, c; a round effect of +0.1 in round 2 cancels in the residuals
    y = np.array([[0.0, 0.1, 0.02], [0.5, 0.6, 0.5], [1.0, 1.1, 0.98]])
    by = {n: [[math.exp(v)] for v in row] for n, row in zip("abc", y, strict=True)}
    noise = pooled_noise(by)
    assert noise is not None and (noise.configurations, noise.rounds, noise.df, noise.df_within) == (3, 3, 4, 6)
    resid = y - y.mean(1, keepdims=True) - y.mean(0, keepdims=True) + y.mean()
    assert noise.sigma == pytest.approx(math.sqrt((resid**2).sum() / 4))
    within = y - y.mean(1, keepdims=True)
    assert noise.sigma_within == pytest.approx(math.sqrt((within**2).sum() / 6))
    assert noise.visit_logs["b"] == pytest.approx(tuple(y[1]))


def test_nothing_to_pool():
    assert pooled_noise({"a": [[1.0], [1.1]]}) is None  # one configuration
    assert pooled_noise({"a": [[1.0]], "b": [[2.0]]}) is None  # one round
    assert pooled_noise({"a": [[1.0], [1.1]], "b": [[2.0]]}) is None  # a run still in its first round
    with pytest.raises(ValueError, match="positive, finite"):
        pooled_noise({"a": [[1.0], []], "b": [[2.0], [2.0]]})


def test_comparison_is_the_geometric_mean_of_round_ratios_with_a_t_interval():
    rng = np.random.default_rng(3)
    by = _run(rng, {"ref": 120.0, "var": 100.0, "x": 80.0, "y": 150.0}, rounds=4)
    noise = pooled_noise(by)
    assert noise is not None
    cmp = compare_pooled("ref", "var", noise, floor=0.02)
    d = [math.log(np.median(a) / np.median(b)) for a, b in zip(by["ref"], by["var"], strict=True)]
    assert cmp.ratio == pytest.approx(math.exp(np.mean(d)))
    half = stats.t.ppf(0.975, 3 * 3) * noise.sigma * math.sqrt(2 / 4)
    assert (cmp.ci_lo, cmp.ci_hi) == pytest.approx((cmp.ratio * math.exp(-half), cmp.ratio * math.exp(half)))
    assert cmp.rounds == 4
    assert median_half_width(noise) == pytest.approx(stats.t.ppf(0.975, 4 * 3) * noise.sigma_within / 2)


def test_aa_pairs_called_different_at_most_five_percent_where_the_bootstrap_is_too_narrow():
    """400 simulated A/A runs like the CPU default (12 points, 3 rounds, each visit a process at its own
    speed, sd 10%): the pooled interval calls ≤ 5% of the identical pairs faster/slower; the
    3-cluster bootstrap, which cannot see the visit spread, calls more."""
    rng = np.random.default_rng(0)
    pooled = boot = 0
    runs = 400
    for _ in range(runs):
        by = _run(rng, {f"p{i:02d}": 100.0 for i in range(12)}, rounds=3)
        noise = pooled_noise(by)
        assert noise is not None
        pooled += compare_pooled("p00", "p01", noise, floor=0.02).word in ("faster", "slower")
        boot += compare_rounds(by["p00"], by["p01"], floor=0.02, n_boot=400).word in ("faster", "slower")
    assert pooled / runs <= 0.05
    assert boot > pooled


def test_a_real_effect_is_seen_and_more_rounds_would_settle_a_small_one():
    rng = np.random.default_rng(1)
    levels = {"copying": 130.0, "donated": 100.0} | {f"other{i}": 100.0 for i in range(10)}
    noise = pooled_noise(_run(rng, levels, rounds=3, visit_sd=0.04))
    assert noise is not None
    assert compare_pooled("copying", "donated", noise, floor=0.02).word == "faster"
    small = pooled_noise(_run(rng, {"a": 104.0, "b": 100.0, "c": 100.0}, rounds=3, visit_sd=0.06))
    assert small is not None
    cmp = compare_pooled("a", "b", small, floor=0.02)
    if cmp.word == "inconclusive":
        assert cmp.rounds_to_settle is not None and cmp.rounds_to_settle >= 1


def test_power_figures_follow_the_noise():
    rng = np.random.default_rng(2)
    levels = {f"p{i}": 100.0 for i in range(12)}
    quiet = pooled_noise(_run(rng, levels, rounds=3, visit_sd=0.01, drift_sd=0.0, sample_sd=0.005))
    noisy = pooled_noise(_run(rng, levels, rounds=3, visit_sd=0.12))
    assert quiet is not None and noisy is not None
    pq, pn = power(quiet, 0.02), power(noisy, 0.02)
    assert pq.noise_pct < pn.noise_pct and pq.noise_df == pn.noise_df == 22
    assert pq.detectable_effect < TARGET_EFFECT < pn.detectable_effect
    assert pq.rounds_for_effect is not None and pq.rounds_for_effect <= 3
    assert pn.rounds_for_effect is not None and pn.rounds_for_effect > 3
    assert pn.rounds_for_median is not None and pq.rounds_for_median is not None
    assert pn.rounds_for_median > pq.rounds_for_median
    # the quoted rounds are the fewest that do it: one fewer does not
    z, s = stats.norm.ppf(0.8), noisy.sigma

    def needed(r: int) -> float:
        return max(stats.t.ppf(0.975, 11 * (r - 1)) * s * math.sqrt(2 / r), math.log1p(0.02)) + z * s * math.sqrt(2 / r)

    r = pn.rounds_for_effect
    assert needed(r) <= math.log1p(TARGET_EFFECT) < needed(r - 1)


def test_configurations_sharing_a_process_count_as_one():
    """Four configurations in two shared-weights groups, 3 rounds: the noise's units are the two
    processes, so (2 − 1)(3 − 1) = 2 df, not (4 − 1)(3 − 1) = 6, and the residual sum is shared
    among 2 df × 2 configurations a process (an upper bound: 6/4 of the usual estimate's square);
    one group alone has nothing to pool."""
    rng = np.random.default_rng(4)
    by = _run(rng, {"a1": 100.0, "a2": 90.0, "b1": 100.0, "b2": 90.0}, rounds=3)
    groups = {"a1": "A", "a2": "A", "b1": "B", "b2": "B"}
    noise = pooled_noise(by, groups)
    assert noise is not None and (noise.configurations, noise.processes, noise.df, noise.df_within) == (4, 2, 2, 4)
    alone = pooled_noise(by, dict.fromkeys(by, "A"))
    assert alone is None
    separate = pooled_noise(by)
    assert separate is not None and separate.df == 6
    assert noise.sigma == pytest.approx(separate.sigma * math.sqrt(6 / 4))
    assert noise.sigma_within == pytest.approx(separate.sigma_within)


def _host_run(rng: np.random.Generator, levels: dict[str, float], rounds: int, *, bandwidth_sd: float = 0.10,
              rest_sd: float = 0.04, probe_sd: float = 0.02, moves_probe: dict[str, float] | None = None,
              samples: int = 5) -> tuple[dict[str, list[list[float]]], dict[str, list[list[float]]]]:
    """(samples, probe readings) of configurations on a host whose memory bandwidth wanders from visit
    to visit (sd `bandwidth_sd` on the log scale): a visit's steps take 1 / bandwidth longer (slope −1),
    plus noise of their own (`rest_sd`); the probe reads the bandwidth with noise `probe_sd`, shifted by
    `moves_probe[name]` (log) for a configuration that moves it."""  # fmt: skip
    steps: dict[str, list[list[float]]] = {}
    probe: dict[str, list[list[float]]] = {}
    for name, level in levels.items():
        steps[name], probe[name] = [], []
        for _ in range(rounds):
            bw = rng.normal(0.0, bandwidth_sd)
            steps[name].append(list(level * np.exp(-bw + rng.normal(0.0, rest_sd) + rng.normal(0.0, 0.02, samples))))
            shift = (moves_probe or {}).get(name, 0.0)
            probe[name].append(list(20.0 * np.exp(bw + shift + rng.normal(0.0, probe_sd, samples))))
    return steps, probe


def test_probe_covariate_by_hand():
    """The slope is the regression of the additive fit's residuals; the noise after it has one df fewer;
    the ratio moves by slope × the configurations' probe difference and the interval widens by it."""
    rng = np.random.default_rng(5)
    steps, probe = _host_run(rng, {"a": 110.0, "b": 100.0, "c": 90.0, "d": 100.0}, rounds=5)
    noise = pooled_noise(steps, probe=probe)
    plain = pooled_noise(steps)
    assert noise is not None and plain is not None and noise.probe is not None and noise.probe.used
    y = np.log([[np.median(v) for v in steps[n]] for n in "abcd"])
    x = np.log([[np.median(v) for v in probe[n]] for n in "abcd"])

    def resid(m: np.ndarray) -> np.ndarray:
        return m - m.mean(1, keepdims=True) - m.mean(0, keepdims=True) + m.mean()

    ey, ex = resid(y), resid(x)
    slope = (ey * ex).sum() / (ex**2).sum()
    assert noise.probe.slope == pytest.approx(slope)
    assert noise.df == plain.df - 1 == 11
    assert noise.sigma == pytest.approx(math.sqrt(((ey - slope * ex) ** 2).sum() / 11))
    assert noise.probe.sigma_before == pytest.approx(plain.sigma)
    assert noise.sigma_within == pytest.approx(plain.sigma_within)  # absolute medians: not adjusted
    cmp = compare_pooled("a", "b", noise, floor=0.02)
    dx = x[0].mean() - x[1].mean()
    center = (y[0] - y[1]).mean() - slope * dx
    half = stats.t.ppf(0.975, 11) * noise.sigma * math.sqrt(2 / 5 + dx**2 / (ex**2).sum())
    assert (cmp.ratio, cmp.ci_lo, cmp.ci_hi) == pytest.approx(
        (math.exp(center), math.exp(center - half), math.exp(center + half))
    )


def test_probe_takes_out_the_host_bandwidth_and_stays_calibrated():
    """300 simulated runs like `revalidate --all` (12 points × 3 rounds) on a host whose bandwidth moves
    each visit by 10%: with the probe as covariate the noise falls to about the steps' own, an A/A pair
    is called different in ≤ 5% of runs, and a real 1.12× effect is called faster far more often."""
    rng = np.random.default_rng(6)
    runs, false_calls, seen_plain, seen_probe, ratios = 300, 0, 0, 0, []
    for _ in range(runs):
        levels = {f"p{i:02d}": 100.0 for i in range(12)} | {"p11": 112.0}
        steps, probe = _host_run(rng, levels, rounds=3)
        noise, plain = pooled_noise(steps, probe=probe), pooled_noise(steps)
        assert noise is not None and plain is not None and noise.probe is not None
        ratios.append(noise.sigma / plain.sigma)
        false_calls += compare_pooled("p00", "p01", noise, floor=0.02).word in ("faster", "slower")
        seen_probe += compare_pooled("p11", "p02", noise, floor=0.02).word == "faster"
        seen_plain += compare_pooled("p11", "p02", plain, floor=0.02).word == "faster"
    assert false_calls / runs <= 0.05
    assert np.median(ratios) < 0.6
    assert seen_probe > 2 * seen_plain


def test_a_probe_the_configurations_move_is_not_used():
    """Where one configuration moves the probe itself (here by 15%), adjusting for it would take part of
    that configuration's effect away: the F test sees it and the verdicts keep the plain noise."""
    rng = np.random.default_rng(7)
    steps, probe = _host_run(rng, {"copying": 130.0, "donated": 100.0}, rounds=20, moves_probe={"copying": -0.15})
    noise, plain = pooled_noise(steps, probe=probe), pooled_noise(steps)
    assert noise is not None and plain is not None and noise.probe is not None
    assert not noise.probe.used and noise.probe.config_effect_p < 0.05
    assert (noise.sigma, noise.df) == (plain.sigma, plain.df)
    assert compare_pooled("copying", "donated", noise, floor=0.02) == compare_pooled("copying", "donated", plain, floor=0.02)


def test_probe_is_ignored_without_readings_on_every_visit_with_shared_processes_or_few_df():
    rng = np.random.default_rng(8)
    small, small_probe = _host_run(rng, {"a": 100.0, "b": 90.0, "c": 100.0}, rounds=5)  # 8 df
    assert pooled_noise(small, probe=small_probe).probe is None  # type: ignore[union-attr]
    steps, probe = _host_run(rng, {"a1": 100.0, "a2": 90.0, "b1": 100.0, "b2": 90.0}, rounds=5)
    assert pooled_noise(steps, probe=probe).probe is not None  # type: ignore[union-attr]
    assert pooled_noise(steps, probe={**probe, "a1": [*probe["a1"][:2], [], *probe["a1"][3:]]}).probe is None  # type: ignore[union-attr]
    assert pooled_noise(steps, probe={k: v for k, v in probe.items() if k != "b2"}).probe is None  # type: ignore[union-attr]
    shared = pooled_noise(steps, {"a1": "A", "a2": "A", "b1": "B", "b2": "B"}, probe)
    assert shared is not None and shared.probe is None and shared.covariates == 0
