"""Revalidate's records: one per point from its visits, and one run summary (host quiet? A/A rate).

Data flow: harness/revalidate/main.py hands each point's visit results (one per round, in round order:
a child's dict with ``step_ms_samples`` and per-sample host load, or a failure record) to
`measurement_record` (its median's CI from the hierarchical bootstrap); `with_pooled_median_ci` then
replaces that CI, for the points measured in their own processes, with the one from the run's pooled
visit noise (harness/revalidate/visit_noise.py); `summary_record` reads the measurement and ratio records back,
with that noise's power figures.

A point with any failed visit becomes a failure record (the first failure, its round named), so
comparisons stay balanced across rounds; `--resume` measures the failed visits again.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from harness.hostload import CONTAMINATED_CORES, CONTAMINATED_STEAL, STEADY_BANDWIDTH_IQR_PCT, contaminated

if TYPE_CHECKING:
    from harness.revalidate.visit_noise import PooledNoise

MIN_CLEAN_PER_ROUND = 2  # verdicts drop contaminated samples only if every round keeps this many


def clean_rounds(record: dict[str, Any]) -> tuple[list[list[float]], int] | None:
    """The record's samples by round without those taken while the host was busy, and how many were
    dropped; None when some round would keep fewer than MIN_CLEAN_PER_ROUND of them."""
    rounds = record["step_ms_by_round"]
    loads = record.get("host_other_cores_by_round") or [[0.0] * len(r) for r in rounds]
    steal = record.get("host_steal_frac_by_round") or [[0.0] * len(r) for r in rounds]
    clean = [
        [t for t, load, st in zip(r, lr, sr, strict=True) if not contaminated(load, st)]
        for r, lr, sr in zip(rounds, loads, steal, strict=True)
    ]
    if min(len(r) for r in clean) < MIN_CLEAN_PER_ROUND:
        return None
    return clean, sum(len(r) for r in rounds) - sum(len(r) for r in clean)


def _cost_fields(case: dict[str, Any]) -> dict[str, Any]:
    """Bytes moved and FLOPs by part of this decode step (g4bench/model/costs.py)."""
    from g4bench.engine.bench import DecodeCase
    from g4bench.model.config import load_config
    from g4bench.model.costs import decode_cost, describe

    c = DecodeCase(**case)
    return describe(
        decode_cost(load_config(c.model), c.weight_format, c.layout, c.batch, c.ctx, donated=c.donate)
    )


def measurement_record(
    point: Any,
    results: Sequence[dict[str, Any]],
    settings: Any,
    *,
    run_id: str,
    base_env: dict[str, Any],
) -> dict[str, Any]:
    """A `revalidate` record from a point's visit results (one per measured round)."""
    from harness.results import is_failure, make_record
    from harness.revalidate.compare import median_ci
    from harness.run import record_env
    from harness.stats import summarize

    config = {**point.case, "samples": settings.samples, "warmup": settings.warmup, "seed": settings.seed,
              "rounds": settings.rounds}  # fmt: skip
    device = next((r.get("device") for r in results if r.get("device")), None)
    env = record_env(base_env, config, device)
    wall_s = float(sum(r.get("wall_s", 0.0) for r in results))
    failed = [(i, r) for i, r in enumerate(results) if is_failure(r)]
    if failed:
        i, r = failed[0]
        fail = dict(r["failure"])
        fail["detail"] = f"round {i + 1}: {fail['detail']}"
        return make_record(
            "revalidate", point.name, run_id=run_id, env=env, config=config, failure=fail, wall_s=wall_s
        )
    by_round = [[float(x) for x in r["step_ms_samples"]] for r in results]
    loads = [[float(x) for x in r.get("host_other_cores") or [0.0] * len(t)] for r, t in zip(results, by_round, strict=True)]
    steal = [[float(x) for x in r.get("host_steal_frac") or [0.0] * len(t)] for r, t in zip(results, by_round, strict=True)]
    faults = [[int(x) for x in r.get("minor_faults") or []] for r in results]
    mem = [[float(x) for x in r.get("host_mem_gbs") or []] for r in results]
    flat = [t for r in by_round for t in r]
    st = summarize(flat)
    lo, hi = median_ci(by_round, seed=settings.seed)
    batch, ctx = int(point.case["batch"]), int(point.case["ctx"])
    flagged = sum(contaminated(o, s) for lr, sr in zip(loads, steal, strict=True) for o, s in zip(lr, sr, strict=True))
    return make_record(
        "revalidate",
        point.name,
        run_id=run_id,
        env=env,
        config=config,
        batch=batch,
        ctx=ctx,
        step_ms_median=st.median,
        step_ms_min=st.min,
        step_ms_max=st.max,
        step_ms_q1=st.q1,
        step_ms_q3=st.q3,
        step_ms_iqr=st.iqr,
        step_rel_iqr_pct=st.rel_iqr_pct,
        step_ms_ci95_lo=lo,
        step_ms_ci95_hi=hi,
        step_ci95_half_width_pct=100.0 * (hi - lo) / 2.0 / st.median,
        agg_tok_per_s=batch * 1000.0 / st.median,
        n_samples=st.n,
        rounds=len(by_round),
        warmup=settings.warmup,
        weights_bytes=int(results[0]["weights_bytes"]),
        kv_bytes=int(results[0]["kv_bytes"]),
        compile_s=float(results[0]["compile_s"]),
        compile_s_by_round=[float(r["compile_s"]) for r in results],
        wall_s=wall_s,
        step_ms_samples=flat,
        step_ms_by_round=by_round,
        host_other_cores_by_round=loads,
        host_steal_frac_by_round=steal,
        minor_faults_by_round=faults,
        **({"host_mem_gbs_by_round": mem} if all(len(m) == len(t) for m, t in zip(mem, by_round, strict=True)) else {}),
        contaminated_samples=int(flagged),
        cpus=results[0].get("cpus"),
        **_cost_fields(point.case),
    )


