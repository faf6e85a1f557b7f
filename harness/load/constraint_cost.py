"""What a JSON-schema constraint costs a decode step: TPOT with vs without it, same prompts, interleaved.

In one process (no HTTP: the transport costs both variants the same), on the server's engine and
scheduler. For each concurrency c and each round, the two variants run in a fresh random order:

    free   c requests, sampled at temperature 1, `ignore_eos`, exactly `max_tokens` tokens each;
    json   the same prompts and seeds under a JSON-Schema grammar: `LONG_SCHEMA` (an array with
           more items than `max_tokens` can hold, so every request also runs `max_tokens` tokens and
           is cut at the limit - the cost of the mask, not of shorter replies, is measured).
           With `budget=True`, the server's budget keeper instead (`grammar_budget.budgeted`,
           budget `max_tokens`, `CLOSING_SCHEMA`): its closing walk and forced close run, but a
           reply may close itself early (EOS), so replies are shorter and the batch thins out
           near the end - that ratio is biased low and is a smoke figure, not the verdict.

TPOT per request = (last token time - first token time) / (tokens - 1); a variant's figure in a
round is the median over its requests, and the verdict is the median over rounds of the per-round
ratio json / free (a ratio inside one round shares that round's host load: on a shared CPU the
absolute times drift, the ratio much less). Where the time goes, per constrained decode step:
`mask_fill_ms` (the worker thread computing the batch's bitmasks, overlapped with the device's
forward pass) and `mask_wait_ms` (how long the scheduler still waited for them after dispatching
the forward); the rest of the difference is the split step itself (a second dispatch, the bitmask
upload, the masked sampler).
"""

from __future__ import annotations

import json
import random
import statistics
import threading
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

from g4bench.engine.engine_config import EngineConfig
from g4bench.engine.grammar import compile_grammar, piece_vocab
from g4bench.engine.grammar_budget import budgeted, request_growth
from g4bench.engine.loading import load_engine
from g4bench.engine.sampling import SamplingParams
from g4bench.engine.scheduler import GenerationParams, RequestResult, Scheduler
from g4bench.server.synthetic_tokenizer import BOS_ID, EOS_ID, PAD_ID, SyntheticTokenizer

ROW = {"type": "object", "properties": {
    "id": {"type": "integer", "minimum": 0, "maximum": 9999},
    "name": {"type": "string", "minLength": 3, "maxLength": 12},
    "kind": {"enum": ["alpha", "beta", "gamma"]}, "ok": {"type": "boolean"}},
    "required": ["id", "name", "kind", "ok"], "additionalProperties": False}  # fmt: skip
LONG_SCHEMA = {"type": "object", "properties": {"rows": {"type": "array", "items": ROW, "minItems": 64}},
               "required": ["rows"], "additionalProperties": False}  # fmt: skip
CLOSING_SCHEMA = {"type": "object", "properties": {"rows": {"type": "array", "minItems": 1, "items": {
    "type": "object", "properties": {"id": {"type": "integer", "minimum": 0, "maximum": 9999}, "ok": {"type": "boolean"}},
    "required": ["id", "ok"], "additionalProperties": False}}}, "required": ["rows"], "additionalProperties": False}  # fmt: skip


@dataclass(frozen=True)
class CostSettings:
    model: str = "small"
    concurrencies: tuple[int, ...] = (1, 8)
    rounds: int = 5
    max_tokens: int = 64
    prompt_len: int = 128
    max_len: int = 512
    seed: int = 0
    budget: bool = False  # True: the budget keeper around the grammar, as the server runs it


@dataclass
class _Sink:
    times: list[float] = field(default_factory=list)
    done: threading.Event = field(default_factory=threading.Event)
    result: RequestResult | None = None

    def on_token(self, token: int, logprob=None) -> bool:
        return False

    def on_finish(self, result: RequestResult) -> None:
        self.result = result
        self.done.set()


def _tpot_ms(r: RequestResult) -> float:
    t = r.token_times_s
    return 1e3 * (t[-1] - t[0]) / (len(t) - 1)


