"""`g4bench calibrate`: fit a step-time profile from measured runs (thin; see harness/calibrate/main.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer


def calibrate(
    run_dirs: Annotated[
        list[Path] | None, typer.Argument(help="Run folders (revalidate / roofline) to fit on.")
    ] = None,
    holdout: Annotated[
        list[Path] | None, typer.Option(help="Run folder predicted without refitting (repeatable).")
    ] = None,
    reference: Annotated[
        bool,
        typer.Option(help="Fit the TPU v6e profile from the reference engine's tables (configs/baselines)."),
    ] = False,
    device: Annotated[
        str | None, typer.Option(help="Hardware id to file the profile under. (default: from the records)")
    ] = None,
    out: Annotated[
        Path | None, typer.Option(help="Profile path. (default: configs/profiles/<device>.toml)")
    ] = None,
) -> None:
    """Fit the decode step-time model (harness/calibrate/steptime.py) and print residuals, leave-one-out and held-out errors."""
    from rich.console import Console
    from rich.markup import escape

    from harness.calibrate.main import CalibrateError, run_calibrate

    console = Console(stderr=True)
    try:
        _, path, _ = run_calibrate(
            list(run_dirs or []),
            list(holdout or []),
            reference=reference,
            device=device,
            out=out,
            console=console,
        )
    except (CalibrateError, FileNotFoundError) as exc:
        console.print(f"[red]calibrate: {escape(str(exc))}[/red]", soft_wrap=True)
        raise typer.Exit(code=2) from exc
    console.print(f"wrote {path}", soft_wrap=True)
