"""`g4bench plot RUN_DIR`: draw a run's figures (PNG and SVG) into RUN_DIR/plots/.

Thin: calls `harness.plots.plot_run`; exit 2 when the folder is not a readable run.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer


def plot(
    run_dir: Annotated[Path, typer.Argument(help="Run folder (holds results.jsonl).")],
    out: Annotated[
        Path | None, typer.Option(help="Where to write the figures. (default: RUN_DIR/plots)")
    ] = None,
) -> None:
    """Draw a run's figures (PNG and SVG) into RUN_DIR/plots/.

    Step time per configuration with IQR bars and verdicts; achieved bandwidth against the calibrated roofline (when the run has roofline records); aggregate tok/s against batch with the vLLM TPU v6e-1 baseline overlaid.
    """
    from rich.console import Console
    from rich.markup import escape

    from harness.plots import plot_run
    from harness.results import RunError

    console = Console(stderr=True)
    try:
        paths = plot_run(run_dir, out, console)
    except RunError as exc:
        console.print(f"[red]plot: {escape(str(exc))}[/red]", soft_wrap=True)
        raise typer.Exit(code=2) from exc
    if not paths:
        console.print("[yellow]nothing to plot in this run[/yellow]")
        raise typer.Exit(code=1)
    for path in paths:
        console.print(f"wrote {path}", soft_wrap=True)
