"""Speculative decoding over the engine: draft k tokens, verify k+1 in one target call, accept.

    result = speculative_generate(target, ModelProposer(draft_engine), prompt, max_tokens, k=3)

Data flow of one round, for a context of n tokens whose first n−1 are in the target's KV cache:

    draft, q = proposer.propose(context, k)          k tokens and the distributions they came from
    p = Verifier.verify(slot, [context[-1], *draft], start=n−1)      one target call, k+1 logits rows
    emitted, kept = accept_draft(p, q, draft)        g4bench/engine/speculative.py
    context += emitted                               only accepted tokens go on; the target's KV
                                                     now holds positions ..n−1+kept (the rest of
                                                     the verify's writes sit beyond the context
                                                     and are overwritten by the next round)

The verify call is the prefill program with every position's logits (`forward(all_logits=True)`,
one slot, a chunk bucket of k+1 tokens); it uses the engine's public state (params, cache, block
tables, layout, buckets) and no engine.py change. `Verifier.verify_all` is the batch version
(up to k+1 query tokens for every slot in one step): what the server's speculative rounds run
(spec_batch.py), what `plan --spec-k` prices
(harness/sim/speculative.py) and harness/calibrate/verify_steps.py times. Grammars: see
`speculative_generate`'s `constraint`.

Proposers: `ModelProposer` drafts with a second `Engine` over any model with the target's vocab
(the classic two-model scheme; it keeps its own KV and rolls back to the kept prefix). The Gemma 4
assistant drafter (g4bench/model/drafter.py) needs the target's last hidden state and KV of its
store layers, which the engine's public API does not return today: it is not wired here.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from functools import partial
from typing import Protocol

import jax
import jax.numpy as jnp
import numpy as np

from g4bench.engine.engine import Engine
from g4bench.engine.engine_config import bucket_for, check_prefill
from g4bench.engine.grammar import GrammarMatcher
from g4bench.engine.speculative import accept_draft, probs_from_logits
from g4bench.model.forward import forward


def _verify_step(params, cache, tokens, start, n_valid, slot, tables, *, cfg, layout, cdt, kv_len,
                 attention_block):  # fmt: skip
    """`_prefill_step` keeping every position's logits: (cache, logits f32 [T, V])."""
    logits, cache = forward(
        params, tokens, start, n_valid, cache, cfg, layout, kv_len=kv_len, compute_dtype=cdt,
        all_logits=True, rows=None if layout.paged else slot[None], tables=tables,
        attention_block=attention_block,
    )  # fmt: skip
    return cache, logits[0]


def _verify_batch(
    params, cache, tokens, start, n_valid, tables, *, cfg, layout, cdt, kv_len, attention_block
):
    """Every slot k+1 tokens in one call (the batch cost `plan --spec-k` prices): (cache, [S, T, V])."""
    return forward(
        params, tokens, start, n_valid, cache, cfg, layout, kv_len=kv_len, compute_dtype=cdt, all_logits=True,
        tables=tables, attention_block=attention_block,
    )[::-1]  # fmt: skip


