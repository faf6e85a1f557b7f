"""Grouped-query attention over what a layer read from its cache: one pass, or key blocks.

    a = attend(q, keys, vals, kscale, vscale, mask)                                   # one pass
    a = attend_blocked(q, keys, vals, kscale, vscale, key_pos, key_ok, q_pos, q_valid, window=W, block=256)

Both compute softmax(q kᵀ · 1.0 + mask) v per query (Gemma 4's scaling 1.0), int8 scales folded in,
without repeating K/V across the query heads of a group. `attend` materializes the [T, K] scores of
every head at once: right on accelerators, where one large fused product is fastest.
`attend_blocked` walks the keys `block` at a time with an online softmax (running max, normalizer
and f32 accumulator; FlashAttention's recurrence) and visits only the blocks that hold a key some
query can see. The engine uses it for prefill and decode on the CPU (g4bench/engine/engine.py),
where one pass costs twice over: a prefill chunk's [T, K] scores outgrow the caches (the small
model's full layer, 256 queries: one pass over a 3,072-key bucket 68 ms, 256-key blocks over the
2,200 keys the chunk needs 25 ms), and XLA:CPU widens the whole bf16 read to an f32 copy before
the products. Blocks slice the stored bits and widen one block at a time, and a paged read
(`paged=`, g4bench/model/paged_kv.py) is gathered from its pools one block at a time, so a step
reads only what its queries can see: the small model's paged decode step at batch 8 takes 75.8 ms
in blocks vs 111.6 ms in one pass over a 3,072-key bucket, 76.0 vs 74.6 ms at 512 keys
(docs/findings.md §3). A bucketed read is also up to 1.5× longer than
the keys the queries attend to.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from g4bench.model.kv_cache import as_bits, from_bits
from g4bench.model.paged_kv import PagedKeys

NEG_INF = -1e30


def attend(
    q: jax.Array,
    keys: jax.Array,
    vals: jax.Array,
    kscale: jax.Array | None,
    vscale: jax.Array | None,
    mask: jax.Array,
) -> jax.Array:
    """q [B, T, nh, d]; keys/vals [B, kvh, K, d] (any storage dtype); scales [B, kvh, K] or None;
    mask bool [B, T, K]. Returns [B, T, nh·d]."""
    B, T, nh, d = q.shape
    kvh = keys.shape[1]
    qg = q.reshape(B, T, kvh, nh // kvh, d)
    scores = jnp.where(mask[:, None, None, :, :], _scores(qg, keys, kscale), NEG_INF)
    probs = jax.nn.softmax(scores, axis=-1)
    if vscale is not None:
        probs = probs * vscale.astype(jnp.float32)[:, :, None, None, :]
    out = jnp.einsum("bgntk,bgkd->btgnd", probs.astype(q.dtype), vals.astype(q.dtype))
    return out.reshape(B, T, nh * d)


def _scores(qg: jax.Array, keys: jax.Array, kscale: jax.Array | None) -> jax.Array:
    """q·k f32 [B, kvh, n, T, K] of grouped queries qg [B, T, kvh, n, d], int8 key scales folded in."""
    scores = jnp.einsum("btgnd,bgkd->bgntk", qg, keys.astype(qg.dtype), preferred_element_type=jnp.float32)
    if kscale is not None:
        scores = scores * kscale.astype(jnp.float32)[:, :, None, None, :]
    return scores


def visible_keys(key_pos: jax.Array, key_ok: jax.Array, q_pos: jax.Array, window: int | None) -> jax.Array:
    """bool [B, T, K]: key k is visible to query t (valid, causal, and within `window` if given)."""
    mask = key_ok[:, None, :] & (key_pos[:, None, :] <= q_pos[:, :, None])
    if window is not None:
        mask = mask & (key_pos[:, None, :] > q_pos[:, :, None] - window)
    return mask


def attend_blocked(
    q: jax.Array,
    keys: jax.Array | None,
    vals: jax.Array | None,
    kscale: jax.Array | None,
    vscale: jax.Array | None,
    key_pos: jax.Array,
    key_ok: jax.Array,
    q_pos: jax.Array,
    q_valid: jax.Array,
    *,
    window: int | None,
    block: int,
    paged: PagedKeys | None = None,
) -> jax.Array:
    """`attend` with the mask `visible_keys(key_pos, key_ok, q_pos, window)`, computed over key
    blocks of `block` (the last one may overlap its predecessor; keys already counted are masked).

    Blocks run from the first to the last key visible to any real query (`q_valid` [B, T]) of the
    batch: a dynamic trip count, so the bucket's tail past the sequence and a window's keys that no
    query reaches cost nothing. Padding queries are computed over the same blocks (their output is
    never used); a query that sees no key there gets zeros.

    `paged` (keys … vscale None): a paged read (g4bench/model/paged_kv.py), gathered one block at a
    time from its pools (`block` a multiple of its block size), never whole."""
    B, T, nh, d = q.shape
    # The loop slices K/V as stored (16-bit floats as uint16 bits) and widens one block at a time:
    # a bf16 array carried into the loop would be widened to f32 whole on the way in by XLA:CPU,
    # which has no bf16 loop state (an f32 copy of every key and value read, each step).
    if paged is not None:
        if keys is not None or vals is not None or block % paged.block_size:
            raise ValueError(
                "a paged read takes no dense K/V and a block that is a multiple of its block size"
            )
        K, kvh, dtypes = paged.num_keys, paged.pools["k"].shape[1], paged.dtypes
        has = set(paged.pools)
    else:
        assert keys is not None and vals is not None
        operands = {"k": keys, "v": vals, "ks": kscale, "vs": vscale}
        stored = {name: as_bits(x) for name, x in operands.items() if x is not None}
        dtypes = {name: x.dtype for name, x in operands.items() if x is not None}
        K, kvh, has = keys.shape[2], keys.shape[1], set(stored)
    block = min(block, K)
    qg = q.reshape(B, T, kvh, nh // kvh, d)
    idx = jnp.arange(K, dtype=jnp.int32)
    top = jnp.max(jnp.where(q_valid, q_pos, -1))
    reach = key_ok & (key_pos <= top)
    if window is not None:
        bottom = jnp.min(jnp.where(q_valid, q_pos, top))
        reach = reach & (key_pos > bottom - window)
    reach = jnp.any(reach, axis=0)
    first = jnp.min(jnp.where(reach, idx, K))
    last = jnp.max(jnp.where(reach, idx, -1))
    lo, hi = first // block, jnp.where(last >= 0, last // block + 1, first // block)

    def step(j: jax.Array, carry: tuple[jax.Array, jax.Array, jax.Array]) -> tuple[jax.Array, ...]:
        m, norm, acc = carry
        s0 = jnp.minimum(j * block, K - block)  # clamped: the last block may overlap the one before

        def take(name: str) -> jax.Array:
            if paged is not None:
                return paged.block(name, s0, block)
            return from_bits(jax.lax.dynamic_slice_in_dim(stored[name], s0, block, axis=2), dtypes[name])

        scores = _scores(qg, take("k"), take("ks") if "ks" in has else None)
        kp = jax.lax.dynamic_slice_in_dim(key_pos, s0, block, axis=1)
        ok = jax.lax.dynamic_slice_in_dim(key_ok, s0, block, axis=1) & (s0 + jnp.arange(block) >= j * block)
        mask = visible_keys(kp, ok, q_pos, window)[:, None, None, :, :]
        scores = jnp.where(mask, scores, NEG_INF)
        m_new = jnp.maximum(m, scores.max(axis=-1))
        p = jnp.where(mask, jnp.exp(scores - m_new[..., None]), 0.0)
        corr = jnp.exp(m - m_new)
        pv = p if "vs" not in has else p * take("vs").astype(jnp.float32)[:, :, None, None, :]
        upd = jnp.einsum("bgntk,bgkd->bgntd", pv.astype(q.dtype), take("v").astype(q.dtype),
                         preferred_element_type=jnp.float32)  # fmt: skip
        return m_new, norm * corr + p.sum(axis=-1), acc * corr[..., None] + upd

    m0 = jnp.full((B, kvh, nh // kvh, T), NEG_INF, jnp.float32)
    init = (m0, jnp.zeros_like(m0), jnp.zeros((B, kvh, nh // kvh, T, d), jnp.float32))
    _, norm, acc = jax.lax.fori_loop(lo, hi, step, init)
    out = acc / jnp.where(norm > 0, norm, 1.0)[..., None]
    return jnp.moveaxis(out, 3, 1).reshape(B, T, nh * d).astype(q.dtype)
