"""Within-run verdicts: pair configurations that differ in one field, and judge each ratio.

A revalidate run measures a grid (PLE × KV dtype × donation). The questions worth asking of it
are effects: does donation speed the step up, does an int8 KV cache, does a quantized PLE table?
Each is answered by pairing the two configurations that differ only in that field and forming

    ratio = median(reference) / median(variant)          (> 1: the variant is faster)
    noise = max(rel IQR of reference, rel IQR of variant)
    verdict = "real" iff |ratio − 1| > 2 · noise, else "within noise"   (harness/stats.py)

Data flow: `ratio_records(measurements)` → `kind: "ratio"` records (results.jsonl, summary.csv),
which the gate compares across runs (`direction: "higher"`: a shrinking speedup regresses) so CI
machine speed cancels out; `render_verdicts` prints one rich table per effect and
`render_summary` the per-configuration table that precedes them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

# (effect name, case field varied, reference value, variant values)
EFFECTS: tuple[tuple[str, str, Any, tuple[Any, ...]], ...] = (
    ("donation", "donate", False, (True,)),
    ("kv-int8", "kv_dtype", "bf16", ("int8",)),
    ("ple", "ple", "bf16", ("int8", "int4")),
)


def _group_label(case: dict[str, Any], varied: str) -> str:
    """Short label of the fields held fixed in a comparison, e.g. "ple-bf16/kv-int8/donated"."""
    parts = []
    if varied != "ple":
        parts.append(f"ple-{case.get('ple')}")
    if varied != "kv_dtype":
        parts.append(f"kv-{case.get('kv_dtype')}")
    if varied != "donate":
        parts.append("donated" if case.get("donate") else "copying")
    return "/".join(parts)


def ratio_records(
    measurements: Sequence[dict[str, Any]], *, run_id: str, base_env: dict[str, Any]
) -> list[dict[str, Any]]:
    """Within-run `ratio` records for every effect whose two configurations both succeeded.

    For each effect in `EFFECTS`, configurations are paired when all their other case fields are
    equal; ratio = reference median / variant median, noise = the larger relative IQR.
    """
    from harness.env import config_hash, utc_now
    from harness.results import make_record
    from harness.stats import verdict

    ok = [r for r in measurements if r.get("kind") == "revalidate" and "failure" not in r]
    out = []
    for effect, varied, ref_value, variants in EFFECTS:
        for ref in ok:
            if ref["config"].get(varied) != ref_value:
                continue
            fixed = {k: v for k, v in ref["config"].items() if k != varied}
            for var_value in variants:
                match = [
                    r
                    for r in ok
                    if r["config"].get(varied) == var_value
                    and {k: v for k, v in r["config"].items() if k != varied} == fixed
                ]
                if not match:
                    continue
                var = match[0]
                noise_pct = max(ref["step_rel_iqr_pct"], var["step_rel_iqr_pct"])
                v = verdict(ref["step_ms_median"] / var["step_ms_median"], noise_pct / 100.0)
                group = _group_label(ref["config"], varied)
                name = f"{effect}/{group}" if effect != "ple" else f"ple-{var_value}/{group}"
                config = {
                    "effect": effect,
                    "varied": varied,
                    "reference": ref_value,
                    "variant": var_value,
                    **fixed,
                }
                env = {**base_env, "config_hash": config_hash(config), "timestamp_utc": utc_now()}
                env.update({k: ref["env"].get(k) for k in ("platform", "device_kind", "device_count")})
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
                        ratio=v.ratio,
                        noise_pct=noise_pct,
                        verdict=v.label,
                        direction="higher",
                    )
                )
    return out


_EFFECT_TITLES = {
    "donation": "donation effect: copying ÷ donated step time, per (PLE, KV)",
    "kv-int8": "int8 vs bf16 KV: bf16 ÷ int8 step time, per (PLE, donation)",
    "ple": "PLE effect: PLE bf16 ÷ quantized PLE step time, per (KV, donation)",
}


def render_verdicts(ratios: Sequence[dict[str, Any]], console: Any) -> None:
    """One table per effect: ratio (> 1 = the variant is faster), noise, verdict."""
    from rich.table import Table

    for effect, title in _EFFECT_TITLES.items():
        rows = [r for r in ratios if r["effect"] == effect]
        if not rows:
            continue
        table = Table(title=title, title_justify="left")
        for col in ("comparison", "numerator ms", "denominator ms", "ratio", "2×noise", "verdict"):
            table.add_column(col, justify="left" if col in ("comparison", "verdict") else "right")
        for r in rows:
            style = "bold green" if r["verdict"] == "real" else "yellow"
            table.add_row(
                r["name"],
                f"{r['numerator_ms']:.3f}",
                f"{r['denominator_ms']:.3f}",
                f"{r['ratio']:.3f}×",
                f"±{2 * r['noise_pct']:.2f}%",
                f"[{style}]{r['verdict']}[/{style}]",
            )
        console.print(table)
    console.print("[dim]real = |ratio − 1| > 2 × the larger relative IQR of the two configurations[/dim]")


def render_summary(measurements: Sequence[dict[str, Any]], console: Any) -> None:
    """Per-configuration table: median, min, max, IQR, rel IQR, tok/s, weight and KV bytes, compile."""
    from rich.table import Table

    table = Table(title="decode step per configuration (ms)", title_justify="left")
    for col in (
        "config",
        "median",
        "min",
        "max",
        "IQR",
        "rel IQR %",
        "agg tok/s",
        "weights GB",
        "KV GB",
        "compile s",
    ):
        table.add_column(col, justify="left" if col == "config" else "right")
    for r in measurements:
        if "failure" in r:
            table.add_row(r["name"], f"[red]{r['failure']['kind']}[/red]", *[""] * 8)
            continue
        table.add_row(
            r["name"],
            f"{r['step_ms_median']:.3f}",
            f"{r['step_ms_min']:.3f}",
            f"{r['step_ms_max']:.3f}",
            f"{r['step_ms_iqr']:.3f}",
            f"{r['step_rel_iqr_pct']:.2f}",
            f"{r['agg_tok_per_s']:.1f}",
            f"{r['weights_bytes'] / 1e9:.3f}",
            f"{r['kv_bytes'] / 1e9:.3f}",
            f"{r['compile_s']:.1f}",
        )
    console.print(table)