class Verifier:
    """Scores a run of tokens of one slot in one call and returns the logits at every position."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        bound = dict(cfg=engine.cfg, layout=engine.layout, cdt=engine.compute_dtype,
                     attention_block=engine.attention_block)  # fmt: skip
        donate = (1,) if engine.ecfg.donate else ()
        self._program = jax.jit(
            partial(_verify_step, **bound), static_argnames=("kv_len",), donate_argnums=donate
        )
        self._batch = jax.jit(
            partial(_verify_batch, **bound), static_argnames=("kv_len",), donate_argnums=donate
        )

    def verify(self, slot: int, tokens: list[int], start: int) -> np.ndarray:
        """Write `tokens` at positions start.. of `slot`; f32 [len(tokens), V] logits, row j being
        the next-token logits after position start + j."""
        e = self.engine
        n = check_prefill(e.ecfg, slot, tokens, start)
        chunk = bucket_for(n, e.ecfg.chunk_buckets)
        padded = np.zeros((1, chunk), np.int32)
        padded[0, :n] = tokens
        e.cache, logits = self._program(
            e.params, e.cache, jnp.asarray(padded), jnp.asarray([start], jnp.int32), jnp.asarray([n], jnp.int32),
            jnp.asarray(slot, jnp.int32), {g: jnp.asarray(t[slot : slot + 1].copy()) for g, t in e.tables.items()},
            kv_len=bucket_for(start + n, e.ecfg.kv_buckets),
        )  # fmt: skip
        return np.asarray(logits[:n])

    def verify_all(self, tokens: np.ndarray, starts: np.ndarray, n_valid: np.ndarray | None = None) -> jax.Array:
        """The batch verify step: every slot writes its first n_valid[s] tokens of tokens[s]
        (i32[max_slots, k+1]; n_valid None: all of them) at starts[s].. in one call; a slot with
        n_valid 0 writes nothing. Returns the f32 [max_slots, k+1, V] logits on the device (not yet
        computed)."""
        e = self.engine
        tokens = np.asarray(tokens, np.int32)
        if tokens.shape[0] != e.ecfg.max_slots:
            raise ValueError(f"verify_all needs one row per slot ({e.ecfg.max_slots}), got {tokens.shape[0]}")
        starts = np.asarray(starts, np.int32)
        n_valid = np.full(tokens.shape[0], tokens.shape[1], np.int32) if n_valid is None else np.asarray(n_valid, np.int32)
        if np.any(n_valid < 0) or np.any(n_valid > tokens.shape[1]):
            raise ValueError(f"verify_all: n_valid must be 0..{tokens.shape[1]}")
        top = max(1, int(np.max(starts + n_valid)))
        if top > e.ecfg.max_len:
            raise ValueError(f"verify_all: positions up to {top} exceed max_len {e.ecfg.max_len}")
        e.cache, logits = self._batch(
            e.params, e.cache, jnp.asarray(tokens), jnp.asarray(starts), jnp.asarray(n_valid),
            {g: jnp.asarray(t.copy()) for g, t in e.tables.items()}, kv_len=bucket_for(top, e.ecfg.kv_buckets),
        )  # fmt: skip
        return logits


class Proposer(Protocol):
    def propose(
        self, context: list[int], k: int, temperature: float, rng: np.random.Generator
    ) -> tuple[np.ndarray, np.ndarray]:
        """k drafted tokens after `context` and the [k, V] distributions they were sampled from."""
        ...

    def keep(self, n: int) -> None:
        """Only the first n context tokens stay valid (the rest were rejected drafts)."""
        ...


class ModelProposer:
    """Drafts with its own Engine (slot `slot`), feeding it only tokens it has not seen yet."""

    def __init__(self, engine: Engine, slot: int = 0) -> None:
        self.engine, self.slot, self.written = engine, slot, 0

    def _feed(self, tokens: list[int], start: int) -> None:
        chunk = self.engine.ecfg.chunk_size
        for s in range(0, len(tokens), chunk):
            self.engine.prefill(self.slot, tokens[s : s + chunk], start + s)

    def propose(
        self, context: list[int], k: int, temperature: float, rng: np.random.Generator
    ) -> tuple[np.ndarray, np.ndarray]:
        self._feed(context[self.written :], self.written)
        draft, qs = [], []
        for i in range(k):
            assert self.engine.last_logits is not None
            q = probs_from_logits(np.asarray(self.engine.last_logits).reshape(-1), temperature)
            tok = int(np.argmax(q)) if temperature == 0 else int(rng.choice(len(q), p=q))
            draft.append(tok)
            qs.append(q)
            if i < k - 1:
                self._feed([tok], len(context) + i)
        self.written = len(context) + k - 1
        return np.asarray(draft, np.int64), np.stack(qs)

    def keep(self, n: int) -> None:
        self.written = min(self.written, n)


@dataclass
class SpecResult:
    tokens: list[int] = field(default_factory=list)
    rounds: int = 0
    drafted: int = 0
    accepted: int = 0

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def mean_accept_length(self) -> float:
        """Tokens emitted per verify call (kept drafts + the corrected/bonus token)."""
        return (self.accepted + self.rounds) / self.rounds if self.rounds else 0.0


def speculative_generate(
    target: Engine,
    proposer: Proposer,
    prompt: list[int],
    max_tokens: int,
    *,
    k: int = 3,
    temperature: float = 0.0,
    seed: int = 0,
    slot: int = 0,
    ignore_eos: bool = False,
    rule: str = "residual",
    verifier: Verifier | None = None,
    constraint: GrammarMatcher | None = None,
) -> SpecResult:
    """Generate up to `max_tokens` tokens for `prompt` in `slot` of `target` (greedy at
    temperature 0: exactly the target's own greedy tokens). Sampling is on the host with
    `np.random.default_rng(seed)`, so runs are reproducible.

    With a grammar `constraint`, each verify row's target distribution is masked by the grammar
    state after the drafts before it, computed on a scratch copy of the matcher (`_fork`); the
    request's own matcher advances by the emitted tokens only, so a rejected draft never enters it.
    The drafter proposes unmasked: a draft the grammar forbids has p = 0 and is always rejected,
    which keeps the rejection rule exact."""
    if k < 1:
        raise ValueError(f"spec k must be >= 1, got {k}")
    if len(prompt) + max_tokens + k > target.ecfg.max_len:
        raise ValueError(f"{len(prompt)} + {max_tokens} + k={k} tokens exceed max_len {target.ecfg.max_len}")
    rng = np.random.default_rng(seed)
    verifier = verifier or Verifier(target)
    chunk = target.ecfg.chunk_size
    for s in range(0, len(prompt), chunk):
        target.prefill(slot, prompt[s : s + chunk], s)
    assert target.last_logits is not None
    p0 = probs_from_logits(
        _grammar_masked(np.asarray(target.last_logits).reshape(1, -1), constraint, []), temperature
    )[0]
    context = [*prompt, int(np.argmax(p0)) if temperature == 0 else int(rng.choice(len(p0), p=p0))]
    if constraint is not None:
        constraint.advance(context[-1])
    out = SpecResult(tokens=[context[-1]])
    eos = target.eos_token_ids

    def done() -> bool:
        return len(out.tokens) >= max_tokens or (not ignore_eos and out.tokens[-1] in eos)

    while not done():
        n = len(context)
        draft, q = proposer.propose(context, k, temperature, rng)
        logits = verifier.verify(slot, [context[-1], *draft.tolist()], n - 1)
        p = probs_from_logits(_grammar_masked(logits, constraint, draft.tolist()), temperature)
        emitted, kept = accept_draft(p, q, draft, rng, rule=rule)
        proposer.keep(n + kept)
        out.rounds, out.drafted, out.accepted = out.rounds + 1, out.drafted + k, out.accepted + kept
        for tok in emitted:
            if constraint is not None:
                constraint.advance(tok)  # only emitted tokens: the grammar allowed each of them
            context.append(tok)
            out.tokens.append(tok)
            if done():
                break
    return out


def _fork(m: GrammarMatcher) -> GrammarMatcher:
    """A scratch copy of a matcher (llguidance `deep_copy`); the original is untouched."""
    scratch = copy.copy(m)
    scratch._m = m._m.deep_copy()  # GrammarMatcher has no public fork yet
    return scratch


def _grammar_masked(logits: np.ndarray, constraint: GrammarMatcher | None, draft: list[int]) -> np.ndarray:
    """Rows j = 0..len(draft) of `logits` with ids the grammar forbids after draft[:j] set to −inf.
    Rows after a draft the grammar forbids are left unmasked: that draft is always rejected, so
    they are never used."""
    if constraint is None:
        return logits
    out = np.array(logits, np.float64, copy=True)
    scratch = _fork(constraint) if draft else constraint
    V = out.shape[-1]
    for j in range(out.shape[0]):
        allowed = scratch.next_mask()[:V]
        out[j, ~allowed] = -np.inf
        if j == len(draft) or not allowed[draft[j]]:
            break
        scratch.advance(draft[j])
    return out
