"""`g4bench roofline`: the decode step against the device's calibrated streaming bandwidth.

Thin: parses options onto `harness.roofline.main.run_roofline` and its outcome onto exit codes
(0 all measured, 1 some child failed (recorded), 2 unusable request).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer


def roofline(
    model: Annotated[
        str | None, typer.Option(help="Model: e2b, e4b, small, a tiny-* preset or a config .json. (default: e2b)")
    ] = None,
    batch: Annotated[
        str | None,
        typer.Option(
            help="Batch sizes, comma-separated, e.g. 1,8,32. (default: 32 on an accelerator, 1 on the CPU)"
        ),
    ] = None,
    ctx: Annotated[
        str | None,
        typer.Option(
            help="Contexts, comma-separated; two or more give the marginal KV bandwidth. (default: 1024,2048,4096,8192; CPU 1024,4096,8192)"
        ),
    ] = None,
    kv_dtype: Annotated[str | None, typer.Option(help="KV cache dtype: bf16, int8 or f32. (default: bf16)")] = None,
    kv_layout: Annotated[
        str | None,
        typer.Option(
            help="KV cache layout: paged (block pools read by table, what `serve` runs) or contiguous (the "
            "reference article's); the byte model is the same, so XLA's bytes and the fraction of calibrated show "
            "what the paged read costs. (default: paged)"
        ),
    ] = None,
    sliding_kv: Annotated[
        str | None,
        typer.Option(
            help="Sliding-window layers' KV: ring (window-sized, what `serve` runs) or full (max_len rows). "
            "(default: ring with the paged layout, full with contiguous)"
        ),
    ] = None,
    layers: Annotated[
        str | None,
        typer.Option(
            help="Layer weight format: w4a16, bf16 or f32. (default: w4a16; f32 on the CPU, printed with why)"
        ),
    ] = None,
    samples: Annotated[
        int | None, typer.Option(help="Timed steps per shape, each on fresh inputs. (default: 15)")
    ] = None,
    warmup: Annotated[int | None, typer.Option(help="Untimed steps before sampling. (default: 2)")] = None,
    breakdown: Annotated[
        bool | None,
        typer.Option(
            "--breakdown/--no-breakdown",
            help="Time the step's parts alone to attribute its time. (default: on for the CPU)",
        ),
    ] = None,
    out: Annotated[
        Path | None, typer.Option(help="Run folder. (default: results/<UTC stamp>-roofline/)")
    ] = None,
    timeout: Annotated[
        float | None, typer.Option(help="Seconds allowed per child process. (default: 1800)")
    ] = None,
    mem_limit_gib: Annotated[
        float | None,
        typer.Option(
            help="Cap each child's address space (RLIMIT_AS) in GiB; XLA reserves more than it uses, so be generous."
        ),
    ] = None,
) -> None:
    """Calibrate streaming bandwidth, then measure the decode step per shape in fresh processes and read it against the byte model (g4bench/model/costs.py): achieved GB/s, fraction of calibrated, XLA's cost_analysis beside the model, and the marginal KV bandwidth from a context slope (only pairs whose time rises > 15%). Writes a run folder with kind "roofline" records and the bandwidth figure in plots/."""
    import sys

    from rich.console import Console
    from rich.markup import escape

    from g4bench.commands.options import int_list
    from harness.roofline.main import RooflineError, RooflineRequest, run_roofline

    console = Console(stderr=True)
    request = RooflineRequest(
        model=model,
        batches=int_list(batch, "--batch"),
        ctxs=int_list(ctx, "--ctx"),
        kv_dtype=kv_dtype,
        kv_layout=kv_layout,
        sliding_kv=sliding_kv,
        layers=layers,
        samples=samples,
        warmup=warmup,
        breakdown=breakdown,
        timeout_s=timeout,
        mem_limit_bytes=int(mem_limit_gib * 2**30) if mem_limit_gib is not None else None,
    )
    try:
        outcome = run_roofline(request=request, out=out, argv=sys.argv, console=console)
    except RooflineError as exc:
        console.print(f"[red]roofline: {escape(str(exc))}[/red]", soft_wrap=True)
        raise typer.Exit(code=2) from exc
    if outcome.failures:
        raise typer.Exit(code=1)
