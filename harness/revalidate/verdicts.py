"""Within-run verdicts: pair points that differ in one field and judge each ratio with a CI.

A revalidate run measures a grid (PLE × KV dtype × donation, per batch and context). The questions
worth asking of it are effects: does donation speed the step up, does an int8 KV cache, does a
quantized PLE table? Each is answered by pairing the two points that differ only in that field:

    ratio   = median(reference) / median(variant)          (> 1: the variant is faster)
    CI      = sides measured in different processes: the block-design interval with the
              visit-to-visit noise pooled over the run's configurations (harness/revalidate/visit_noise.py,
              ``ci_method: "pooled"``; "pooled+probe" where the memory bandwidth probe was its
              covariate, the ratio then at equal host bandwidth); sides that shared a process
              (`same_process`), or a run with nothing to pool: the paired hierarchical bootstrap
              over rounds and samples (harness/revalidate/compare.py, ``ci_method: "bootstrap"``). Both use
              the samples taken while the host was quiet when every round keeps enough of them
    verdict = faster | slower | equivalent | inconclusive   (practical floor, default 2%)
    rule_2iqr = the reference article's "real" / "within noise" (|ratio − 1| > 2 × the larger
              relative IQR), kept as a column to read against its tables

An A/A run (``--aa N``) pairs ``aa<i>-A`` with ``aa<i>-B``: identical configurations, so every
*faster* or *slower* is a false positive (the run summary reports the rate).

Data flow: `run_noise(measurements)` → the run's `PooledNoise` (also the configurations' median CIs
and the summary's power figures); `ratio_records(measurements)` → ``kind: "ratio"`` records
(results.jsonl, summary.csv), which the gate compares across runs (`direction: "higher"`, noise from
`noise_pct`); then `render_summary` and `render_verdicts` print 80-column rich tables.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from harness.results import is_failure
from harness.revalidate.records import clean_rounds
from harness.revalidate.visit_noise import PooledNoise, compare_pooled, pooled_noise
from harness.tables import fitted_table

# (effect name, case field varied, reference value, variant values)
EFFECTS: tuple[tuple[str, str, Any, tuple[Any, ...]], ...] = (
    ("donation", "donate", False, (True,)),
    ("kv-int8", "kv_dtype", "bf16", ("int8",)),
    ("ple", "ple", "bf16", ("int8", "int4")),
    ("paged", "kv_layout", "contiguous", ("paged",)),
    ("ring", "sliding_kv", "full", ("ring",)),
)
_ABSENT = {"kv_layout": "contiguous", "sliding_kv": "full"}  # a point that leaves the field out has this value
_SHAPE_FIELDS = ("batch", "ctx")


def _group_label(case: dict[str, Any], varied: str, with_shape: bool) -> str:
    """Short label of the fields held fixed, e.g. "ple-bf16/kv-int8/donated" (+ "/b4/ctx8192")."""
    parts = []
    if varied != "ple":
        parts.append(f"ple-{case.get('ple')}")
    if varied != "kv_dtype":
        parts.append(f"kv-{case.get('kv_dtype')}")
    if varied != "donate":
        parts.append("donated" if case.get("donate") else "copying")
    if varied != "kv_layout" and case.get("kv_layout") == "paged":
        parts.append("paged")
    if varied != "sliding_kv" and case.get("sliding_kv") == "ring":
        parts.append("ring")
    if with_shape:
        parts.append(f"b{case.get('batch')}/ctx{case.get('ctx')}")
    return "/".join(parts)


def _pairs(ok: Sequence[dict[str, Any]]) -> list[tuple[str, str, Any, Any, dict[str, Any], dict[str, Any]]]:
    """(effect, varied, reference value, variant value, reference record, variant record)."""
    names = {r["name"] for r in ok}
    aa = sorted(n[:-2] for n in names if n.startswith("aa") and n.endswith("-A") and n[:-2] + "-B" in names)
    if aa:
        by = {r["name"]: r for r in ok}
        return [("aa", "", "A", "B", by[f"{p}-A"], by[f"{p}-B"]) for p in aa]
    out = []
    for effect, varied, ref_value, variants in EFFECTS:
        for ref in ok:
            if ref["config"].get(varied, _ABSENT.get(varied)) != ref_value:
                continue
            fixed = {k: v for k, v in ref["config"].items() if k != varied}
            for var_value in variants:
                match = [
                    r
                    for r in ok
                    if r["config"].get(varied, _ABSENT.get(varied)) == var_value
                    and {k: v for k, v in r["config"].items() if k != varied} == fixed
                ]
                if match:
                    out.append((effect, varied, ref_value, var_value, ref, match[0]))
    return out


def _quiet_or_all(ok: Sequence[dict[str, Any]]) -> tuple[dict[str, list[list[float]]], bool]:
    """Every record's samples by round: only those taken while the host was quiet when every round of
    every record keeps MIN_CLEAN_PER_ROUND of them (like is compared with like), else all of them;
    and whether any were left out."""
    cleaned = {r["name"]: clean_rounds(r) for r in ok}
    if not cleaned or any(c is None for c in cleaned.values()):
        return {r["name"]: r["step_ms_by_round"] for r in ok}, False
    return {n: c[0] for n, c in cleaned.items() if c is not None}, any(c[1] for c in cleaned.values() if c)


def run_noise(measurements: Sequence[dict[str, Any]]) -> PooledNoise | None:
    """The visit-to-visit noise pooled over the run's successful points (harness/revalidate/visit_noise.py), each
    shared-weights visit group counted as one process, on the quiet samples where every round keeps
    enough, with each visit's memory bandwidth probe readings (all of them: the probe reads the host,
    not the samples) as its covariate where every point has them; None when fewer than two processes
    share two or more rounds."""
    ok = [r for r in measurements if r.get("kind") == "revalidate" and not is_failure(r)]
    rounds, _ = _quiet_or_all(ok)
    groups = {r["name"]: r["visit_group"] for r in ok if r.get("visit_group") is not None}
    probe = {r["name"]: r["host_mem_gbs_by_round"] for r in ok if r.get("host_mem_gbs_by_round")}
    return pooled_noise(rounds, groups, probe if len(probe) == len(ok) else None)


def ratio_records(
    measurements: Sequence[dict[str, Any]],
    *,
    run_id: str,
    base_env: dict[str, Any],
    floor: float = 0.02,
    seed: int = 0,
) -> list[dict[str, Any]]:
    """Within-run `ratio` records for every effect whose two points both succeeded."""
    from harness.results import make_record
    from harness.revalidate.compare import compare_rounds
    from harness.run import record_env
    from harness.stats import verdict

    ok = [r for r in measurements if r.get("kind") == "revalidate" and not is_failure(r)]
    with_shape = len({(r["batch"], r["ctx"]) for r in ok}) > 1
    noise = run_noise(ok)
    pooled_cleaned = _quiet_or_all(ok)[1]
    out = []
    for effect, varied, ref_value, var_value, ref, var in _pairs(ok):
        same_process = ref.get("visit_group") is not None and ref.get("visit_group") == var.get("visit_group")
        if noise is not None and not same_process and {ref["name"], var["name"]} <= set(noise.visit_logs):
            cmp, cleaned = compare_pooled(ref["name"], var["name"], noise, floor=floor), pooled_cleaned
            method = "pooled+probe" if noise.covariates else "pooled"
        else:
            ref_clean, var_clean = clean_rounds(ref), clean_rounds(var)
            if ref_clean is not None and var_clean is not None:
                (ref_rounds, ref_dropped), (var_rounds, var_dropped) = ref_clean, var_clean
                cleaned = ref_dropped + var_dropped > 0
            else:  # too few quiet samples on one side: compare like with like, all samples
                ref_rounds, var_rounds, cleaned = ref["step_ms_by_round"], var["step_ms_by_round"], False
            cmp = compare_rounds(ref_rounds, var_rounds, floor=floor, seed=seed, paired_samples=same_process)
            method = "bootstrap"
        noise_pct = max(ref["step_rel_iqr_pct"], var["step_rel_iqr_pct"])
        rule = verdict(ref["step_ms_median"] / var["step_ms_median"], noise_pct / 100.0)
        if effect == "aa":
            name, fixed = f"aa/{ref['name'][2:-2]}", {}
        else:
            group = _group_label(ref["config"], varied, with_shape)
            name = f"{effect}/{group}" if effect != "ple" else f"ple-{var_value}/{group}"
            fixed = {k: v for k, v in ref["config"].items() if k != varied}
        config = {"effect": effect, "varied": varied, "reference": ref_value, "variant": var_value, **fixed}
        env = record_env(base_env, config, ref["env"])  # the device that measured both sides
        out.append(
            make_record(
                "ratio",
                name,
                run_id=run_id,
                env=env,
                config=config,
                effect=effect,
                numerator=ref["name"],
                denominator=var["name"],
                numerator_ms=ref["step_ms_median"],
                denominator_ms=var["step_ms_median"],
                ratio=cmp.ratio,
                ci95_lo=cmp.ci_lo,
                ci95_hi=cmp.ci_hi,
                ci_method=method,
                floor_pct=100.0 * floor,
                rounds=cmp.rounds,
                rounds_to_settle=cmp.rounds_to_settle,
                contaminated_excluded=cleaned,
                same_process=same_process,
                verdict=cmp.word,
                noise_pct=noise_pct,
                rule_2iqr=rule.label,
                direction="higher",
            )
        )
    return out


_EFFECT_TITLES = {
    "donation": "donation: copying ÷ donated step time",
    "kv-int8": "int8 vs bf16 KV: bf16 ÷ int8 step time",
    "ple": "PLE format: bf16 ÷ quantized PLE step time",
    "paged": "paged vs contiguous KV: contiguous ÷ paged step time",
    "aa": "A/A: identical configurations (any faster/slower is a false positive)",
}
MEMORY_BOUND_CORR = 0.3  # from here the summary says the bandwidth drift moved the step times
_STYLE = {"faster": "bold green", "slower": "bold red", "equivalent": "cyan", "inconclusive": "yellow"}


def _verdict_text(r: dict[str, Any]) -> str:
    style = _STYLE.get(r["verdict"], "")
    more = r.get("rounds_to_settle")
    extra = f" (+{more}r)" if r["verdict"] == "inconclusive" and more else ""
    return f"[{style}]{r['verdict']}[/{style}]{extra}"


def render_verdicts(ratios: Sequence[dict[str, Any]], summary: dict[str, Any] | None, console: Any) -> None:
    """One 80-column table per effect: comparison, ratio, 95% CI, the 2×IQR rule, verdict; then the
    host and A/A lines of the run summary."""

    for effect, title in _EFFECT_TITLES.items():
        rows = [r for r in ratios if r["effect"] == effect]
        if not rows:
            continue
        cells = [
            [
                r["name"] if effect == "ple" else r["name"].split("/", 1)[1],
                f"{r['ratio']:.3f}",
                f"{r['ci95_lo']:.3f}–{r['ci95_hi']:.3f}",
                "real" if r["rule_2iqr"] == "real" else "noise",
                _verdict_text(r),
            ]
            for r in rows
        ]
        console.print(fitted_table(title, ["comparison", "ratio", "95% CI", "2×IQR", "verdict"], cells))
    if ratios:
        floor = ratios[0]["floor_pct"]
        console.print(
            f"[dim]ratio > 1: the variant is faster. faster/slower: CI excludes 1 and |ratio − 1| > "
            f"{floor:g}%; equivalent: CI within ±{floor:g}%; (+Nr): more rounds likely to settle it. "
            "2×IQR: the reference article's rule.[/dim]"
        )
    if summary:
        render_host(summary, console)


def render_host(summary: dict[str, Any], console: Any) -> None:
    """Whether the host was quiet, the CI width, and the A/A false-positive rate where measured."""
    n, bad = summary.get("samples_total", 0), summary.get("contaminated_samples", 0)
    thr = summary.get("contaminated_threshold_cores")
    steal = summary.get("contaminated_threshold_steal")
    busy = f"other processes used > {thr} cores" + (
        f" or the hypervisor stole ≥ {100 * steal:g}% of the CPUs" if steal is not None else ""
    )
    if summary.get("host_quiet"):
        console.print(f"host quiet: {bad} of {n} samples taken while {busy}")
    elif summary.get("host_cpu_quiet", False):
        console.print(
            f"[yellow]host NOT quiet: only {bad} of {n} samples taken while {busy}, but the memory "
            f"bandwidth wandered {summary['host_mem_rel_iqr_pct']:.1f}% (IQR; steady is ≤ "
            f"{summary['host_mem_steady_threshold_pct']:g}%)[/yellow]"
        )
    else:
        console.print(
            f"[yellow]host NOT quiet: {bad} of {n} samples taken while {busy} "
            "(flagged; left out of the verdicts where every round kept enough)[/yellow]"
        )
    hw = summary.get("median_ci95_half_width_pct")
    if hw is not None:
        console.print(f"median 95% CI half-width of a configuration's median: ±{hw:.2f}%")
    if "visit_noise_pct" in summary:
        console.print(power_line(summary))
    if "host_mem_gbs_median" in summary:
        r = summary["step_mem_corr"]
        console.print(
            f"memory bandwidth probe: median {summary['host_mem_gbs_median']:.1f} GB/s, IQR "
            f"{summary['host_mem_rel_iqr_pct']:.1f}% of it; step times follow it with r = {r:.2f}"
            + (
                " (the neighbours' memory traffic, which no CPU counter shows, moves the step times)"
                if r >= MEMORY_BOUND_CORR
                else ""
            )
        )
    if "aa_comparisons" in summary:
        console.print(
            f"A/A: {summary['aa_false_positives']} of {summary['aa_comparisons']} comparisons called "
            f"faster/slower (false-positive rate {100 * summary['aa_false_positive_rate']:.1f}%); CI alone "
            f"excluded 1 in {summary['aa_ci_excludes_one']}; the 2×IQR rule said real in "
            f"{summary['aa_rule_2iqr_real']}"
        )


def render_summary(measurements: Sequence[dict[str, Any]], console: Any) -> None:
    """Per-point 80-column table: median, its 95% CI half-width, rel IQR, tok/s, flagged samples."""

    cells = [
        [r["name"], f"[red]{r['failure']['kind']}[/red]", "", "", "", ""]
        if is_failure(r)
        else [
            r["name"],
            f"{r['step_ms_median']:.2f}",
            f"{r['step_ci95_half_width_pct']:.2f}",
            f"{r['step_rel_iqr_pct']:.1f}",
            f"{r['agg_tok_per_s']:.1f}",
            f"{r['contaminated_samples']}/{r['n_samples']}",
        ]
        for r in measurements
    ]
    header = ["configuration", "median", "±CI%", "IQR%", "tok/s", "busy"]
    console.print(fitted_table("decode step per configuration (ms)", header, cells))
    console.print(
        "[dim]±CI%: half-width of the median's 95% CI (from the visit-to-visit noise pooled over the run's "
        "configurations; a bootstrap over rounds and samples where nothing pools); busy: samples "
        "taken while other processes used the CPU. Full names and every field: summary.csv[/dim]"
    )


def _rounds_text(rounds: int | None, round_s: float | None) -> str:
    if rounds is None:
        return "more rounds than a run can take"
    if not round_s:
        return f"≈ {rounds} rounds"
    minutes = rounds * round_s / 60.0
    return f"≈ {rounds} rounds (~{minutes:.0f} min at this run's pace)"


def power_line(summary: dict[str, Any]) -> str:
    """What the run's pooled visit noise lets it see (harness/revalidate/visit_noise.py `Power`), in one line."""
    effect, target = summary["detectable_effect_pct"], summary["target_effect_pct"]
    rounds_done = summary.get("rounds_done") or summary["config"]["rounds"]
    if summary.get("probe_used"):
        probe = (
            f" after the memory bandwidth probe took out its share (±{summary['visit_noise_before_probe_pct']:.1f}% "
            f"before; slope {summary['probe_slope']:+.2f})"
        )
    elif "probe_used" in summary:
        probe = (
            f" (the configurations moved the bandwidth probe, p = {summary['probe_config_effect_p']:.3f}: "
            "not used as a covariate)"
        )
    else:
        probe = ""
    return (
        f"visit-to-visit noise ±{summary['visit_noise_pct']:.1f}%{probe}, pooled over the configurations "
        f"({summary['visit_noise_df']} df): {rounds_done} rounds call a speedup faster with 80% probability "
        f"from {1 + effect / 100:.2f}×; {1 + target / 100:.2f}× would need "
        f"{_rounds_text(summary.get('rounds_for_target_effect'), summary.get('round_wall_s'))}, a "
        f"±{summary['target_median_half_width_pct']:g}% median CI "
        f"{_rounds_text(summary.get('rounds_for_target_median'), summary.get('round_wall_s'))}"
    )
