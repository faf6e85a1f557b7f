"""The mixed (ragged) step: every decoding slot's next token and prefill pieces of several prompts in one call.

    first = engine.step(tokens, positions, active, [Piece(slot=3, tokens=chunk, start=0, sampling=p)])

A call carries two segments through one forward pass (g4bench/model/forward.py's
`forward_segments`): the decode rows [max_slots, 1] as in `Engine.decode`, and the prefill
*pieces*: each prompt chunk is cut into rows of `PIECE_TOKENS` tokens, every row with its own start
position and its slot's block tables, so a 200-token chunk is 7 rows and a 20-token agent-turn
suffix one. Every piece's K/V is written before any piece reads (paged layout), so the pieces of one
chunk attend to each other exactly as one prefill call's positions do. The number of piece rows is
padded to a row bucket (powers of two up to the token budget's rows), so the compiled shapes are
row buckets × KV buckets.

    Piece  --pack-->  PackedRows (i32[P, PIECE_TOKENS] tokens, start, n_valid, slot per row;
                      the row that ends each sampled piece)  --mixed_step-->  (cache, piece logits,
                      decode next ids, piece next ids)

A piece with `sampling` is its prompt's last chunk: its last row samples the request's first token
(the engine installs the slot's sampling settings first, as `prefill` does). The token budget
(`EngineConfig.max_batched_tokens`, vLLM's `--max-num-batched-tokens`) counts decode rows plus piece
rows × PIECE_TOKENS; the scheduler fills it (g4bench/engine/mixed_turn.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np

from g4bench.engine.sampling import SamplingParams, sample
from g4bench.model.forward import Segment, forward_segments

PIECE_TOKENS = 32  # tokens per piece row: small enough that a short suffix wastes little padding
# Prompts that may finish (sample a first token) in one call. Only those pieces' last rows get
# logits — the LM head and sampler over the whole vocabulary cost ≈ a decode row each (on the
# CPU ≈ 4 ms for `small`), so computing them for every piece row would tax each call — and only
# they run the KV-shared layers past their K/V writes. The scheduler plans within it.
SAMPLED_PER_STEP = 4


@dataclass(frozen=True)
class Piece:
    """A prefill chunk of one prompt: `tokens` (1..chunk_size) written at positions start.. of `slot`;
    `sampling` on the prompt's last chunk (its first token is sampled from the last position)."""

    slot: int
    tokens: Sequence[int]
    start: int
    sampling: SamplingParams | None = None


