"""`g4bench gate`: fail CI on a real regression against a committed baseline run.

Thin: calls `harness.checks.gate.gate_runs` and maps its report onto exit codes: 0 no regression,
1 a regression (real by the noise rule and beyond the floor, or a configuration that now fails),
2 unusable input.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer


def gate(
    run_dir: Annotated[Path, typer.Argument(help="Run folder to judge (holds results.jsonl).")],
    baseline: Annotated[Path, typer.Option(help="Baseline run folder, e.g. results/reference/ci-cpu-tiny.")],
    floor: Annotated[
        str, typer.Option(help="Smallest change that can fail the gate, e.g. '5%' or '0.05'.")
    ] = "5%",
    ratios_only: Annotated[
        bool,
        typer.Option(
            help="Gate only within-run ratios (e.g. copying ÷ donated), so CI machine speed cancels out."
        ),
    ] = False,
) -> None:
    """Compare RUN_DIR with --baseline metric by metric (configurations matched by name).

    A metric regresses when it moved the wrong way, the move is real (|ratio − 1| > 2 × the larger relative IQR of the two runs) and beyond --floor. Exit 0: no regression; 1: a regression or a configuration that now fails; 2: unusable input.
    """
    from rich.console import Console
    from rich.markup import escape

    from harness.checks.gate import GateError, gate_runs, parse_floor, render_report

    console = Console(stderr=True)
    try:
        report = gate_runs(run_dir, baseline, floor=parse_floor(floor), ratios_only=ratios_only)
    except GateError as exc:
        console.print(f"[red]gate: unusable input: {escape(str(exc))}[/red]", soft_wrap=True)
        raise typer.Exit(code=2) from exc
    render_report(report, console)
    if report.regressions:
        raise typer.Exit(code=1)
