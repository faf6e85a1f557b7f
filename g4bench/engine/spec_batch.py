"""Speculative decoding for a batch of running requests: what `serve --draft-model --spec-k` runs.

    outcomes = spec.round([SpecRow(slot, owner, context, k, sampling, eos_banned_rows), ...])

One round, for every row at once (spec_decode.py is the one-request form this batches):

    DraftModel.propose      the draft `Engine` (its own KV, contiguous, full-length sliding KV)
                            catches up on the context tokens it has not seen (a prefill for a new
                            request, one batched decode after a round that kept every draft), then
                            k batched decodes: q_i = the target's sampling rule applied to the
                            draft's logits, d_i drawn from q_i on the host
    Verifier.verify_all     one target call: row `slot` writes [context[-1], d_0 … d_{k-1}] at
                            positions n−1 …, every other slot n_valid 0 (nothing written); f32
                            [S, k+1, V] logits, of which the rows' slots come to the host
    accept_draft            per row (speculative.py): the kept drafts and one corrected or bonus
                            token, distributed exactly as plain sampling from the target

`target_probs` is the host mirror of the engine's device sampler (sampling.py: temperature, top-k
and top-p within the `CANDIDATES` highest logits, EOS banned while `min_tokens` is unmet), so the
distribution speculation preserves is the one plain decoding samples from. Draws use
`np.random.default_rng((seed, position))`, so a request's round is reproducible.

A row's `k` may be below the decoder's (0: a plain decode row in the same call): the caller caps it
so the verify never writes past the request's last position. The target's K/V at rejected
positions sits beyond the context and is overwritten by the next round's writes; the caller's
layout must hold a chunk beyond the sliding window for that (the paged window does: W + chunk),
which `check_layout` enforces.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import jax.numpy as jnp
import numpy as np

from g4bench.engine.engine import Engine
from g4bench.engine.sampling import CANDIDATES, SamplingParams
from g4bench.engine.served_step import check_speculation
from g4bench.engine.spec_decode import Verifier
from g4bench.engine.speculative import accept_draft


def target_probs(
    logits: np.ndarray, params: SamplingParams, eos_banned_rows: int = 0, eos_ids: Sequence[int] = ()
) -> np.ndarray:
    """f32 [R, V] logits → f64 [R, V] next-token distributions under `params`, as the device sampler
    draws them (one-hot argmax when greedy). Rows j < `eos_banned_rows` give EOS ids no mass."""
    x = np.array(logits, np.float64, copy=True).reshape(-1, np.shape(logits)[-1])
    if eos_banned_rows and len(eos_ids):
        x[:eos_banned_rows, list(eos_ids)] = -np.inf
    out = np.zeros_like(x)
    if params.temperature == 0:
        np.put_along_axis(out, np.argmax(x, axis=-1)[:, None], 1.0, axis=-1)
        return out
    k = min(CANDIDATES, x.shape[-1])
    idx = np.argpartition(-x, k - 1, axis=-1)[:, :k]
    vals = np.take_along_axis(x, idx, axis=-1)
    order = np.argsort(-vals, axis=-1, kind="stable")
    idx, vals = np.take_along_axis(idx, order, axis=-1), np.take_along_axis(vals, order, axis=-1)
    scaled = vals / params.temperature
    if params.top_k > 0:
        scaled[:, params.top_k :] = -np.inf
    probs = _softmax(scaled)
    mass_before = np.cumsum(probs, axis=-1) - probs
    scaled = np.where(mass_before < params.top_p, scaled, -np.inf)
    np.put_along_axis(out, idx, _softmax(scaled), axis=-1)
    return out


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def _draw(rng: np.random.Generator, p: np.ndarray) -> int:
    return int(np.argmax(p)) if p.max() == 1.0 else int(rng.choice(len(p), p=p / p.sum()))


@dataclass(frozen=True)
class SpecRow:
    """One running request in a round. `context`: every token so far; the last one is sampled but
    not yet in the target's KV (it is written by this round). `owner` (the request id) tells the
    drafter when a slot changed hands."""

    slot: int
    owner: int
    context: Sequence[int]
    k: int
    sampling: SamplingParams
    eos_banned_rows: int = 0  # verify rows j < this ban EOS (the request's min_tokens is unmet there)


@dataclass(frozen=True)
class SpecOutcome:
    emitted: list[int]  # the kept drafts, then one corrected or bonus token
    kept: int
    drafted: int


def check_layout(engine: Engine, k: int) -> None:
    """ValueError unless `engine`'s step can run k drafts per round (served_step.check_speculation)."""
    e = engine.ecfg
    check_speculation(k, chunk_size=e.chunk_size, kv_layout=e.kv_layout, sliding_kv=e.sliding_kv)


