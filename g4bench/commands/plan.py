"""`g4bench plan`: simulate serving (the real scheduler on a virtual clock) to validate against measured
serve-load runs, or to size a fleet. Thin: the logic is in harness/sim/."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from g4bench.commands.options import (
    SLO_DEFAULT,
    SLO_DEFAULT_HELP,
    ProfileOption,
    TargetOption,
    str_list,
    target_hardware,
)


def plan(
    validate: Annotated[
        list[Path] | None, typer.Option(help="Measured serve-load run folder to re-simulate (repeatable).")
    ] = None,
    target: TargetOption = "local",
    profile: ProfileOption = None,
    model: Annotated[
        str | None,
        typer.Option(help="Model: e2b | e4b | small | a tiny-* preset. (default: e2b; local: small)"),
    ] = None,
    workload: Annotated[str, typer.Option(help="fixed | agent | shared-prefix.")] = "agent",
    agents: Annotated[
        int,
        typer.Option(
            help="Concurrent agents to serve (chips are sized for this many); the agent regime this project "
            "serves is 2-8."
        ),
    ] = 8,
    turns: Annotated[int, typer.Option(help="Turns per agent task.")] = 20,
    input_len: Annotated[int, typer.Option(help="First-turn prompt tokens.")] = 500,
    output_len: Annotated[int, typer.Option(help="Generated tokens per turn.")] = 64,
    tool_result_tokens: Annotated[int, typer.Option(help="Tool-result tokens appended each turn.")] = 320,
    prefix_len: Annotated[int, typer.Option(help="Shared system-prompt tokens (shared-prefix).")] = 2048,
    kv_dtype: Annotated[str, typer.Option(help="KV dtypes to search, comma-separated.")] = "bf16,int8",
    sliding_kv: Annotated[str, typer.Option(help="Sliding KV modes to search: ring,full.")] = "ring,full",
    max_slots: Annotated[
        str, typer.Option(help="Engine slot caps to search, comma-separated; 'agents' = one slot per agent.")
    ] = "agents",
    slo: Annotated[
        Path, typer.Option(help="Goodput objectives (TOML), as serve-load.", show_default=SLO_DEFAULT_HELP)
    ] = SLO_DEFAULT,
    capacity: Annotated[
        Path | None,
        typer.Option(
            help="A `g4bench capacity` run compiled for the target: its donated served-layout ceilings' non-KV "
            "bytes (weights + the compiled step's temporaries) replace the weights-only overhead in each "
            "memory ceiling."
        ),
    ] = None,
    out: Annotated[Path | None, typer.Option(help="Output folder. (default: results/<run-id>)")] = None,
    spec_k: Annotated[
        int | None,
        typer.Option(help="Price speculative decoding with K drafts per verify step (instead of sizing)."),
    ] = None,
    accept_rate: Annotated[
        float, typer.Option(help="--spec-k: per-draft acceptance rate α in [0, 1].")
    ] = 0.7,
    spec_batches: Annotated[str, typer.Option(help="--spec-k: batch sizes, comma-separated.")] = "1,4,8,32",
    spec_ctx: Annotated[int, typer.Option(help="--spec-k: context length of every sequence.")] = 8192,
) -> None:
    """Predict serve-load from a step-time profile: validate against measured runs, or size a fleet
    (agents per chip at the SLO attainment target, chips, $/M output tokens, $/agent-hour)."""
    import time

    from rich.console import Console
    from rich.markup import escape

    from harness.calibrate.main import CalibrateError
    from harness.load.slo import load_slo
    from harness.results import create_run_dir
    from harness.sim import planner
    from harness.sim.plots import frontier_plot, validation_plot
    from harness.sim.validate import ValidateError

    console = Console(stderr=True)
    if not console.is_terminal:
        console.width = 160  # logs and captures: keep the tables on one line per row
    run_dir = out or create_run_dir(Path("results"), "plan")
    try:
        target_hardware(target)  # an unknown target is a usage error listing them
        tgt = planner.resolve_target(target, profile, model)
        if spec_k is not None:
            from harness.sim.speculative import print_speculative, run_speculative

            batches = tuple(int(b) for b in (str_list(spec_batches) or ("1", "4", "8", "32")))
            doc = run_speculative(tgt, k=spec_k, accept_rate=accept_rate, batches=batches, ctx=spec_ctx)
            print_speculative(doc, console)
            console.print(
                f"  written: {planner.write_json(run_dir / 'speculative.json', doc)}", soft_wrap=True
            )
            return
        if validate:
            docs = planner.run_validate(list(validate), tgt, run_dir, console)
            console.print(
                f"  plots: {', '.join(map(str, validation_plot(docs, run_dir / 'plots')))}", soft_wrap=True
            )
            console.print(f"  run folder: {run_dir}", soft_wrap=True)
            return
        from harness.load.workloads import WorkloadConfig
        from harness.sim.fleet import knob_grid

        if workload not in ("fixed", "agent", "shared-prefix"):
            raise typer.BadParameter(f"--workload {workload!r}")
        wl = WorkloadConfig(kind=workload, input_len=input_len, output_len=output_len, turns=turns,  # type: ignore[arg-type]
                            tool_result_tokens=tool_result_tokens,
                            prefix_len=prefix_len if workload == "shared-prefix" else 0)  # fmt: skip
        slots = tuple(None if s == "agents" else int(s) for s in (str_list(max_slots) or ("agents",)))
        knobs = knob_grid(str_list(kv_dtype) or ("bf16",), str_list(sliding_kv) or ("ring",), slots)
        objectives = load_slo(slo)
        t0 = time.perf_counter()
        overhead = planner.capacity_overheads(capacity, tgt) if capacity is not None else None
        rows = planner.run_fleet(tgt, wl, objectives, knobs, agents, overhead, console)
        planner.print_fleet(rows, tgt, agents, console)
        doc = planner.fleet_json(rows, tgt, agents)
        doc["simulated_s"] = time.perf_counter() - t0
        planner.write_json(run_dir / "plan.json", doc)
        plots = frontier_plot(doc, run_dir / "plots", objectives.tpot_ms)
        console.print(
            f"  simulated in {doc['simulated_s']:.1f} s; plots: {', '.join(map(str, plots))}", soft_wrap=True
        )
        console.print(f"  run folder: {run_dir}", soft_wrap=True)
    except (ValidateError, CalibrateError, FileNotFoundError, ValueError) as exc:
        console.print(f"[red]plan: {escape(str(exc))}[/red]", soft_wrap=True)
        raise typer.Exit(code=2) from exc
