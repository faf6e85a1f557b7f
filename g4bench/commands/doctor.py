"""`g4bench doctor`: what this machine can run (device, memory, versions, bandwidth, compiles), one table.

Thin: runs `harness.checks.doctor.run_doctor`, prints its rows as a rich table on stderr, optionally writes
them as JSON (--out), and exits 1 when any check failed (0 otherwise; warnings and skips are fine).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer


def doctor(
    e2b_compile: Annotated[
        bool | None,
        typer.Option(
            "--e2b-compile/--no-e2b-compile",
            help="Compile E2B's decode step (else eval_shape only). (default: on an accelerator, or "
            "on the CPU when 6 GiB of RAM are free)",
        ),
    ] = None,
    out: Annotated[Path | None, typer.Option(help="Run folder to write doctor.json into (created).")] = None,
    timeout: Annotated[float, typer.Option(help="Seconds allowed per check's child process.")] = 600.0,
) -> None:
    """Check this machine: JAX device kind and count, memory limit, versions, a short bandwidth
    calibration, the decode step of tiny-a and E2B compiled (or E2B traced only, reason given), and
    whether each command can run here. Exit 1 if anything is broken."""
    import json

    from rich.console import Console
    from rich.table import Table

    from harness.checks.doctor import run_doctor

    console = Console(stderr=True)
    report = run_doctor(
        e2b_compile=e2b_compile, timeout_s=timeout, progress=lambda m: console.print(f"  {m}")
    )
    table = Table(title="g4bench doctor", show_lines=False)
    table.add_column("check")
    table.add_column("status")
    table.add_column("detail", overflow="fold")
    colour = {"ok": "green", "warn": "yellow", "fail": "red", "skip": "dim"}
    for row in report.rows:
        table.add_row(row.check, f"[{colour[row.status]}]{row.status}[/]", row.detail)
    console.print(table)
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        (out / "doctor.json").write_text(json.dumps(report.to_json(), indent=2, default=str) + "\n")
        console.print(f"wrote {out / 'doctor.json'}", soft_wrap=True)
    if report.broken:
        console.print(f"[red]{len(report.broken)} check(s) failed[/red]")
        raise typer.Exit(code=1)
