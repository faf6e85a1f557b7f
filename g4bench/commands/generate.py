"""`g4bench generate`: one generation, with prefill time and decode speed measured apart from compiles.

Data flow: `--model` → `load_model` (a preset/config with synthetic weights in the platform's
default format, or a checkpoint dir) → prompt ids (`--prompt` text through the synthetic
tokenizer for synthetic models or the checkpoint's tokenizer.json, with BOS; or `--input-len N`
deterministic random ids) → an `Engine` with `--batch` slots sized to prompt + output →
a warm-up run of the same generation compiles exactly the programs the timed run uses (reported
as compile time: first run minus steady run) → the timed run: each
slot's prompt prefilled chunk by chunk (prefill returns a host int on the last chunk, so the clock
stops after the device finished), then decode steps over all slots (each returns a numpy array:
synchronous too). Human output goes to stderr; the generated text (or ids) to stdout, one line per
sequence.
"""

from __future__ import annotations

from typing import Annotated

import typer

from g4bench.commands.options import MODEL_HELP, alias, renamed


def generate(
    model: Annotated[str, typer.Option(help=MODEL_HELP)] = "e2b",
    prompt: Annotated[str | None, typer.Option(help="Prompt text (BOS is prepended)")] = None,
    input_len: Annotated[
        int | None, typer.Option(help="Use N deterministic random prompt ids instead")
    ] = None,
    output_len: Annotated[int, typer.Option(help="Tokens to generate per sequence")] = 32,
    batch: Annotated[int, typer.Option(help="Run N copies of the prompt in N slots")] = 1,
    kv_dtype: Annotated[str, typer.Option(help="KV cache storage: bf16 | int8")] = "bf16",
    sliding_kv: Annotated[str, typer.Option(help="Sliding-layer KV: ring | full")] = "ring",
    chunk_size: Annotated[int, typer.Option(help="Prefill tokens per engine call")] = 256,
    temperature: Annotated[float, typer.Option(help="0 = greedy")] = 0.0,
    top_k: Annotated[int, typer.Option(help="0 = off")] = 0,
    top_p: Annotated[float, typer.Option(help="1.0 = off")] = 1.0,
    seed: Annotated[int, typer.Option(help="Sampling, prompt-id and synthetic-weight seed")] = 0,
    ignore_eos: Annotated[bool, typer.Option(help="Keep generating past EOS (fixed-length timing)")] = False,
    ids: Annotated[bool, typer.Option("--ids", help="Print token ids instead of text on stdout")] = False,
    prompt_tokens: Annotated[int | None, renamed("--prompt-tokens", "--input-len")] = None,
    max_tokens: Annotated[int | None, renamed("--max-tokens", "--output-len")] = None,
    draft_model: Annotated[
        str | None, typer.Option(help="Also decode speculatively with this draft model (batch 1)")
    ] = None,
    spec_k: Annotated[int, typer.Option(help="--draft-model: drafts per verify call")] = 3,
) -> None:
    """Generate once and report prefill ms and decode tok/s (compile time apart)."""
    from rich.console import Console
    from rich.markup import escape

    console = Console(stderr=True, soft_wrap=True)
    prompt_tokens, max_tokens = alias(input_len, prompt_tokens), alias(output_len, max_tokens)
    if (prompt is None) == (prompt_tokens is None):
        console.print("[red]give exactly one of --prompt TEXT or --input-len N[/]")
        raise typer.Exit(code=2)
    if max_tokens < 1 or batch < 1 or chunk_size < 1 or (prompt_tokens is not None and prompt_tokens < 1):
        console.print("[red]--output-len, --batch, --chunk-size and --input-len must be >= 1[/]")
        raise typer.Exit(code=2)
    if kv_dtype not in ("bf16", "int8") or sliding_kv not in ("ring", "full"):
        console.print("[red]--kv-dtype must be bf16|int8 and --sliding-kv ring|full[/]")
        raise typer.Exit(code=2)

    if draft_model is not None and (batch != 1 or top_k or top_p < 1.0 or spec_k < 1):
        console.print("[red]--draft-model needs --batch 1, no --top-k/--top-p, and --spec-k >= 1[/]")
        raise typer.Exit(code=2)

    import time

    import numpy as np

    from g4bench.engine.engine import Engine
    from g4bench.engine.engine_config import EngineConfig
    from g4bench.engine.loading import default_format, is_checkpoint, load_model
    from g4bench.engine.sampling import SamplingParams
    from g4bench.model.config import load_config
    from g4bench.model.params import param_bytes
    from g4bench.server.synthetic_tokenizer import ASCII_OFFSET, UNK_ID
    from g4bench.server.tokenizer import load_tokenizer

    try:
        sampling = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, seed=seed)
        if not is_checkpoint(model):
            cfg = load_config(model)
            console.print(
                f"[bold]{cfg.name}[/]: synthetic weights, {default_format(cfg).name}, "
                f"{param_bytes(cfg, default_format(cfg)) / 1e9:.2f} GB"
            )
    except (FileNotFoundError, ValueError) as err:
        console.print(f"[red]{type(err).__name__}:[/] {escape(str(err))}")
        raise typer.Exit(code=2) from err

    t0 = time.perf_counter()
    cfg, params, tok_dir = load_model(model, seed=seed)
    tokenizer = load_tokenizer(tok_dir, cfg.vocab_size)
    load_s = time.perf_counter() - t0
    if prompt is not None:
        ids_in = tokenizer.encode(prompt, add_bos=True)
    else:
        # Random ids: printable ASCII for the synthetic tokenizer, any non-special id for a real vocabulary.
        hi = UNK_ID if tok_dir is None else cfg.vocab_size
        assert prompt_tokens is not None  # exactly one of --prompt / --prompt-tokens (checked above)
        rng = np.random.default_rng(seed)
        ids_in = [cfg.bos_token_id, *rng.integers(ASCII_OFFSET + 32, hi, size=prompt_tokens - 1).tolist()]

    ecfg = EngineConfig(
        max_slots=batch,
        max_len=len(ids_in) + max_tokens,
        kv_dtype=kv_dtype,
        sliding_kv=sliding_kv,
        chunk_size=min(chunk_size, len(ids_in)),
    )
    engine = Engine(cfg, params, ecfg)
    console.print(
        f"loaded in {load_s:.1f} s; prompt {len(ids_in)} tokens × batch {batch}, "
        f"{max_tokens} new tokens; KV {engine.kv_cache_bytes / 1e6:.1f} MB ({kv_dtype}, sliding {sliding_kv}); "
        f"compute {np.dtype(engine.compute_dtype).name}"
    )
    # Warm-up: the same generation once (EOS ignored, so every decode position and KV bucket the
    # timed run can reach is compiled); its time is compiles plus one run.
    t0 = time.perf_counter()
    engine.generate([ids_in] * batch, max_tokens, sampling, ignore_eos=True)
    first_s = time.perf_counter() - t0

    run = engine.generate([ids_in] * batch, max_tokens, sampling, ignore_eos=ignore_eos)
    steady_s = run.prefill_s + run.decode_s
    console.print(
        f"first run (compiles + one run): {first_s:.1f} s; steady run {steady_s:.2f} s "
        f"(compile ≈ {max(first_s - steady_s, 0.0):.1f} s)"
    )
    steps = len(run.step_s)
    console.print(
        f"prefill: {run.prefill_s * 1e3:.1f} ms for {batch} × {len(ids_in)} tokens "
        f"({run.prefill_s * 1e3 / batch:.1f} ms per sequence, "
        f"{batch * len(ids_in) / run.prefill_s:.0f} tok/s)"
    )
    if steps:
        console.print(
            f"decode: {steps} steps in {run.decode_s * 1e3:.1f} ms "
            f"({run.decode_s * 1e3 / steps:.1f} ms/step median {np.median(run.step_s) * 1e3:.1f}), "
            f"{run.decode_tokens / run.decode_s:.1f} tok/s aggregate at batch {batch}"
        )
    if draft_model is not None:
        from g4bench.commands.spec_generate import run_speculative

        run_speculative(cfg, params, ecfg, ids_in, run.outputs[0], max_tokens, draft_model=draft_model, k=spec_k,
                        temperature=temperature, seed=seed, ignore_eos=ignore_eos, console=console)  # fmt: skip
    for out in run.outputs:
        typer.echo(" ".join(map(str, out)) if ids else tokenizer.decode(out))