def run_constraint_cost(s: CostSettings, log: Callable[[str], None] = lambda m: None) -> dict:
    """Measure (see the module docstring); returns one record with per-round figures and ratios."""
    engine, tok_dir = load_engine(s.model, EngineConfig(max_slots=max(s.concurrencies), max_len=s.max_len))
    if tok_dir is not None:
        raise ValueError("constraint-cost runs on synthetic models (the synthetic tokenizer's vocabulary)")
    V = engine.cfg.vocab_size
    tok = SyntheticTokenizer(V)
    vocab = piece_vocab([tok.piece(i).encode() for i in range(V)], EOS_ID, BOS_ID, [PAD_ID, EOS_ID, BOS_ID])
    fmt = {
        "type": "json_schema",
        "json_schema": {"schema": CLOSING_SCHEMA if s.budget else LONG_SCHEMA, "strict": True},
    }
    grammar = compile_grammar(fmt)
    assert grammar is not None
    growth = request_growth(fmt, None, None)

    def constraint():
        return budgeted(vocab.matcher(grammar), s.max_tokens, growth) if s.budget else vocab.matcher(grammar)

    sched = Scheduler(engine, max_waiting=max(s.concurrencies)).start()
    log("compiling the engine's programs (warm-up)")
    if not sched.wait_ready(3600):
        raise RuntimeError(f"engine warm-up failed: {sched.error!r}")
    rng = random.Random(s.seed)
    letters = "abcdefghijklmnopqrstuvwxyz "

    def batch(conc: int, constrained: bool, round_: int) -> tuple[list[float], float, float, int]:
        sinks = []
        masks = sched.agent.masks
        fill0, wait0, fills0 = (masks.fill_s, masks.wait_s, masks.fills) if masks else (0.0, 0.0, 0)
        for i in range(conc):
            prompt = tok.encode(
                "".join(random.Random(1000 * round_ + i).choice(letters) for _ in range(s.prompt_len)),
                add_bos=True,
            )
            sampling = SamplingParams(temperature=1.0, seed=1000 * round_ + i)
            params = (GenerationParams(s.max_tokens, sampling, constraint=constraint()) if constrained
                      else GenerationParams(s.max_tokens, sampling, ignore_eos=True))  # fmt: skip
            sinks.append(_Sink())
            sched.submit(prompt, params, sinks[-1])
        for sink in sinks:
            sink.done.wait()
        results = [k.result for k in sinks]
        least = 1 if constrained and s.budget else s.max_tokens  # the keeper's replies may close early
        if any(r is None or r.finish_reason not in ("length", "stop") or not least <= len(r.output_ids) <= s.max_tokens for r in results):  # fmt: skip
            raise RuntimeError(f"a request did not run {s.max_tokens} tokens: {[r and (r.finish_reason, len(r.output_ids)) for r in results]}")  # fmt: skip
        if constrained and s.budget:
            for r in results:
                assert r is not None
                json.loads(tok.decode([t for t in r.output_ids if t != EOS_ID]))  # closed within the budget
        masks = sched.agent.masks
        if masks is None:
            return [_tpot_ms(r) for r in results if r], 0.0, 0.0, 0
        return (
            [_tpot_ms(r) for r in results if r],
            masks.fill_s - fill0,
            masks.wait_s - wait0,
            masks.fills - fills0,
        )

    out: dict = {"settings": asdict(s), "levels": []}
    try:
        for conc in s.concurrencies:
            batch(conc, True, -1), batch(conc, False, -1)  # compile the split step and the batch shapes
            rounds = []
            for r in range(s.rounds):
                order = [True, False]
                rng.shuffle(order)
                fig: dict = {"order": ["json" if o else "free" for o in order]}
                for constrained in order:
                    tpots, fill, wait, fills = batch(conc, constrained, r)
                    key = "json" if constrained else "free"
                    fig[f"{key}_tpot_ms"] = statistics.median(tpots)
                    if constrained:
                        fig["mask_fill_ms_per_step"] = 1e3 * fill / max(fills, 1)
                        fig["mask_wait_ms_per_step"] = 1e3 * wait / max(fills, 1)
                fig["ratio"] = fig["json_tpot_ms"] / fig["free_tpot_ms"]
                rounds.append(fig)
                log(f"c={conc} round {r}: free {fig['free_tpot_ms']:.2f} ms, json {fig['json_tpot_ms']:.2f} ms, "
                    f"ratio {fig['ratio']:.3f}, mask fill {fig['mask_fill_ms_per_step']:.3f} ms/step, "
                    f"wait {fig['mask_wait_ms_per_step']:.3f} ms/step")  # fmt: skip
            med = {k: statistics.median(f[k] for f in rounds)
                   for k in ("free_tpot_ms", "json_tpot_ms", "ratio", "mask_fill_ms_per_step", "mask_wait_ms_per_step")}  # fmt: skip
            out["levels"].append({"concurrency": conc, "rounds": rounds, **{f"{k}_median": v for k, v in med.items()},
                                  "ratio_min": min(f["ratio"] for f in rounds),
                                  "ratio_max": max(f["ratio"] for f in rounds)})  # fmt: skip
    finally:
        sched.stop()
    return out
