"""`g4bench engine-steps`: time the serving engine's prefill and decode calls at every bucket shape
(the simulator's inputs; fit them with `g4bench calibrate RUN_DIR`). Thin: see harness/calibrate/engine_steps.py."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from g4bench.commands.options import alias, int_list, renamed


def engine_steps(
    model: Annotated[str, typer.Option(help="Synthetic weights: small | e2b | e4b | a tiny-* preset | a config .json.")] = "small",
    max_slots: Annotated[str, typer.Option(help="Engine max_slots values (each its own child).")] = "1,2,4,8",
    max_len: Annotated[
        str, typer.Option(help="Engine max_len values; every KV bucket up to each is timed.")
    ] = "256,512,2048",
    kv_dtype: Annotated[str, typer.Option(help="KV storage dtype: bf16 | int8.")] = "bf16",
    sliding_kv: Annotated[str, typer.Option(help="ring | full.")] = "ring",
    samples: Annotated[int, typer.Option(help="Timed calls per shape (median kept).")] = 9,
    out: Annotated[Path | None, typer.Option(help="Run folder (default: results/<run-id>).")] = None,
    slots: Annotated[str | None, renamed("--slots", "--max-slots")] = None,
) -> None:
    """Measure Engine.prefill / Engine.decode per shape, as served (paged KV, chunk buckets, KV buckets)."""
    from rich.console import Console

    from harness.calibrate.engine_steps import EngineStepsSettings, run_engine_steps
    from harness.results import create_run_dir, is_failure

    console = Console(stderr=True)
    settings = EngineStepsSettings(
        model=model, slots=int_list(alias(max_slots, slots), "--max-slots") or (), max_lens=int_list(max_len, "--max-len") or (),
        kv_dtype=kv_dtype, sliding_kv=sliding_kv, samples=samples,
    )  # fmt: skip
    run_dir = out or create_run_dir(Path("results"), "engine-steps")
    recs = run_engine_steps(settings, run_dir, ["g4bench", *sys.argv[1:]], console)
    failed = sum(is_failure(r) for r in recs)
    console.print(
        f"{len(recs) - failed} shapes measured, {failed} failed; run folder: {run_dir}", soft_wrap=True
    )
    if failed:
        raise typer.Exit(1)
