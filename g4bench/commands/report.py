"""`g4bench report RUN_DIR [RUN_DIR ...] --out FILE.html`: one self-contained HTML page over runs.

Thin: harness/report/views.py reads each folder (any kind: serve-load, plan, revalidate, capacity,
engine-steps, … with a generic fallback), harness/report/page.py renders and checks the page loads
nothing from outside itself. Exit 2 when a page cannot be written.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer


def report(
    run_dirs: Annotated[list[Path], typer.Argument(help="Run folders, shown side by side in this order.")],
    out: Annotated[Path, typer.Option(help="The HTML file to write.")] = Path("report.html"),
    title: Annotated[str, typer.Option(help="Page title.")] = "g4bench report",
) -> None:
    """One self-contained HTML page (figures inline, CSS inline, no network resources) for any runs:
    command, environment, verdict, tables and figures of each, side by side."""
    from rich.console import Console
    from rich.markup import escape

    from harness.report.page import ReportError, write_report

    console = Console(stderr=True)
    missing = [str(d) for d in run_dirs if not d.is_dir()]
    if missing:
        console.print(f"[red]report: not a folder: {', '.join(missing)}[/red]", soft_wrap=True)
        raise typer.Exit(code=2)
    try:
        views = write_report(run_dirs, out, title)
    except (ReportError, OSError) as exc:
        console.print(f"[red]report: {escape(str(exc))}[/red]", soft_wrap=True)
        raise typer.Exit(code=2) from exc
    for v in views:
        console.print(f"  {v.name} ({v.kind}): {v.verdict}", soft_wrap=True)
    console.print(f"  wrote {out} ({out.stat().st_size / 1e3:.0f} kB)", soft_wrap=True)
