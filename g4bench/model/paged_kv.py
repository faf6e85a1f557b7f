"""Paged KV: write a call's K/V into a layer's block pool and gather what its queries attend over.

    written = paged_write(entry, new, table, positions, valid_q, block_size=16, dtypes=dtypes)
    kv, key_pos, key_ok = paged_read(written, table, start, T, block_size=16, kv_len=1024,
                                     window=None, dtypes=dtypes)

One call may write several batches of rows (decode rows, prefill pieces) before any of them reads
(g4bench/model/forward.py's forward_segments), so a piece sees the pieces of its prompt written in
the same call; `paged_update_and_read` is the one-batch composition.

A pool is [NB, kvh, bs(, hd)], 16-bit floats stored as their uint16 bits (kv_cache.stored_dtype:
XLA:CPU scatters into those in place, into bf16 it copies the pool). `table` i32[B, MB] maps row
b's logical block j (positions j·bs .. j·bs + bs − 1) to a physical block. Every real token at
logical position p goes to block table[b, p // bs], offset p % bs; padding gets the out-of-range
id NB and is dropped by the scatter.
The owner of a table guarantees that every position a real query can see is written and that no two
rows write one block (shared blocks are full and read-only; see g4bench/engine/block_cache.py).

Reads name whole blocks by table and return each key's logical position, so the caller's causal
and window masks are exact whatever the padding, bucket or block boundaries (the reference
engine's window-vs-padding bug cannot occur here either). Two read shapes:

- full: the first ⌈kv_len / bs⌉ logical blocks (entries past the sequence name the null block,
  and every key past it falls behind the causal mask);
- window (sliding layers whose sequences hold only the blocks their queries can still see): the
  nb = (W + T − 2) // bs + 2 logical blocks from (start − W + 1) // bs, which cover every key
  within W of a query at start .. start + T − 1. When that is no fewer blocks than the full read the
  full read is used instead (short contexts).

What comes back is a `PagedKeys`: the pools and the physical block of each logical block read,
not yet gathered. `gather()` makes the [B, kvh, nb·bs(, d)] arrays the one-pass attention takes (a
gather in plain JAX); key-blocked attention instead gathers one attention block's worth of pool
blocks at a time (`PagedKeys.block`), so a step reads only the blocks its queries can see and never
copies the whole bucket (g4bench/model/attention.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import jax
import jax.numpy as jnp

from g4bench.model.kv_cache import as_bits, from_bits


def window_read_blocks(window: int, tokens: int, block_size: int) -> int:
    """Logical blocks a window read gathers for a call of `tokens` query positions."""
    return (window + tokens - 2) // block_size + 2


def _gather(pool: jax.Array, ids: jax.Array, dtype: jnp.dtype) -> jax.Array:
    """pool [NB, kvh, bs(, d)] (stored), ids [B, nb] → [B, kvh, nb·bs(, d)] of `dtype`, gathered as
    stored (XLA:CPU would otherwise convert bf16 data on the way) and reinterpreted after."""
    g = jnp.moveaxis(pool[ids], 2, 1)  # [B, kvh, nb, bs(, d)]
    return from_bits(g.reshape(g.shape[0], g.shape[1], g.shape[2] * g.shape[3], *g.shape[4:]), dtype)


@dataclass(frozen=True)
class PagedKeys:
    """One layer's paged read before gathering: `pools` name → [NB, kvh, bs(, d)] as stored, `ids`
    i32[B, nb] the physical block of each logical block read, `dtypes` what each pool holds."""

    pools: dict[str, jax.Array]
    ids: jax.Array
    dtypes: dict[str, jnp.dtype]
    block_size: int

    @property
    def num_keys(self) -> int:
        return self.ids.shape[1] * self.block_size

    def gather(self) -> dict[str, jax.Array]:
        """Every key read: name → [B, kvh, nb·bs(, d)] of its dtype."""
        return {name: _gather(pool, self.ids, self.dtypes[name]) for name, pool in self.pools.items()}

    def block(self, name: str, first: jax.Array, size: int) -> jax.Array:
        """Keys first .. first + size − 1 of the read (both multiples of block_size): [B, kvh, size(, d)]."""
        bs = self.block_size
        ids = jax.lax.dynamic_slice_in_dim(self.ids, first // bs, size // bs, axis=1)
        return _gather(self.pools[name], ids, self.dtypes[name])


def paged_write(
    entry: dict[str, jax.Array],
    new: dict[str, jax.Array],
    table: jax.Array,
    positions: jax.Array,
    valid_q: jax.Array,
    *,
    block_size: int,
    dtypes: dict[str, jnp.dtype],
) -> dict[str, jax.Array]:
    """Write new [B, kvh, T(, d)] at `positions` [B, T] (where `valid_q`) of one layer's pools.
    `dtypes` names what each stored array holds (kv_cache.entry_dtypes)."""
    bs = block_size
    NB = entry["k"].shape[0]
    MB = table.shape[1]
    logical = jnp.clip(positions // bs, 0, MB - 1)
    blk = jnp.where(valid_q, jnp.take_along_axis(table, logical, axis=1), NB)  # padding → dropped
    off = positions % bs
    written = {}
    for name, arr in entry.items():
        # advanced indices (block, offset) around a slice: the update is [B, T, kvh(, d)]
        update = as_bits(jnp.swapaxes(new[name], 1, 2).astype(dtypes[name]))
        written[name] = arr.at[blk, :, off].set(update, mode="drop")
    return written


def paged_read(
    pools: dict[str, jax.Array],
    table: jax.Array,
    start: jax.Array,
    tokens: int,
    *,
    block_size: int,
    kv_len: int,
    window: int | None,
    dtypes: dict[str, jnp.dtype],
) -> tuple[PagedKeys, jax.Array, jax.Array]:
    """What a call of `tokens` query positions from `start` [B] reads of one layer's pools: a
    `PagedKeys` of K = nb·bs keys, their logical positions [B, K] and validity [B, K]."""
    bs = block_size
    B, MB = table.shape
    nb = min(MB, -(-kv_len // bs))
    base = jnp.zeros((B,), jnp.int32)
    if window is not None and window_read_blocks(window, tokens, bs) < nb:
        nb = window_read_blocks(window, tokens, bs)
        base = jnp.clip((start - window + 1) // bs, 0, MB - nb)
    idx = base[:, None] + jnp.arange(nb, dtype=jnp.int32)[None, :]  # [B, nb] logical blocks
    ids = jnp.take_along_axis(table, idx, axis=1)
    kv = PagedKeys(pools=pools, ids=ids, dtypes=dtypes, block_size=bs)
    key_pos = (idx[:, :, None] * bs + jnp.arange(bs, dtype=jnp.int32)[None, None, :]).reshape(B, nb * bs)
    return kv, key_pos, jnp.ones((B, nb * bs), bool)


def paged_update_and_read(
    entry: dict[str, jax.Array],
    new: dict[str, jax.Array],
    table: jax.Array,
    positions: jax.Array,
    valid_q: jax.Array,
    start: jax.Array,
    *,
    block_size: int,
    kv_len: int,
    window: int | None,
    dtypes: dict[str, jnp.dtype],
) -> tuple[dict[str, jax.Array], PagedKeys, jax.Array, jax.Array]:
    """`paged_write` then `paged_read` for one call: (written pools, keys, key positions, validity)."""
    written = paged_write(entry, new, table, positions, valid_q, block_size=block_size, dtypes=dtypes)
    kv, key_pos, key_ok = paged_read(written, table, start, positions.shape[1], block_size=block_size,
                                     kv_len=kv_len, window=window, dtypes=dtypes)  # fmt: skip
    return written, kv, key_pos, key_ok
