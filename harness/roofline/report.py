"""Rich tables for `g4bench roofline` (stderr): what the run measured and how to read it.

Data flow: harness/roofline/main.py `run_roofline` builds the records and hands the outcome to `render`,
which prints, in order: the calibration kernels (the best one is the calibrated bandwidth), the
decode step per shape (byte model, XLA's figure beside it with the ratio, achieved GB/s and the
fraction of calibrated), the byte model of the headline shape by part, the marginal KV bandwidth
per batch with every adjacent pair and whether the 15% rule admitted it, and — when measured — the
breakdown of the step into parts timed alone, which names what holds the fraction down.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from harness.results import is_failure

GOAL_FRACTION = 0.5  # issue 3: the E2B decode step should reach half the calibrated bandwidth


def _gb(x: float | None) -> str:
    return "—" if x is None else f"{x / 1e9:.3f}"


def render_calibration(rec: dict[str, Any], console: Any) -> None:
    from rich.table import Table

    if is_failure(rec):
        console.print(f"[red]calibration failed: {rec['failure']['kind']} — {rec['failure']['detail']}[/red]")
        return
    table = Table(
        title="streaming bandwidth calibration (f32 buffers; median of repeated calls)", title_justify="left"
    )
    for col in ("kernel", "buffer MiB", "median GB/s", "best GB/s", "rel IQR %"):
        table.add_column(col, justify="left" if col == "kernel" else "right")
    for k in rec["calibration_kernels"]:
        chosen = (
            k["kernel"] == rec["calibration_kernel"] and k["buffer_bytes"] == rec["calibration_buffer_bytes"]
        )
        style = "bold green" if chosen else ""
        table.add_row(
            f"[{style}]{k['kernel']}[/{style}]" if style else k["kernel"],
            f"{k['buffer_bytes'] / 2**20:.0f}",
            f"{k['gb_per_s_median']:.1f}",
            f"{k['gb_per_s_best']:.1f}",
            f"{k['rel_iqr_pct']:.1f}",
        )
    console.print(table)
    console.print(
        f"calibrated bandwidth: [bold]{rec['calibrated_gb_per_s']:.1f} GB/s[/bold] "
        f"({rec['calibration_kernel']} over {rec['calibration_buffer_bytes'] / 2**20:.0f} MiB: the best reduction's median, "
        "as the step mostly reads; copy counts read + write and is shown for reference only)"
    )


def render_steps(steps: list[dict[str, Any]], console: Any) -> None:
    from rich.table import Table

    table = Table(
        title="decode step against the roofline (one fresh process per shape)", title_justify="left"
    )
    cols = (
        "shape",
        "median ms",
        "rel IQR %",
        "model GB",
        "XLA GB",
        "XLA/model",
        "achieved GB/s",
        "calibrated",
        "fraction",
    )
    for col in cols:
        table.add_column(col, justify="left" if col == "shape" else "right")
    for r in steps:
        if is_failure(r):
            table.add_row(r["name"], f"[red]{r['failure']['kind']}[/red]", *[""] * (len(cols) - 2))
            continue
        ratio = r.get("xla_over_model_bytes")
        frac = r.get("fraction_of_calibrated")
        style = "bold green" if frac is not None and frac >= GOAL_FRACTION else "bold yellow"
        table.add_row(
            r["name"],
            f"{r['step_ms_median']:.1f}",
            f"{r['step_rel_iqr_pct']:.1f}",
            _gb(r["model_bytes"]),
            _gb(r.get("xla_bytes_accessed")),
            "—" if ratio is None else f"{ratio:.1f}×",
            f"{r['achieved_gb_per_s']:.1f}",
            "—" if r.get("calibrated_gb_per_s") is None else f"{r['calibrated_gb_per_s']:.1f}",
            "—" if frac is None else f"[{style}]{frac:.2f}[/{style}]",
        )
    console.print(table)
    console.print(
        "[dim]model GB = g4bench/model/costs.py (the roofline); XLA GB = compiled.cost_analysis()['bytes accessed'] "
        "over the whole step (unrolled over layers, no scan), shown for comparison only — on the CPU it counts "
        "gathered tables and converts in full. achieved = model bytes ÷ median step time.[/dim]"
    )


def render_parts(rec: dict[str, Any], console: Any) -> None:
    from rich.table import Table

    table = Table(
        title=f"byte model of {rec['name']} (what the engine's step reads and writes)", title_justify="left"
    )
    for col in ("part", "GB", "share"):
        table.add_column(col, justify="left" if col == "part" else "right")
    total = rec["model_bytes"]
    for part, nbytes in rec["model_bytes_by_part"].items():
        table.add_row(part, _gb(nbytes), f"{nbytes / total:.1%}")
    table.add_row("[bold]total[/bold]", f"[bold]{_gb(total)}[/bold]", "100%")
    console.print(table)
    console.print(
        f"[dim]FLOPs {rec['model_flops'] / 1e9:.1f} G ({rec['flop_per_byte']:.2f} FLOP/byte). KV read counts every "
        "attention layer: shared layers re-read their source layer's cache, and full-length sliding layers read "
        "the whole kv_len slice and mask it.[/dim]"
    )


def render_slopes(slopes: list[dict[str, Any]], console: Any) -> None:
    from rich.table import Table

    for rec in slopes:
        table = Table(
            title=f"marginal KV bandwidth at batch {rec['batch']} (pairs with step time rising > {rec['min_rise_pct']:.0f}%)",
            title_justify="left",
        )
        for col in ("ctx", "time rise %", "used", "Δ KV bytes / Δ time GB/s"):
            table.add_column(col, justify="left" if col == "ctx" else "right")
        for p in rec["pairs"]:
            table.add_row(
                f"{p['ctx_from']} → {p['ctx_to']}",
                f"{p['time_rise_pct']:+.1f}",
                "yes" if p["used"] else "[dim]no[/dim]",
                "—" if p["gb_per_s"] is None else f"{p['gb_per_s']:.1f}",
            )
        console.print(table)
        if rec["marginal_kv_gb_per_s"] is None:
            console.print(f"[yellow]no marginal KV bandwidth: {rec['slope_note']}[/yellow]")
        else:
            console.print(
                f"marginal KV bandwidth [bold]{rec['marginal_kv_gb_per_s']:.1f} GB/s[/bold], intercept (fixed cost) "
                f"[bold]{rec['intercept_ms']:.1f} ms[/bold] ({rec['slope_note']})"
            )


def render_breakdown(rec: dict[str, Any], calibrated: float | None, console: Any) -> None:
    from rich.table import Table

    if is_failure(rec):
        console.print(f"[red]breakdown failed: {rec['failure']['kind']} — {rec['failure']['detail']}[/red]")
        return
    step = rec.get("step_ms_median")
    table = Table(
        title=f"where the step's time goes ({rec['name']}: parts timed alone × times per step)",
        title_justify="left",
    )
    for col in ("part", "× per step", "ms each", "ms per step", "share of step", "GB/s", "of calibrated"):
        table.add_column(col, justify="left" if col == "part" else "right")
    for p in rec["parts"]:
        frac = p.get("fraction_of_calibrated")
        table.add_row(
            p["part"],
            str(p["count"]),
            f"{p['ms_each']:.2f}",
            f"{p['ms_total']:.1f}",
            "—" if not step else f"{p['ms_total'] / step:.0%}",
            f"{p['gb_per_s']:.1f}",
            "—" if frac is None else f"{frac:.2f}",
        )
    if step:
        table.add_row(
            "rest (step − parts)", "", "", f"{rec['rest_ms']:.1f}", f"{rec['rest_ms'] / step:.0%}", "", ""
        )
        table.add_row(
            "[bold]whole step (measured)[/bold]", "", "", f"[bold]{step:.1f}[/bold]", "100%", "", ""
        )
    console.print(table)
    if step:
        console.print(f"[dim]rest = {rec['rest_note']}[/dim]")


def limiting_note(head: dict[str, Any] | None, breakdown: dict[str, Any] | None) -> str | None:
    """One sentence naming what holds the headline fraction below the goal, from the breakdown."""
    if not head or is_failure(head) or head.get("fraction_of_calibrated") is None:
        return None
    frac = head["fraction_of_calibrated"]
    if frac >= GOAL_FRACTION:
        return f"{head['name']} reaches {frac:.2f} of the calibrated bandwidth (goal ≥ {GOAL_FRACTION})."
    if not breakdown or is_failure(breakdown) or not breakdown.get("step_ms_median"):
        return f"{head['name']} reaches {frac:.2f} of calibrated (goal ≥ {GOAL_FRACTION}); run with --breakdown to attribute it."
    step = breakdown["step_ms_median"]
    slow = sorted(breakdown["parts"], key=lambda p: p["ms_total"], reverse=True)
    items = [f"{p['part']} {p['ms_total']:.0f} ms at {p['gb_per_s']:.1f} GB/s" for p in slow[:3]]
    return (
        f"{head['name']} reaches {frac:.2f} of calibrated (goal ≥ {GOAL_FRACTION}). Of its {step:.0f} ms: "
        + "; ".join(items)
        + f"; the rest (attention, norms, gathers, KV write) {breakdown['rest_ms']:.0f} ms."
    )


def render(outcome: Any, console: Any) -> None:
    """Every table of a roofline run, then the headline fraction and what limits it."""

    render_calibration(outcome.calibration, console)
    if outcome.steps:
        render_steps(outcome.steps, console)
    head = headline(outcome.steps)
    if head:
        render_parts(head, console)
    render_slopes(outcome.slopes, console)
    if outcome.breakdown:
        render_breakdown(outcome.breakdown, outcome.calibration.get("calibrated_gb_per_s"), console)
    note = limiting_note(head, outcome.breakdown)
    if note:
        console.print(f"[bold]{note}[/bold]")


def headline(steps: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
    """The shape the run is about: the largest batch, then the longest context, that succeeded."""
    ok = [r for r in steps if not is_failure(r)]
    return max(ok, key=lambda r: (r["batch"], r["ctx"])) if ok else None
