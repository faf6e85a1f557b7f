"""`g4bench device-check`: the prepared accelerator check (doctor, revalidate, roofline, capacity,
serve + serve-load), one run folder per step; `--dry-run` runs the same steps at tiny sizes on the CPU.

Thin: `g4bench.commands.device_steps.run_check` does the work; exit 1 when any step failed or ran out of its
time budget (every step still ran), 0 otherwise.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

REFERENCE_DIR = Path("results/reference")


def check_folder(out: Path | None, dry_run: bool, results_root: Path = Path("results")) -> Path:
    """`out`, or a new ``results/<UTC stamp>-device-check[-dry]/``: a check writes under results/,
    never into the curated results/reference/ unless `--out` names it (a dry run never: its tiny CPU
    figures are no reference)."""
    from harness.results import create_run_dir

    if out is None:
        return create_run_dir(results_root, "device-check-dry" if dry_run else "device-check")
    inside = out.resolve().is_relative_to(REFERENCE_DIR.resolve())
    if dry_run and inside:
        raise ValueError(
            f"--dry-run writes tiny CPU runs, not references: choose an --out outside {REFERENCE_DIR}"
        )
    return out


def device_check(
    out: Annotated[
        Path | None,
        typer.Option(
            help="Folder for the steps' run folders, logs and device-check.json. "
            "(default: results/<UTC stamp>-device-check/)"
        ),
    ] = None,
    dry_run: Annotated[
        bool, typer.Option(help="Every step at tiny sizes on the CPU (tiny-a, tiny shapes).")
    ] = False,
    step: Annotated[
        list[str] | None,
        typer.Option(
            help="Run only this step (repeatable): doctor, revalidate, roofline, capacity, serve-load, "
            "or burst (the burst-prefill check, run only when named)."
        ),
    ] = None,
    time_scale: Annotated[
        float, typer.Option(help="Multiply every step's time budget (e.g. 1.5 on a second try).")
    ] = 1.0,
) -> None:
    """Run every headline measurement on this accelerator within 8 minutes (per-step budgets), each
    step a fresh `g4bench` process; a failed step is recorded and the check goes on."""
    from rich.console import Console
    from rich.markup import escape

    from g4bench.commands.device_steps import run_check, steps

    console = Console(stderr=True)
    try:
        out = check_folder(out, dry_run)
    except ValueError as exc:
        console.print(f"[red]device-check: {escape(str(exc))}[/red]", soft_wrap=True)
        raise typer.Exit(code=2) from exc
    known = [s.name for s in steps(out, dry_run)]
    unknown = [s for s in step or () if s not in known]
    if unknown:
        console.print(f"[red]unknown step(s) {unknown}; steps: {known}[/red]")
        raise typer.Exit(code=2)
    outcome = run_check(
        out,
        dry_run=dry_run,
        only=step,
        time_scale=time_scale,
        progress=lambda m: console.print(m, soft_wrap=True),
    )
    for r in outcome.results:
        colour = "green" if r.status == "ok" else "red"
        console.print(f"  {r.name:<11} [{colour}]{r.status:<8}[/] {r.wall_s:6.0f} s / {r.budget_s:.0f} s")
    console.print(f"wrote {out / 'device-check.json'}", soft_wrap=True)
    if outcome.failed:
        raise typer.Exit(code=1)