def with_pooled_median_ci(measurements: Sequence[dict[str, Any]], noise: PooledNoise | None) -> None:
    """Set, in place, the median CI of every point in `noise` from the pooled visit noise:
    ``median × exp(±t · sigma_within / √R)`` (harness/revalidate/visit_noise.py), and ``ci_method: "pooled"``;
    the others (no noise to pool) keep their bootstrap CI (``ci_method: "bootstrap"``)."""
    import math

    from harness.revalidate.visit_noise import median_half_width

    half = median_half_width(noise) if noise is not None else None
    for m in measurements:
        if m.get("kind") != "revalidate" or "step_ms_median" not in m:
            continue
        if half is None or noise is None or m["name"] not in noise.visit_logs:
            m["ci_method"] = "bootstrap"
            continue
        med = m["step_ms_median"]
        m["step_ms_ci95_lo"], m["step_ms_ci95_hi"] = med * math.exp(-half), med * math.exp(half)
        m["step_ci95_half_width_pct"] = 100.0 * (m["step_ms_ci95_hi"] - m["step_ms_ci95_lo"]) / 2.0 / med
        m["ci_method"] = "pooled"


def power_fields(noise: PooledNoise | None, floor: float, measurements: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The run summary's power figures from its pooled visit noise (harness/revalidate/visit_noise.py `Power`),
    with the wall time one round took on average; {} when there was nothing to pool."""
    from harness.revalidate.visit_noise import TARGET_EFFECT, TARGET_MEDIAN_HALF_WIDTH, power

    if noise is None:
        return {}
    p = power(noise, floor)
    timed = [m for m in measurements if m.get("kind") == "revalidate" and m.get("rounds")]
    round_s = sum(m["wall_s"] for m in timed) / max(1, max((m["rounds"] for m in timed), default=1))
    probe = noise.probe
    return {
        "visit_noise_pct": p.noise_pct,
        "visit_noise_df": p.noise_df,
        **(
            {
                "visit_noise_before_probe_pct": 100.0 * probe.sigma_before,
                "probe_slope": probe.slope,
                "probe_corr": probe.corr,
                "probe_config_effect_p": probe.config_effect_p,
                "probe_used": probe.used,
            }
            if probe is not None
            else {}
        ),
        "detectable_effect_pct": 100.0 * p.detectable_effect,
        "target_effect_pct": 100.0 * TARGET_EFFECT,
        "rounds_for_target_effect": p.rounds_for_effect,
        "target_median_half_width_pct": 100.0 * TARGET_MEDIAN_HALF_WIDTH,
        "rounds_for_target_median": p.rounds_for_median,
        "round_wall_s": round_s,
    }


def memory_bandwidth_fields(measurements: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The run's memory bandwidth probe readings (harness/hostload.py): median GB/s, relative IQR,
    and `step_mem_corr`, the correlation of log step time with log(1 / bandwidth), each centred per
    configuration so that the configurations' own differences do not count. {} when no record
    carries probe readings (older runs, or fewer than three samples)."""
    import numpy as np

    steps: list[np.ndarray] = []
    slowness: list[np.ndarray] = []
    for m in measurements:
        mem = m.get("host_mem_gbs_by_round")
        if not mem:
            continue
        t = np.log(np.concatenate([np.asarray(r, dtype=np.float64) for r in m["step_ms_by_round"]]))
        g = np.concatenate([np.asarray(r, dtype=np.float64) for r in mem])
        steps.append(t - t.mean())
        slowness.append(-np.log(g))
    if not steps or sum(x.size for x in steps) < 3:
        return {}
    gbs = np.exp(-np.concatenate(slowness))
    q1, med, q3 = np.quantile(gbs, [0.25, 0.5, 0.75])
    x = np.concatenate(steps)
    y = np.concatenate([s - s.mean() for s in slowness])
    corr = float(np.corrcoef(x, y)[0, 1]) if x.std() > 0 and y.std() > 0 else 0.0
    return {
        "host_mem_gbs_median": float(med),
        "host_mem_rel_iqr_pct": float(100.0 * (q3 - q1) / med),
        "step_mem_corr": corr,
    }


def summary_record(
    measurements: Sequence[dict[str, Any]],
    ratios: Sequence[dict[str, Any]],
    settings: Any,
    *,
    run_id: str,
    base_env: dict[str, Any],
    noise: PooledNoise | None = None,
) -> dict[str, Any]:
    """Run-level facts: was the host quiet (few samples flagged busy by CPU time, and the memory
    bandwidth probe steady where it read), how wide are the CIs, what the run's pooled visit noise
    lets it detect (`power_fields`), and (A/A runs) the observed false-positive rate of each rule."""
    import statistics

    from harness.results import is_failure, make_record
    from harness.run import record_env

    ok = [m for m in measurements if not is_failure(m)]
    n = sum(m["n_samples"] for m in ok)
    flagged = sum(m["contaminated_samples"] for m in ok)
    config = {"rounds": settings.rounds, "samples": settings.samples, "floor": settings.floor, "aa": settings.aa}
    cpu_quiet = n > 0 and flagged / n <= 0.05
    bandwidth = memory_bandwidth_fields(ok)
    if bandwidth:
        bandwidth["host_mem_steady"] = bandwidth["host_mem_rel_iqr_pct"] <= STEADY_BANDWIDTH_IQR_PCT
        bandwidth["host_mem_steady_threshold_pct"] = STEADY_BANDWIDTH_IQR_PCT
    fields: dict[str, Any] = {
        "samples_total": n,
        "contaminated_samples": flagged,
        "contaminated_threshold_cores": CONTAMINATED_CORES,
        "contaminated_threshold_steal": CONTAMINATED_STEAL,
        "host_cpu_quiet": cpu_quiet,
        "host_quiet": cpu_quiet and bandwidth.get("host_mem_steady", True),
        "median_ci95_half_width_pct": statistics.median(m["step_ci95_half_width_pct"] for m in ok) if ok else None,
        **bandwidth,
        **power_fields(noise, settings.floor, ok),
        **({"rounds_done": max(m["rounds"] for m in ok)} if ok else {}),
        "verdict_counts": {w: sum(r["verdict"] == w for r in ratios) for w in sorted({r["verdict"] for r in ratios})},
    }  # fmt: skip
    aa = [r for r in ratios if r["effect"] == "aa"]
    if aa:
        fields["aa_comparisons"] = len(aa)
        fields["aa_false_positives"] = sum(r["verdict"] in ("faster", "slower") for r in aa)
        fields["aa_false_positive_rate"] = fields["aa_false_positives"] / len(aa)
        fields["aa_ci_excludes_one"] = sum(r["ci95_lo"] > 1 or r["ci95_hi"] < 1 for r in aa)
        fields["aa_rule_2iqr_real"] = sum(r["rule_2iqr"] == "real" for r in aa)
    env = record_env(base_env, config)
    return make_record("summary", "run", run_id=run_id, env=env, config=config, **fields)
