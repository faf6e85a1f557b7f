"""`g4bench revalidate`: the decode-step grid in interleaved fresh-process rounds, verdicts with CIs.

Thin: maps options onto `harness.revalidate.main.run_revalidate` and its outcome onto exit codes
(0 all measured, 1 some configuration failed (recorded, the sweep went on), 2 unusable request).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from g4bench.commands.options import renamed


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
            help="Model: e2b, e4b, small, a tiny-* preset, a config .json or a checkpoint dir. (default: e2b)"
        ),
    ] = None,
    ctx: Annotated[
        str | None,
        typer.Option(
            help="Context length(s), comma-separated, e.g. 1024,4096,8192. (default: 8192; CPU default printed)"
        ),
    ] = None,
    batch: Annotated[
        str | None,
        typer.Option(
            help="Batch size(s), comma-separated, e.g. 1,8,32. (default: 32 on an accelerator; CPU default printed)"
        ),
    ] = None,
    kv_layout: Annotated[
        str | None,
        typer.Option(
            help="KV cache layout(s), comma-separated: paged (block pools read by table, what `serve` runs), "
            "contiguous (per-slot rows, the reference article's grid). Both: every configuration in each, with "
            "a paged-vs-contiguous verdict. (default: paged)"
        ),
    ] = None,
    sliding_kv: Annotated[
        str | None,
        typer.Option(
            help="Sliding-window layers' KV, comma-separated: ring (window-sized, what `serve` runs) or full "
            "(max_len rows). Both: a ring-vs-full verdict. (default: ring with the paged layout, full with "
            "contiguous, so `--kv-layout contiguous` alone is the reference article's grid)"
        ),
    ] = None,
    rounds: Annotated[
        int | None,
        typer.Option(
            help="Rounds: each visits every configuration once, in a fresh random order, one fresh process per "
            "visit. Given alone: exactly N. (default: 2 on an accelerator; on the CPU at least 3, more within "
            "the time budget)"
        ),
    ] = None,
    budget_min: Annotated[
        float | None,
        typer.Option(
            help="Add rounds after --rounds while another fits in this many minutes of measuring (0: none). "
            "Every round narrows every CI. (default: 15 on the CPU unless --rounds is given; none on an accelerator)"
        ),
    ] = None,
    max_rounds: Annotated[
        int | None,
        typer.Option(
            help="Cap on the rounds a time budget adds (a budgeted run also stops once every comparison is "
            "settled, or every median is within ±2% where there is no comparison; the reason is printed). "
            "(default: 100)"
        ),
    ] = None,
    samples: Annotated[
        int | None, typer.Option(help="Timed steps per configuration per visit. (default: 5 on the CPU, 8 on an accelerator)")
    ] = None,
    warmup: Annotated[
        int | None, typer.Option(help="Untimed steps per visit. (default: 2 on the CPU, 3 on an accelerator)")
    ] = None,
    seed: Annotated[
        int | None, typer.Option(help="Seed of the weights, the visit orders and the bootstrap. (default: 0)")
    ] = None,
    floor: Annotated[
        str | None,
        typer.Option(help="Practical floor, '2%' or 0.02: smaller effects are never faster/slower. (default: 2%)"),
    ] = None,
    aa: Annotated[
        int | None,
        typer.Option(
            help="A/A calibration: measure the one selected configuration as N independent pairs in the same "
            "interleaved design and report the false-positive rate."
        ),
    ] = None,
    visit: Annotated[
        str | None,
        typer.Option(
            help="separate: one fresh process per configuration per round. shared-weights: configurations "
            "differing only in KV dtype, donation or layout share one process per round, samples interleaved, "
            "so process-to-process speed cancels in their ratios (narrower CIs, but on XLA:CPU copying bf16-KV "
            "steps run slower shared; caveat printed). (default: separate)"
        ),
    ] = None,
    cpus: Annotated[
        str | None,
        typer.Option(help="Pin each child (and XLA's thread pool) to these CPU ids, e.g. 0,1. (default: inherited)"),
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
    floor_pct: Annotated[float | None, renamed("--floor-pct", "--floor")] = None,
) -> None:
    """Measure the decode step over configs/sweeps/revalidate.toml (PLE × KV dtype × donation) × batch × ctx,
    as `serve` runs it by default (paged KV, ring sliding KV; --kv-layout contiguous: the reference grid).

    Rounds visit every configuration once in a fresh random order, each visit a fresh process timing steps on warm buffers, with the host's other CPU load recorded per sample. Each effect (donation, int8 KV, PLE format) gets a ratio with a 95% CI (the visit-to-visit noise pooled over the run's configurations) and a verdict: faster / slower / equivalent / inconclusive (the reference's 2×IQR rule shown beside it); the summary says what effect the run could detect and how many rounds a 10% one would need. Writes results.jsonl, summary.csv, visits.jsonl, env.json, command.txt, logs/ and plots/. Exit 1 if a configuration failed (recorded; the sweep goes on), 2 on an unusable request.
    """
    import sys

    from rich.console import Console
    from rich.markup import escape

    from g4bench.commands.options import int_list, parse_floor, str_list
    from harness.revalidate.main import RevalidateError, RevalidateRequest, run_revalidate

    console = Console(stderr=True)
    if all_ and config:
        console.print("[red]--all and --config are exclusive[/red]")
        raise typer.Exit(code=2)
    request = RevalidateRequest(
        model=model,
        batches=int_list(batch, "--batch"),
        ctxs=int_list(ctx, "--ctx"),
        kv_layouts=str_list(kv_layout),
        sliding_kvs=str_list(sliding_kv),
        rounds=rounds,
        samples=samples,
        warmup=warmup,
        seed=seed,
        floor=floor_pct / 100.0 if floor_pct is not None else parse_floor(floor),
        aa=aa,
        visit=visit,
        budget_s=budget_min * 60.0 if budget_min is not None else None,
        max_rounds=max_rounds,
        cpus=int_list(cpus, "--cpus", minimum=0),
        layers=layers,
        timeout_s=timeout,
        mem_limit_bytes=int(mem_limit_gib * 2**30) if mem_limit_gib is not None else None,
    )
    try:
        outcome = run_revalidate(
            patterns=config or None,
            request=request,
            out=out,
            resume=resume,
            argv=sys.argv,
            console=console,
        )
    except RevalidateError as exc:
        console.print(f"[red]revalidate: {escape(str(exc))}[/red]", soft_wrap=True)
        raise typer.Exit(code=2) from exc
    if outcome.failures:
        raise typer.Exit(code=1)
