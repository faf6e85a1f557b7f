"""`g4bench revalidate`: decode-step grid, one fresh process per configuration, noise-judged verdicts.

Thin: maps options onto `harness.revalidate.run_revalidate` and its outcome onto exit codes
(0 all measured, 1 some configuration failed (recorded, the sweep went on), 2 unusable request).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer


def revalidate(
    all_: Annotated[
        bool,
        typer.Option(
            "--all", help="Run every configuration of the grid (the default when no --config is given)."
        ),
    ] = False,
    config: Annotated[
        list[str] | None,
        typer.Option("--config", help="Configuration name or glob (repeatable), e.g. 'ple-bf16/kv-bf16/*'."),
    ] = None,
    model: Annotated[
        str | None,
        typer.Option(
            help="Model: e2b, e4b, a tiny-* preset, a config .json or a checkpoint dir. (default: e2b)"
        ),
    ] = None,
    ctx: Annotated[
        int | None,
        typer.Option(
            help="Context length of every sequence. (default: 8192 on an accelerator; CPU default printed)"
        ),
    ] = None,
    batch: Annotated[
        int | None,
        typer.Option(help="Sequences per decode step. (default: 32 on an accelerator; CPU default printed)"),
    ] = None,
    samples: Annotated[int | None, typer.Option(help="Timed steps per configuration. (default: 15)")] = None,
    warmup: Annotated[int | None, typer.Option(help="Untimed steps before sampling. (default: 3)")] = None,
    seed: Annotated[
        int | None, typer.Option(help="Seed of the synthetic weights and the bootstrap. (default: 0)")
    ] = None,
    out: Annotated[
        Path | None,
        typer.Option(
            help="Run folder (default: results/<UTC stamp>-revalidate/); with --resume, the run to continue."
        ),
    ] = None,
    resume: Annotated[
        bool,
        typer.Option(help="Continue the run in --out: skip configurations it already measured successfully."),
    ] = False,
    timeout: Annotated[
        float | None, typer.Option(help="Seconds allowed per configuration's process. (default: 1800)")
    ] = None,
    layers: Annotated[
        str | None,
        typer.Option(
            help="Store transformer layers as w4a16, bf16 or f32 instead of the grid's w4a16. "
            "(default: the grid's on an accelerator; f32 on the CPU, reason printed)"
        ),
    ] = None,
    mem_limit_gib: Annotated[
        float | None,
        typer.Option(
            help="Cap each child's address space (RLIMIT_AS) in GiB; XLA reserves more than it uses, so be generous."
        ),
    ] = None,
) -> None:
    """Measure the decode step over configs/sweeps/revalidate.toml (PLE × KV dtype × donation).

    Each configuration runs in its own process and each sample times one step on fresh inputs. Prints per-configuration statistics and verdict tables (a ratio is "real" only above twice the measured noise), and writes results.jsonl, summary.csv, env.json, command.txt and logs/ to the run folder. Exit 1 if a configuration failed (it is recorded and the sweep goes on), 2 on an unusable request.
    """
    import sys

    from rich.console import Console

    from harness.revalidate import RevalidateError, run_revalidate

    console = Console(stderr=True)
    if all_ and config:
        console.print("[red]--all and --config are exclusive[/red]")
        raise typer.Exit(code=2)
    requested = {
        "model": model,
        "batch": batch,
        "ctx": ctx,
        "samples": samples,
        "warmup": warmup,
        "seed": seed,
        "layers": layers,
        "timeout_s": timeout,
        "mem_limit_bytes": int(mem_limit_gib * 2**30) if mem_limit_gib is not None else None,
    }
    try:
        outcome = run_revalidate(
            patterns=config or None,
            requested=requested,
            out=out,
            resume=resume,
            argv=sys.argv,
            console=console,
        )
    except RevalidateError as exc:
        console.print(f"[red]revalidate: {exc}[/red]", soft_wrap=True)
        raise typer.Exit(code=2) from exc
    if outcome.failures:
        raise typer.Exit(code=1)
