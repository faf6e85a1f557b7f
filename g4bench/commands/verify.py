"""`g4bench verify`: our engine against transformers' Gemma4ForCausalLM on the same weights and prompt.

`--checkpoint DIR` verifies a checkpoint (BF16, f32 or compressed-tensors W4A16); `--model FILE`
(or a preset name) writes synthetic random weights to a temporary checkpoint first. The work is
`harness.checks.verify`; this command prints its report (rich, stderr): max |Δlogit| over the prompt
positions (summarized) and at every decode step, transformers' own float32 error on the same
positions (the floor), the tolerance that follows (max(--tolerance, 2 × floor)), and greedy
agreement.

Exit codes: 0 within tolerance, 1 beyond it, 2 on bad input or a missing `parity` extra.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from g4bench.commands.options import MODEL_HELP, alias, renamed


def verify(
    checkpoint: Annotated[
        Path | None, typer.Option(help="Checkpoint directory (config.json + *.safetensors)")
    ] = None,
    model: Annotated[
        str | None,
        typer.Option(help=f"Synthetic weights in a temporary checkpoint: {MODEL_HELP.rsplit(' | ', 1)[0]}"),
    ] = None,
    input_len: Annotated[int, typer.Option(help="Prompt tokens (BOS + random ids)")] = 40,
    output_len: Annotated[int, typer.Option(help="Greedy decode steps after the prefill")] = 8,
    tolerance: Annotated[
        float,
        typer.Option(help="Largest acceptable max |Δlogit|, raised to 2 × transformers' own float32 error"),
    ] = 1e-4,
    f32_floor: Annotated[
        bool,
        typer.Option(help="Measure transformers' float32 error (float64 reference) to scale the tolerance"),
    ] = True,
    reference_dtype: Annotated[
        str, typer.Option(help="transformers' dtype: float64 (error-free reference) | float32")
    ] = "float64",
    sliding_kv: Annotated[str, typer.Option(help="Our sliding-layer KV: ring | full")] = "ring",
    chunk_size: Annotated[int | None, typer.Option(help="Our prefill chunk (default: one shot)")] = None,
    seed: Annotated[int, typer.Option(help="Prompt (and synthetic weight) seed")] = 0,
    config: Annotated[str | None, renamed("--config", "--model")] = None,
    prompt_len: Annotated[int | None, renamed("--prompt-len", "--input-len")] = None,
    decode_steps: Annotated[int | None, renamed("--decode-steps", "--output-len")] = None,
) -> None:
    """Compare our engine's logits with transformers' on the same weights; exit 1 beyond tolerance."""
    from rich.console import Console
    from rich.markup import escape

    console = Console(stderr=True, soft_wrap=True)
    config = alias(model, config)
    prompt_len, decode_steps = alias(input_len, prompt_len), alias(output_len, decode_steps)
    if (checkpoint is None) == (config is None):
        console.print("[red]give exactly one of --checkpoint DIR or --model PRESET|FILE[/]")
        raise typer.Exit(code=2)
    if reference_dtype not in ("float64", "float32") or sliding_kv not in ("ring", "full"):
        console.print("[red]--reference-dtype must be float64|float32 and --sliding-kv ring|full[/]")
        raise typer.Exit(code=2)
    if prompt_len < 1 or decode_steps < 0 or tolerance <= 0 or (chunk_size is not None and chunk_size < 1):
        console.print(
            "[red]--input-len and --chunk-size must be >= 1, --output-len >= 0, --tolerance > 0[/]"
        )
        raise typer.Exit(code=2)

    from harness.checks.verify import PARITY_INSTALL_HINT, verify_checkpoint, verify_config

    kwargs: dict[str, Any] = dict(
        prompt_len=prompt_len,
        decode_steps=decode_steps,
        tolerance=tolerance,
        reference_dtype=reference_dtype,
        seed=seed,
        sliding_kv=sliding_kv,
        chunk_size=chunk_size,
        f32_floor=f32_floor,
    )
    try:
        if checkpoint is not None:
            report = verify_checkpoint(checkpoint, **kwargs)
        else:
            assert config is not None  # exactly one of the two was given (checked above)
            report = verify_config(config, **kwargs)
    except ModuleNotFoundError as err:
        if err.name and err.name.split(".")[0] in ("torch", "transformers", "compressed_tensors"):
            console.print(
                f"[red]verify needs the `parity` extra ({err.name} is missing):[/] {escape(PARITY_INSTALL_HINT)}"
            )
            raise typer.Exit(code=2) from err
        raise
    except (FileNotFoundError, ValueError) as err:  # bad paths, unsupported configs, checkpoint errors
        console.print(f"[red]{type(err).__name__}:[/] {escape(str(err))}")
        raise typer.Exit(code=2) from err
    _print_report(console, report)
    raise typer.Exit(code=0 if report.passed else 1)


def _print_report(console, report) -> None:
    from rich.table import Table

    tol = report.effective_tolerance

    def mark(err: float) -> str:
        return f"{err:.2e}" if err <= tol else f"[red]{err:.2e}[/]"

    table = Table(title=f"verify {report.checkpoint} vs transformers ({report.reference_dtype})")
    for col in ("positions", "max |Δlogit|", "our token", "ref argmax", "ref top-2 gap"):
        table.add_column(col, justify="right")
    P = len(report.prompt)
    if P > 1:
        table.add_row(f"prefill 0..{P - 2}", mark(float(report.prefill_err[:-1].max())), "", "", "")
    table.add_row(
        f"prefill {P - 1} (→ g0)", mark(float(report.prefill_err[-1])), str(report.ours[0]),
        str(report.ref_argmax[0]), f"{report.ref_gap[0]:.3g}",
    )  # fmt: skip
    for k, err in enumerate(report.decode_err, start=1):
        table.add_row(
            f"decode {k} (pos {P + k - 1})", mark(float(err)), str(report.ours[k]),
            str(report.ref_argmax[k]), f"{report.ref_gap[k]:.3g}",
        )  # fmt: skip
    console.print(table)
    for note in report.notes:
        console.print(f"[yellow]note:[/] {note}")
    n = len(report.ours)
    verdict = "[green]PASS[/]" if report.passed else "[red]FAIL[/]"
    if report.f32_floor is None:
        rule = f"tolerance {tol:.2e}"
    else:
        rule = (
            f"transformers float32 vs float64 on the same positions {report.f32_floor:.2e}; "
            f"tolerance max({report.tolerance:g}, 2 × {report.f32_floor:.2e}) = {tol:.2e}"
        )
    console.print(
        f"{verdict}: max |Δlogit| {report.max_err:.2e} ({rule}); greedy agreement "
        f"{report.agreement}/{n}"
        + (f" ({report.near_tie_disagreements} at near-ties)" if report.near_tie_disagreements else "")
    )
