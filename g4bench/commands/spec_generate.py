"""`g4bench generate --draft-model NAME --spec-k K`: one speculative generation beside the plain one.

Data flow: the target engine `generate` already built (its plain run's tokens) → a second Engine
over the draft model (synthetic weights, seed + 1, so its drafts are not the target's) →
`speculative_generate` (g4bench/engine/spec_decode.py) on a fresh target engine → acceptance
metrics (acceptance rate, tokens per verify call) on stderr, and whether the tokens equal the plain
run's (at temperature 0 they must: the command exits 1 if not).
"""

from __future__ import annotations

from typing import Any

import typer


def run_speculative(
    cfg: Any, params: Any, ecfg: Any, prompt: list[int], plain: list[int], max_tokens: int, *,
    draft_model: str, k: int, temperature: float, seed: int, ignore_eos: bool, console: Any,
) -> list[int]:  # fmt: skip
    import time

    from g4bench.engine.engine import Engine
    from g4bench.engine.loading import load_model
    from g4bench.engine.spec_decode import ModelProposer, speculative_generate

    dcfg, dparams, _ = load_model(draft_model, seed=seed + 1)
    if dcfg.vocab_size != cfg.vocab_size:
        console.print(
            f"[red]--draft-model {draft_model}: vocab {dcfg.vocab_size} != target vocab {cfg.vocab_size}[/]"
        )
        raise typer.Exit(code=2)
    spec_ecfg = type(ecfg)(**{**ecfg.__dict__, "max_slots": 1, "max_len": ecfg.max_len + k})
    proposer = ModelProposer(Engine(dcfg, dparams, spec_ecfg))
    t0 = time.perf_counter()
    res = speculative_generate(Engine(cfg, params, spec_ecfg), proposer, prompt, max_tokens, k=k,
                               temperature=temperature, seed=seed, ignore_eos=ignore_eos)  # fmt: skip
    wall = time.perf_counter() - t0
    same = res.tokens == plain
    console.print(
        f"speculative (draft {dcfg.name}, k={k}): {res.rounds} verify calls, acceptance rate "
        f"{res.acceptance_rate:.3f} ({res.accepted}/{res.drafted} drafts), {res.mean_accept_length:.2f} tokens per "
        f"verify call; {wall:.2f} s including compiles; tokens {'identical to' if same else 'DIFFER from'} the plain run"
    )
    if temperature == 0 and not same:
        console.print("[red]greedy speculative tokens differ from plain greedy decoding[/]")
        raise typer.Exit(code=1)
    return res.tokens
