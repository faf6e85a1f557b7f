"""`g4bench capacity`: bisected residency ceilings, run on the local device or compiled for a TPU or GPU target.

Thin: maps options onto `harness.capacity.main.run_capacity`; exit 0 when every configuration was
searched, 1 when some search stopped on a real error (recorded, the run went on), 2 on an
unusable request.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from g4bench.commands.options import TARGET_HELP, alias, renamed, target_hardware


def _split(value: str | None) -> tuple[str, ...] | None:
    return tuple(v.strip() for v in value.split(",") if v.strip()) if value else None


def capacity(
    ctx: Annotated[int, typer.Option(help="Context length (KV positions) of every sequence.")] = 8192,
    model: Annotated[str, typer.Option(help="Model: e2b, e4b, small, a tiny-* preset or a config .json.")] = "e2b",
    kv_dtype: Annotated[str, typer.Option(help="KV dtypes, comma-separated: bf16,int8.")] = "bf16,int8",
    step: Annotated[str, typer.Option(help="Decode step variants: donated,copying.")] = "donated,copying",
    ple: Annotated[str, typer.Option(help="PLE table formats: bf16,int8,int4.")] = "bf16",
    sliding_kv: Annotated[
        str, typer.Option(help="Sliding-layer KV: full (max_len) and/or ring (window-sized).")
    ] = "full,ring",
    kv_layout: Annotated[
        str,
        typer.Option(
            help="Decode KV layouts, comma-separated: paged (block pools read by table, what `g4bench serve` "
            "runs) and/or contiguous (per slot, the reference article's). Prefill is sized contiguous."
        ),
    ] = "paged",
    target: Annotated[
        str,
        typer.Option(
            help=f"{TARGET_HELP}: local runs on this device; a TPU or GPU target is compiled for on this host "
            "(no accelerator needed; a GPU target needs jax-cuda12-plugin installed, and says so)."
        ),
    ] = "local",
    layers: Annotated[
        str | None,
        typer.Option(
            help="Layer weight format: w4a16, bf16, f32. (default: w4a16 for TPU; f32 local CPU, printed)"
        ),
    ] = None,
    prefill: Annotated[
        str | None,
        typer.Option(
            help="Prefill tokens per row per call to size, comma-separated (≥ ctx = one-shot), e.g. 256,8192."
        ),
    ] = None,
    tpot_ms: Annotated[
        float | None,
        typer.Option(help="TPOT objective in ms: adds the largest batch whose predicted step meets it."),
    ] = None,
    tol: Annotated[
        float | None,
        typer.Option(help="Stop when hi − lo ≤ max(1, tol·lo). (default: 0.02 local, 0 = exact for a compile target)"),
    ] = None,
    mem_limit_gib: Annotated[
        float | None,
        typer.Option(
            help="Local: address-space cap per probe in GiB (default: 75% of available RAM, printed); h100/h200: "
            "the device memory a probe's compiled peak must fit (default: the hardware file's HBM figure)"
        ),
    ] = None,
    timeout: Annotated[
        float | None, typer.Option(help="Seconds per probe process. (default: 1800 local, 900 TPU)")
    ] = None,
    out: Annotated[
        Path | None, typer.Option(help="Run folder. (default: results/<UTC stamp>-capacity-<target>/)")
    ] = None,
    shared_prefix: Annotated[
        int,
        typer.Option(help="Admission table: also count agents whose contexts share this many first tokens."),
    ] = 0,
    kv: Annotated[str | None, renamed("--kv", "--kv-dtype")] = None,
    agents: Annotated[
        str | None,
        typer.Option(help="Admission table: fleet sizes, comma-separated. (default: 2,4,8,16,32)"),
    ] = None,
    agent_ctx: Annotated[
        str | None,
        typer.Option(
            help="Admission table: context tokens per agent, comma-separated. (default: 4096,8192,16384,32768)"
        ),
    ] = None,
) -> None:
    """Find the largest decode batch that fits, by bisection (one fresh process per probe; within 2% locally, exact for a compile target).

    Local: each probe allocates the cache and runs the step under a memory cap; the measured ceiling is printed beside the ceiling predicted by compiling the same step for this device. TPU targets: each probe compiles for the chip's topology on this host (no TPU needed); the compiler's HBM OOM means "does not fit". GPU targets (h100, h200): each probe compiles for XLA's description of the part on this host (jax-cuda12-plugin, no GPU); XLA:GPU never refuses for memory, so a probe fits when its compiled peak is within the limit. Prints ceilings with the memory breakdown and step time, predicted ÷ reference (TPU v6e-1 measurements), donated ÷ copying, ring ÷ full, an agent-fleet admission table; each ceiling's step time from the target's step-time profile (configs/profiles; else the roofline lower bound), tok/s and $/M tokens, and with --tpot-ms the latency ceiling beside the memory one; writes results.jsonl, summary.csv, admission.csv, plots/ to the run folder.
    """
    import sys

    from rich.console import Console
    from rich.markup import escape

    from g4bench.commands.options import int_list
    from harness.capacity.main import CapacityError, CapacityRequest, run_capacity
    from harness.run import KV_LAYOUTS

    console = Console(stderr=True)
    kv_dtype = alias(kv_dtype, kv)
    hw_target = "local" if target == "local" else target_hardware(target)  # unknown: a usage error
    request = CapacityRequest(
        ctx=ctx,
        model=model,
        kv=_split(kv_dtype),
        steps=_split(step),
        ple=_split(ple),
        sliding=_split(sliding_kv),
        kv_layouts=_split(kv_layout),
        target=hw_target,
        layers=layers,
        prefill_tokens=tuple(int(t) for t in _split(prefill) or ()),
        tol=tol,
        tpot_ms=tpot_ms,
        mem_limit_bytes=int(mem_limit_gib * 2**30) if mem_limit_gib else None,
        timeout_s=timeout,
        shared_prefix=shared_prefix,
        agents=int_list(agents, "--agents"),
        agent_ctx=int_list(agent_ctx, "--agent-ctx"),
    )
    bad = [s for s in request.steps or () if s not in ("donated", "copying")]
    bad += [s for s in request.sliding or () if s not in ("full", "ring")]
    bad += [s for s in request.kv_layouts or () if s not in KV_LAYOUTS]
    if bad:
        console.print(f"[red]capacity: unknown values {bad}[/red]")
        raise typer.Exit(code=2)
    try:
        outcome = run_capacity(request, out=out, argv=sys.argv, console=console)
    except (CapacityError, FileNotFoundError, ValueError) as exc:
        console.print(f"[red]capacity: {escape(str(exc))}[/red]", soft_wrap=True)
        raise typer.Exit(code=2) from exc
    console.print(f"run folder: {outcome.run_dir}", soft_wrap=True)
    if outcome.errors:
        raise typer.Exit(code=1)