def piece_rows(n_tokens: int, piece_tokens: int = PIECE_TOKENS) -> int:
    """Rows a chunk of `n_tokens` occupies."""
    return -(-n_tokens // piece_tokens)


def row_buckets(
    max_batched_tokens: int, chunk_size: int, piece_tokens: int = PIECE_TOKENS
) -> tuple[int, ...]:
    """Piece-row counts a mixed call may have: powers of two up to the budget's rows (at least one
    whole chunk's rows, so any single chunk fits)."""
    top = max(piece_rows(max_batched_tokens, piece_tokens), piece_rows(chunk_size, piece_tokens))
    sizes, n = [], 1
    while n < top:
        sizes.append(n)
        n *= 2
    return (*sizes, top)


@dataclass(frozen=True)
class PackedRows:
    """Pieces as padded rows: tokens i32[P, piece], start/n_valid/slots i32[P] (padding rows have
    n_valid 0 and slot 0); `sampled_rows` {slot: row} of each piece that samples, and `pick`
    i32[sampled_slots(P)] those rows in piece order (padded with row 0): where logits are computed."""

    tokens: np.ndarray
    start: np.ndarray
    n_valid: np.ndarray
    slots: np.ndarray
    sampled_rows: dict[int, int]
    pick: np.ndarray

    def pick_index(self, slot: int) -> int:
        """Where `slot`'s sampled piece sits among the logit rows."""
        return list(self.sampled_rows).index(slot)


def sampled_slots(rows: int) -> int:
    """Logit rows of a mixed call with `rows` piece rows (a static shape)."""
    return min(rows, SAMPLED_PER_STEP)


def pack(pieces: Sequence[Piece], rows: int, piece_tokens: int = PIECE_TOKENS) -> PackedRows:
    """Cut each piece into rows of `piece_tokens` and pad the row count to `rows`."""
    tokens = np.zeros((rows, piece_tokens), np.int32)
    start, n_valid, slots = (np.zeros(rows, np.int32) for _ in range(3))
    sampled: dict[int, int] = {}
    r = 0
    for p in pieces:
        for at in range(0, len(p.tokens), piece_tokens):
            part = p.tokens[at : at + piece_tokens]
            if r >= rows:
                raise ValueError(f"pieces need more than {rows} rows")
            tokens[r, : len(part)] = part
            start[r], n_valid[r], slots[r] = p.start + at, len(part), p.slot
            r += 1
        if p.sampling is not None:
            sampled[p.slot] = r - 1
    k = sampled_slots(rows)
    if len(sampled) > k:
        raise ValueError(f"{len(sampled)} pieces sample in one step; at most {k} with {rows} rows")
    pick = np.zeros(k, np.int32)
    pick[: len(sampled)] = list(sampled.values())
    return PackedRows(tokens, start, n_valid, slots, sampled, pick)


def check_pieces(pieces: Sequence[Piece], *, max_slots: int, chunk_size: int, max_len: int,
                 active: np.ndarray) -> int:  # fmt: skip
    """Rows the pieces need; ValueError naming the first bad piece (empty, too long, out of range,
    a slot twice, or a slot that also decodes in this call), or too many sampling pieces."""
    if sum(p.sampling is not None for p in pieces) > SAMPLED_PER_STEP:
        raise ValueError(f"more than {SAMPLED_PER_STEP} pieces sample a first token in one step")
    seen: set[int] = set()
    rows = 0
    for p in pieces:
        n = len(p.tokens)
        if not 0 < n <= chunk_size:
            raise ValueError(f"piece for slot {p.slot}: {n} tokens; must be 1..{chunk_size}")
        if not 0 <= p.slot < max_slots:
            raise ValueError(f"piece slot {p.slot} out of range 0..{max_slots - 1}")
        if p.start < 0 or p.start + n > max_len:
            raise ValueError(
                f"piece for slot {p.slot}: positions {p.start}..{p.start + n - 1} exceed max_len {max_len}"
            )
        if p.slot in seen:
            raise ValueError(f"slot {p.slot} has two pieces in one step")
        if active[p.slot]:
            raise ValueError(f"slot {p.slot} both decodes and prefills in one step")
        seen.add(p.slot)
        rows += piece_rows(n)
    return rows


def mixed_step(
    params, cache, sampling, tokens, positions, active, tables, p_tokens, p_start, p_valid, p_slots, p_pick,
    *, cfg, layout, cdt, kv_len, attention_block, sample_decode=True,
):  # fmt: skip
    """One forward over the decode rows and the piece rows → (cache, logits f32 [K, V] at the
    `p_pick` rows, decode output: next ids i32[S] (`sample_decode`) or logits f32[S, V], next ids
    i32[K] sampled at the `p_pick` rows)."""
    decode = Segment(tokens[:, None], positions, active.astype(jnp.int32), tables)
    piece_tables = {g: t[p_slots] for g, t in tables.items()}
    pieces = Segment(p_tokens, p_start, p_valid, piece_tables, logit_rows=p_pick)
    (d_logits, p_logits), cache = forward_segments(
        params, [decode, pieces], cache, cfg, layout, kv_len=kv_len, compute_dtype=cdt,
        attention_block=attention_block,
    )  # fmt: skip
    eos = cfg.eos_token_ids
    d_out = sample(d_logits, positions, sampling, eos) if sample_decode else d_logits
    p_state = jax.tree_util.tree_map(lambda x: x[p_slots[p_pick]], sampling)
    p_next = sample(p_logits, p_start[p_pick] + jnp.maximum(p_valid[p_pick], 1) - 1, p_state, eos)
    return cache, p_logits, d_out, p_next