class DraftModel:
    """A draft `Engine` that mirrors the target's slots: which request owns each, and how many of
    its context tokens the drafter holds K/V for."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        slots = engine.ecfg.max_slots
        self.owner = [-1] * slots
        self.written = [0] * slots

    def _catch_up(self, rows: Sequence[SpecRow]) -> None:
        """Bring every row's drafter KV to len(context) − 1 tokens."""
        e = self.engine
        single: list[SpecRow] = []
        for r in rows:
            if self.owner[r.slot] != r.owner:
                self.owner[r.slot], self.written[r.slot] = r.owner, 0
            lag = len(r.context) - 1 - self.written[r.slot]
            if lag == 1:
                single.append(r)
            elif lag > 1:
                start, todo = self.written[r.slot], list(r.context[self.written[r.slot] : -1])
                for s in range(0, len(todo), e.ecfg.chunk_size):
                    e.prefill(r.slot, todo[s : s + e.ecfg.chunk_size], start + s)
        if single:
            tokens, positions, active = self._inputs()
            for r in single:
                n = len(r.context)
                tokens[r.slot], positions[r.slot], active[r.slot] = r.context[n - 2], n - 2, True
            e.decode_logits(tokens, positions, active)
        for r in rows:
            self.written[r.slot] = len(r.context) - 1

    def _inputs(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        s = self.engine.ecfg.max_slots
        return np.zeros(s, np.int32), np.zeros(s, np.int32), np.zeros(s, bool)

    def propose(
        self, rows: Sequence[SpecRow], rngs: Sequence[np.random.Generator], eos_ids: Sequence[int]
    ) -> list[tuple[list[int], np.ndarray]]:
        """Per row: (its k drafts, their f64 [k, V] distributions q)."""
        self._catch_up(rows)
        drafts: list[list[int]] = [[] for _ in rows]
        qs: list[list[np.ndarray]] = [[] for _ in rows]
        for i in range(max((r.k for r in rows), default=0)):
            tokens, positions, active = self._inputs()
            live = [j for j, r in enumerate(rows) if r.k > i]
            for j in live:
                r = rows[j]
                tokens[r.slot] = r.context[-1] if i == 0 else drafts[j][-1]
                positions[r.slot], active[r.slot] = len(r.context) - 1 + i, True
            logits = self.engine.decode_logits(tokens, positions, active)
            host = np.asarray(logits[jnp.asarray([rows[j].slot for j in live])])
            for row_logits, j in zip(host, live, strict=True):
                r = rows[j]
                q = target_probs(row_logits[None], r.sampling, int(r.eos_banned_rows > i), eos_ids)[0]
                qs[j].append(q)
                drafts[j].append(_draw(rngs[j], q))
        for r in rows:
            self.written[r.slot] = len(r.context) - 1 + r.k
        V = self.engine.cfg.vocab_size
        return [(d, np.stack(q) if q else np.zeros((0, V))) for d, q in zip(drafts, qs, strict=True)]

    def keep(self, slot: int, n: int) -> None:
        """Only the first n context tokens of `slot` hold valid drafter K/V."""
        self.written[slot] = min(self.written[slot], n)


class SpecDecoder:
    """Target + draft engines and k: `round` runs one speculative step for a batch of rows."""

    def __init__(self, target: Engine, draft: Engine, k: int) -> None:
        check_layout(target, k)
        if draft.cfg.vocab_size != target.cfg.vocab_size:
            raise ValueError(
                f"the draft model's vocabulary ({draft.cfg.vocab_size}) differs from the target's "
                f"({target.cfg.vocab_size}): drafts must be the target's token ids"
            )
        if draft.ecfg.max_slots != target.ecfg.max_slots or draft.ecfg.max_len < target.ecfg.max_len:
            raise ValueError("the draft engine needs the target's slots and at least its max_len")
        self.target, self.k = target, k
        self.draft = DraftModel(draft)
        self.verifier = Verifier(target)
        self.eos_ids = tuple(sorted(target.eos_token_ids))

    def warmup(self) -> float:
        """Compile the draft engine's programs and the verify call at every KV bucket (n_valid 0:
        nothing is written); returns seconds."""
        t0 = time.perf_counter()
        self.draft.engine.warmup()
        e = self.target.ecfg
        T = self.k + 1
        for kv_len in e.kv_buckets:
            starts = np.full(e.max_slots, min(kv_len, e.max_len) - 1, np.int32)  # reads bucket kv_len
            zeros = np.zeros(e.max_slots, np.int32)
            np.asarray(self.verifier.verify_all(np.zeros((e.max_slots, T), np.int32), starts, zeros))
        return time.perf_counter() - t0

    def round(self, rows: Sequence[SpecRow]) -> list[SpecOutcome]:
        """One draft + verify + accept step for `rows` (distinct slots, each k ≤ self.k)."""
        if not rows:
            return []
        if any(not 0 <= r.k <= self.k for r in rows):
            raise ValueError(f"a row's k must be 0..{self.k}")
        rngs = [np.random.default_rng((r.sampling.seed % 2**32, len(r.context))) for r in rows]
        proposals = self.draft.propose(rows, rngs, self.eos_ids)
        e = self.target.ecfg
        T = self.k + 1
        tokens = np.zeros((e.max_slots, T), np.int32)
        starts, n_valid = np.zeros(e.max_slots, np.int32), np.zeros(e.max_slots, np.int32)
        for r, (drafts, _) in zip(rows, proposals, strict=True):
            tokens[r.slot, : r.k + 1] = [r.context[-1], *drafts]
            starts[r.slot], n_valid[r.slot] = len(r.context) - 1, r.k + 1
        logits = self.verifier.verify_all(tokens, starts, n_valid)
        host = np.asarray(logits[jnp.asarray([r.slot for r in rows])])
        out = []
        for r, (drafts, q), p_logits, rng in zip(rows, proposals, host, rngs, strict=True):
            p = target_probs(p_logits[: r.k + 1], r.sampling, r.eos_banned_rows, self.eos_ids)
            emitted, kept = accept_draft(p, q, np.asarray(drafts, np.int64), rng)
            self.draft.keep(r.slot, len(r.context) + kept)
            out.append(SpecOutcome(emitted, kept, r.k))
        return out
