"""`g4bench gate`: compare a run against a committed baseline run, metric by metric.

A metric *regresses* only when all three hold:

1. it moved the wrong way (its `direction`: step time up, tok/s or a speedup ratio down);
2. the move is **real**: where both runs carry a 95% CI for the metric (runs in interleaved rounds:
   a ratio's ``ci95_lo``/``ci95_hi``, a step's ``step_ms_ci95_lo``/``_hi``), the two intervals do
   not overlap; otherwise by the reference's noise rule ``|current / baseline − 1| > 2 · noise``,
   noise being the larger of the two runs' relative IQRs for that metric (harness/stats.py);
3. the move is beyond the `floor` (default 5%), so a real but negligible change does not fail CI.

Exit codes (set by the command): 0 no regression, 1 at least one regression (or a configuration
that succeeded in the baseline now fails), 2 unusable input (`GateError`: missing or malformed run
folders, no configuration in common, configurations measured with different settings).

Data flow: `read_records` for both folders → match records by (kind, name) → for each matched pair
and each `MetricSpec` of its kind → `GateRow` → `GateReport` (rows, regressions) → `render_report`.

Which metrics: `METRICS` holds the defaults (revalidate: step_ms_median lower-is-better and
agg_tok_per_s higher-is-better; ratio: the within-run speedup, higher-is-better). Other record
kinds (serve-load, capacity) add theirs with `register_metric`, or a record can carry
``gate_metrics: {field: {direction, noise_pct_field}}`` to say so itself. `ratios_only` gates just
the within-run ratios, so the speed of the CI machine cancels out.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.results import is_failure

DEFAULT_FLOOR = 0.05


class GateError(ValueError):
    """The runs cannot be compared (the command exits 2)."""


@dataclass(frozen=True)
class MetricSpec:
    """A gated metric: record kind, field, which direction is better, and the field holding its
    noise as a percentage (None = treat as noiseless, so only the floor protects it)."""

    kind: str
    field: str
    direction: str  # "lower" | "higher"
    noise_pct_field: str | None = None
    ci_fields: tuple[str, str] | None = None  # (lo, hi) of the metric's 95% CI, where records have it


METRICS: list[MetricSpec] = [
    MetricSpec("revalidate", "step_ms_median", "lower", "step_rel_iqr_pct", ("step_ms_ci95_lo", "step_ms_ci95_hi")),
    MetricSpec("revalidate", "agg_tok_per_s", "higher", "step_rel_iqr_pct"),
    MetricSpec("ratio", "ratio", "higher", "noise_pct", ("ci95_lo", "ci95_hi")),
]


def register_metric(spec: MetricSpec) -> None:
    """Add a gated metric (e.g. serve-load's ttft_ms_p50, lower is better)."""
    if spec.direction not in ("lower", "higher"):
        raise ValueError(f"direction must be 'lower' or 'higher', got {spec.direction!r}")
    if spec not in METRICS:
        METRICS.append(spec)


@dataclass(frozen=True)
class GateRow:
    """One metric of one configuration: values, ratio current/baseline, noise (fraction), status."""

    kind: str
    name: str
    metric: str
    direction: str
    baseline: float | None
    current: float | None
    ratio: float | None
    noise: float | None
    status: str  # "regression" | "now fails" | "improved" | "within noise" | "below floor" | "unchanged" | "baseline failed"
    regression: bool


@dataclass
class GateReport:
    """All rows plus configurations present in only one of the runs."""

    floor: float
    rows: list[GateRow] = field(default_factory=list)
    only_in_baseline: list[str] = field(default_factory=list)
    only_in_current: list[str] = field(default_factory=list)

    @property
    def regressions(self) -> list[GateRow]:
        """Rows that fail the gate."""
        return [r for r in self.rows if r.regression]


def parse_floor(text: str | float) -> float:
    """ "5%" → 0.05, "0.05" → 0.05, "5" → 0.05 (a bare number ≥ 1 is read as percent)."""
    raw = str(text).strip()
    try:
        value = float(raw[:-1]) / 100 if raw.endswith("%") else float(raw)
    except ValueError as exc:
        raise GateError(f"floor must look like '5%' or '0.05', got {text!r}") from exc
    if not raw.endswith("%") and value >= 1:
        value /= 100
    if not 0 <= value < 1:
        raise GateError(f"floor must be between 0% and 100%, got {text!r}")
    return value


def _specs_for(record: dict[str, Any]) -> list[MetricSpec]:
    """The metrics to gate for a record: its own `gate_metrics`, else the registry for its kind."""
    own = record.get("gate_metrics")
    if own:
        return [
            MetricSpec(record["kind"], f, d["direction"], d.get("noise_pct_field")) for f, d in own.items()
        ]
    return [m for m in METRICS if m.kind == record["kind"]]


def _number(record: dict[str, Any], key: str | None) -> float | None:
    value = record.get(key) if key else None
    return float(value) if isinstance(value, int | float) and math.isfinite(value) else None


def compare_metric(
    spec: MetricSpec, base: dict[str, Any], cur: dict[str, Any], floor: float
) -> GateRow | None:
    """Judge one metric of a matched pair of records (None when neither record has it)."""
    from harness.stats import verdict

    b, c = _number(base, spec.field), _number(cur, spec.field)
    if b is None and c is None:
        return None
    if b is None or c is None or b < 0 or c < 0:
        raise GateError(f"{spec.kind} {base['name']!r}: {spec.field} missing or negative ({b} vs {c})")
    if b == 0 or c == 0:
        # a count-like metric can be 0 (no request met the SLO): no ratio, but a direction
        if b == c:
            status = "unchanged"
        else:
            worse = (c > b) if spec.direction == "lower" else (c < b)
            status = "regression" if worse else "improved"
        return GateRow(spec.kind, base["name"], spec.field, spec.direction, b, c, None, None, status,
                       status == "regression")  # fmt: skip
    noises = [
        n / 100
        for n in (_number(base, spec.noise_pct_field), _number(cur, spec.noise_pct_field))
        if n is not None
    ]
    noise = max(noises, default=0.0)
    v = verdict(c / b, noise)
    real = v.real
    if spec.ci_fields is not None:
        lo, hi = spec.ci_fields
        cis = [_number(r, f) for r in (base, cur) for f in (lo, hi)]
        if None not in cis:
            b_lo, b_hi, c_lo, c_hi = (float(x) for x in cis)  # type: ignore[arg-type]
            real = c_lo > b_hi or c_hi < b_lo  # the two 95% intervals do not overlap
    worse = v.ratio > 1 if spec.direction == "lower" else v.ratio < 1
    beyond_floor = abs(v.ratio - 1) > floor
    if v.ratio == 1:
        status = "unchanged"
    elif not real:
        status = "within noise"
    elif not worse:
        status = "improved"
    elif not beyond_floor:
        status = "below floor"
    else:
        status = "regression"
    return GateRow(
        spec.kind,
        base["name"],
        spec.field,
        spec.direction,
        b,
        c,
        v.ratio,
        noise,
        status,
        status == "regression",
    )


def _index(records: Sequence[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    out: dict[tuple[str, str], dict[str, Any]] = {}
    for r in records:
        key = (r["kind"], r["name"])
        if key in out:
            raise GateError(f"duplicate record {key} in one run")
        out[key] = r
    return out


def gate_records(
    baseline: Sequence[dict[str, Any]],
    current: Sequence[dict[str, Any]],
    *,
    floor: float = DEFAULT_FLOOR,
    ratios_only: bool = False,
) -> GateReport:
    """Compare two runs' records; see the module docstring for the rule.

    With `ratios_only`, metrics are compared for `ratio` records only, but a configuration that
    succeeded in the baseline and fails in the run is a regression either way (its ratios are gone).
    """
    base_idx, cur_idx = _index(baseline), _index(current)
    gated = [k for k in base_idx if k in cur_idx and (not ratios_only or k[0] == "ratio")]
    report = GateReport(
        floor=floor,
        only_in_baseline=[f"{k}/{n}" for k, n in base_idx if (k, n) not in cur_idx],
        only_in_current=[f"{k}/{n}" for k, n in cur_idx if (k, n) not in base_idx],
    )
    if not gated:
        what = "ratio records" if ratios_only else "configurations"
        raise GateError(f"no {what} in common between the baseline and the run")
    common = [k for k in base_idx if k in cur_idx]
    mismatched = [k for k in common if base_idx[k].get("config") != cur_idx[k].get("config")]
    if mismatched:
        b, c = base_idx[mismatched[0]].get("config") or {}, cur_idx[mismatched[0]].get("config") or {}
        diff = {key: (b.get(key), c.get(key)) for key in sorted(set(b) | set(c)) if b.get(key) != c.get(key)}
        raise GateError(
            f"{len(mismatched)} configuration(s) were measured with different settings, e.g. {diff} (baseline, run)"
        )
    for key in common:
        base, cur = base_idx[key], cur_idx[key]
        if is_failure(cur) and not is_failure(base):
            detail = f"now fails: {cur['failure']['kind']}"
            report.rows.append(GateRow(key[0], key[1], "-", "-", None, None, None, None, detail, True))
        elif key not in gated:
            continue
        elif is_failure(base):
            report.rows.append(
                GateRow(key[0], key[1], "-", "-", None, None, None, None, "baseline failed", False)
            )
        elif not is_failure(cur):
            for spec in _specs_for(base):
                row = compare_metric(spec, base, cur, floor)
                if row is not None:
                    report.rows.append(row)
    return report


def gate_runs(
    run_dir: Path, baseline_dir: Path, *, floor: float = DEFAULT_FLOOR, ratios_only: bool = False
) -> GateReport:
    """Read both run folders (GateError if unusable) and compare them with `gate_records`."""
    from harness.results import RunError, read_records

    try:
        baseline = read_records(Path(baseline_dir))
        current = read_records(Path(run_dir))
    except RunError as exc:
        raise GateError(str(exc)) from exc
    return gate_records(baseline, current, floor=floor, ratios_only=ratios_only)


def render_report(report: GateReport, console: Any) -> None:
    """The rich table: metric, baseline, current, ratio, noise, verdict; then the outcome line."""
    from harness.tables import fitted_table

    styles = {
        "regression": "bold red",
        "improved": "green",
        "below floor": "yellow",
        "baseline failed": "dim",
    }
    cells = []
    for r in report.rows:
        style = "bold red" if r.regression else styles.get(r.status, "")
        cells.append([
            f"{r.kind}/{r.name}",
            f"{r.metric} ({r.direction} is better)",
            "" if r.baseline is None else f"{r.baseline:.4g}",
            "" if r.current is None else f"{r.current:.4g}",
            "" if r.ratio is None else f"{r.ratio:.3f}",
            "" if r.noise is None else f"±{2 * r.noise:.1%}",
            f"[{style}]{r.status}[/{style}]" if style else r.status,
        ])  # fmt: skip
    header = ["configuration", "metric", "baseline", "current", "ratio", "2×noise", "verdict"]
    title = f"gate (floor {report.floor:.0%}; real = |ratio − 1| > 2 × noise)"
    table = fitted_table(title, header, cells, folding=2)
    console.print(table)
    for label, names in (
        ("only in baseline", report.only_in_baseline),
        ("only in run", report.only_in_current),
    ):
        if names:
            console.print(f"[dim]{label} (not compared): {', '.join(names)}[/dim]")
    if report.regressions:
        console.print(f"[bold red]{len(report.regressions)} regression(s)[/bold red]")
    else:
        console.print("[green]no regression[/green]")
