"""`g4bench constraint-cost`: TPOT with vs without a JSON-schema constraint (harness/load/constraint_cost.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from g4bench.commands.options import alias, renamed


def constraint_cost(
    model: Annotated[str, typer.Option(help="Synthetic weights: small | e2b | e4b | a tiny-* preset | a config .json")] = "small",
    conc: Annotated[str, typer.Option(help="Concurrency levels, comma-separated.")] = "1,8",
    rounds: Annotated[int, typer.Option(help="Interleaved rounds per level (free and json each once).")] = 5,
    output_len: Annotated[int, typer.Option(help="Tokens per request (both variants run exactly this many).")] = 64,
    input_len: Annotated[int, typer.Option(help="Prompt tokens per request.")] = 128,
    out: Annotated[Path | None, typer.Option(help="Run folder (default: results/constraint-cost-<id>).")] = None,
    seed: Annotated[int, typer.Option(help="Seed of the prompts.")] = 0,
    max_tokens: Annotated[int | None, renamed("--max-tokens", "--output-len")] = None,
    prompt_len: Annotated[int | None, renamed("--prompt-len", "--input-len")] = None,
) -> None:
    """Measure the grammar's decode cost: TPOT constrained ÷ free, and mask time per step."""
    import json

    from rich.console import Console

    from harness.env import host_env
    from harness.load.constraint_cost import CostSettings, run_constraint_cost
    from harness.results import create_run_dir

    console = Console(stderr=True)
    max_tokens, prompt_len = alias(output_len, max_tokens), alias(input_len, prompt_len)
    try:
        levels = tuple(sorted({int(c) for c in conc.split(",") if c.strip()}))
    except ValueError:
        console.print(f"[red]--conc must be integers separated by commas, got {conc!r}[/red]")
        raise typer.Exit(2) from None
    if not levels or min(levels) < 1 or rounds < 1 or max_tokens < 2:
        console.print("[red]need --conc >= 1, --rounds >= 1, --output-len >= 2[/red]")
        raise typer.Exit(2)
    s = CostSettings(model=model, concurrencies=levels, rounds=rounds, max_tokens=max_tokens,
                     prompt_len=prompt_len, seed=seed, max_len=max(512, -(-(prompt_len + max_tokens + 16) // 256) * 256))  # fmt: skip
    record = run_constraint_cost(s, log=console.print)
    record["env"] = host_env(record["settings"])
    run_dir = out if out is not None else create_run_dir(Path("results"), "constraint-cost")
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "constraint_cost.json").write_text(json.dumps(record, indent=2))
    for lv in record["levels"]:
        console.print(
            f"c={lv['concurrency']}: TPOT json ÷ free = {lv['ratio_median']:.3f} (rounds {lv['ratio_min']:.3f}–"
            f"{lv['ratio_max']:.3f}); free {lv['free_tpot_ms_median']:.2f} ms, json {lv['json_tpot_ms_median']:.2f} ms; "
            f"mask fill {lv['mask_fill_ms_per_step_median']:.3f} ms/step (overlapped), "
            f"wait {lv['mask_wait_ms_per_step_median']:.3f} ms/step"
        )
    console.print(f"  run folder: {run_dir}", soft_wrap=True)
