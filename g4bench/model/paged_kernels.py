"""Paged attention as one Pallas kernel that reads the block pools where they lie (no gather).

    out = paged_attention(q, pools, block_ids, first_block, q_start, q_len, dtypes=entry_dtypes(layout),
                          window=512, scale=1.0)                      # [B, T, nh·hd]
    kernel = PagedKernel(interpret=True)    # forward(..., attention_block=kernel): the hook below

What it computes is `attention.attend` with the mask `visible_keys`: row b's T query slots sit at
positions q_start[b] + t, the first q_len[b] of them real; it attends over the keys of the blocks
`block_ids[b, j]` (the physical block of logical block first_block[b] + j, as paged_kv's read names
them), causal and within `window`, with optional soft cap and int8 per-token scales folded in.
Rows (or queries) that see no key return zeros, as `attend_blocked` does.

Why our own kernel and not JAX's (jax 0.10.2, jax/experimental/pallas/ops/tpu/):
- `ragged_paged_attention` takes one pool of K and V interleaved on the head axis,
  [pages, page_size, 2·kvh, hd]; ours are two pools [NB, kvh, bs, hd] (paged_kv.py), and building
  its layout from ours is a copy of every pool, every layer, every step: the 5 GB of temporaries
  this kernel exists to remove. Its `k_scale` / `v_scale` are Python floats (one scale per tensor),
  and our int8 KV has one bf16 scale per token and head.
- `paged_attention` takes [kvh, pages, page_size, hd] (free for Gemma 4's one KV head), but only
  decode (one query per row), and has no sliding window: a sliding layer's keys before the window
  would be attended.
So the kernel below follows ragged_paged_attention's design (block tables as scalar prefetch, pages
fetched by table, an online softmax over compute blocks of `pages_per_block` pages) over our layout.
tests/model/test_paged_kernels.py checks it in interpret mode against `attend` and, where their
layouts meet, against JAX's ragged_paged_attention.

Schedule (grid = rows B × kv heads × query blocks × compute blocks): a compute block is
`pages_per_block` pages, each fetched by its own BlockSpec whose index map reads `block_ids`, so
Pallas double-buffers the page DMAs. A row visits only the compute blocks between the first and the
last key any of its real queries can see (lo[b] .. hi[b], scalar-prefetched); outside that range the
index maps repeat the range's edge block, so no page is fetched again, and the body does nothing.
`cost_estimate` gives XLA that schedule's bytes and FLOPs (every row at its largest range), since
cost analysis cannot see inside the custom call.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from g4bench.model.kv_cache import from_bits
from g4bench.model.paged_kv import PagedKeys

NEG_INF = -1e30
LANES = 128  # the m / l scratch rows are one lane tile wide (Mosaic slices tiles, not lanes)
# Scalar-prefetch bytes one kernel call may take (block table + 5 per-row scalars, int32). TPU SMEM
# is 1 MiB per core; a full-length table of 512 blocks per row passes it at 512 rows (int8 KV with
# ring sliding KV fits ~620 rows at ctx 8192 on v6e), so larger batches run as several calls.
PREFETCH_BYTES = 512 * 1024


def compute_blocks(num_blocks: int, pages_per_block: int) -> int:
    """Compute blocks a read of `num_blocks` pages takes: ⌈num_blocks / pages_per_block⌉."""
    return -(-num_blocks // pages_per_block)


def visible_block_range(
    first_block: jax.Array, q_start: jax.Array, q_len: jax.Array, *, num_blocks: int, block_size: int,
    pages_per_block: int, window: int | None,
) -> tuple[jax.Array, jax.Array]:  # fmt: skip
    """(lo, hi) i32[B]: the compute blocks holding the first and the last key a real query of row b
    can see; hi < lo for a row with no real query."""
    top = q_start + q_len - 1  # the last real query's position
    bottom = jnp.zeros_like(q_start) if window is None else q_start - window + 1  # the first visible key
    base = first_block * block_size
    span = pages_per_block * block_size
    last_key = num_blocks * block_size - 1
    lo = jnp.clip(bottom - base, 0, last_key) // span
    hi = jnp.clip(top - base, 0, last_key) // span
    return lo.astype(jnp.int32), jnp.where(q_len > 0, hi, lo - 1).astype(jnp.int32)


def _widen(x: jax.Array, dtype: Any, compute_dtype: Any) -> jax.Array:
    """A loaded page (as stored) in the compute dtype: 16-bit floats reinterpreted from their bits
    in the kernel (reinterpreting the pool outside costs a copy of it on TPU), int8 through f32
    (Mosaic converts int8 to floats only via f32)."""
    x = from_bits(x, dtype)
    return (x.astype(jnp.float32) if x.dtype == jnp.int8 else x).astype(compute_dtype)


def _kernel(
    # scalar prefetch
    ids_ref, first_ref, start_ref, len_ref, lo_ref, hi_ref,
    # inputs: q, then P pages of k, P of v (P of ks, P of vs when int8)
    *refs: Any,
    pages: int, block_size: int, heads_per_kv: int, queries_per_block: int, num_blocks: int,
    window: int | None, soft_cap: float | None, scale: float, quantized: bool, compute_dtype: Any,
    kv_dtype: Any, scale_dtype: Any,
) -> None:  # fmt: skip
    """One grid step (b, h, qi, kj): fold compute block kj of row b's read, KV head h, into the
    online softmax of query block qi; write the output after the last compute block."""
    n_in = 1 + pages * (4 if quantized else 2)
    q_ref, page_refs = refs[0], refs[1:n_in]
    o_ref, m_ref, l_ref, acc_ref = refs[n_in:]
    k_refs, v_refs = page_refs[:pages], page_refs[pages : 2 * pages]
    ks_refs, vs_refs = (page_refs[2 * pages : 3 * pages], page_refs[3 * pages :]) if quantized else ((), ())
    b, qi, kj = pl.program_id(0), pl.program_id(2), pl.program_id(3)
    R = q_ref.shape[0]  # queries_per_block × heads_per_kv rows

    @pl.when(kj == 0)
    def _init() -> None:
        m_ref[...] = jnp.full(m_ref.shape, NEG_INF, jnp.float32)
        l_ref[...] = jnp.zeros(l_ref.shape, jnp.float32)
        acc_ref[...] = jnp.zeros(acc_ref.shape, jnp.float32)

    @pl.when((kj >= lo_ref[b]) & (kj <= hi_ref[b]))
    def _fold() -> None:
        q = q_ref[...].astype(compute_dtype)  # [R, hd]
        # lax.div, not //: Mosaic lowers floor division through `sign`, which needs a TPU as the default
        # device (a deviceless compile has none); these operands are never negative
        row = jax.lax.broadcasted_iota(jnp.int32, (R, block_size), 0)
        t = qi * queries_per_block + jax.lax.div(row, jnp.int32(heads_per_kv))
        q_pos = start_ref[b] + t  # [R, bs]
        q_ok = t < len_ref[b]
        scores, masks = [], []
        for p in range(pages):
            k = _widen(k_refs[p][...], kv_dtype, compute_dtype)  # [bs, hd]
            s = jax.lax.dot_general(q, k, (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32)
            s = s * scale
            if quantized:
                s = s * from_bits(ks_refs[p][...], scale_dtype).astype(jnp.float32)  # [1, bs] per-key scales
            if soft_cap is not None:
                s = soft_cap * jnp.tanh(s / soft_cap)
            j = kj * pages + p  # the page's index in the read
            k_pos = (first_ref[b] + j) * block_size + jax.lax.broadcasted_iota(jnp.int32, (R, block_size), 1)
            mask = q_ok & (k_pos <= q_pos) & (j < num_blocks)
            if window is not None:
                mask = mask & (k_pos > q_pos - window)
            scores.append(jnp.where(mask, s, NEG_INF))
            masks.append(mask)
        m_prev = m_ref[...]  # [R, LANES], every lane equal
        m_blk = functools.reduce(jnp.maximum, [s.max(axis=1, keepdims=True) for s in scores])
        m_new = jnp.maximum(m_prev, m_blk)
        corr = jnp.exp(m_prev - m_new)
        l_new = l_ref[...] * corr
        acc = acc_ref[...] * corr[:, :1]
        for p in range(pages):
            e = jnp.where(masks[p], jnp.exp(scores[p] - m_new[:, :1]), 0.0)  # [R, bs]
            l_new = l_new + e.sum(axis=1, keepdims=True)
            if quantized:
                e = e * from_bits(vs_refs[p][...], scale_dtype).astype(jnp.float32)
            v = _widen(v_refs[p][...], kv_dtype, compute_dtype)
            acc = acc + jnp.dot(e.astype(compute_dtype), v, preferred_element_type=jnp.float32)
        m_ref[...] = m_new
        l_ref[...] = l_new
        acc_ref[...] = acc

    @pl.when(kj == pl.num_programs(3) - 1)
    def _finish() -> None:
        norm = l_ref[...][:, :1]
        o_ref[...] = (acc_ref[...] / jnp.where(norm > 0, norm, 1.0)).astype(o_ref.dtype)


def paged_attention(
    q: jax.Array,
    pools: dict[str, jax.Array],
    block_ids: jax.Array,
    first_block: jax.Array,
    q_start: jax.Array,
    q_len: jax.Array,
    *,
    dtypes: dict[str, Any],
    window: int | None,
    soft_cap: float | None = None,
    scale: float = 1.0,
    pages_per_block: int = 8,
    queries_per_block: int | None = None,
    interpret: bool = False,
) -> jax.Array:
    """Attention of q [B, T, nh, hd] over one layer's paged K/V read; returns [B, T, nh·hd] in q's dtype.

    pools: the layer's pools as stored (kv_cache.stored_dtype): k, v [NB, kvh, bs, hd] and, int8,
    ks, vs [NB, kvh, bs]; `dtypes` what each holds (kv_cache.entry_dtypes). block_ids i32[B, nb]:
    the physical block of each logical block read; first_block i32[B]: the logical block of
    block_ids[:, 0]; q_start i32[B]: position of query 0; q_len i32[B]: real queries of each row.
    `interpret`: run in Pallas' TPU interpret mode (on any backend; the CPU tests)."""
    B, T, nh, hd = q.shape
    NB, kvh, bs, hd_k = pools["k"].shape
    nb = block_ids.shape[1]
    if hd_k != hd or nh % kvh or set(pools) not in ({"k", "v"}, {"k", "v", "ks", "vs"}):
        raise ValueError(
            f"paged_attention: q [{B}, {T}, {nh}, {hd}] does not fit pools "
            f"{ {name: tuple(x.shape) for name, x in pools.items()} }"
        )
    if pages_per_block < 1 or window is not None and window < 1:
        raise ValueError(f"pages_per_block ({pages_per_block}) and window ({window}) must be positive")
    rows_per_call = max(1, PREFETCH_BYTES // (4 * (nb + 5)))
    if rows_per_call < B:  # the block table would not fit SMEM: one call per group of rows
        def part(s: int) -> jax.Array:
            r = slice(s, s + rows_per_call)
            return paged_attention(
                q[r], pools, block_ids[r], first_block[r], q_start[r], q_len[r], dtypes=dtypes, window=window,
                soft_cap=soft_cap, scale=scale, pages_per_block=pages_per_block,
                queries_per_block=queries_per_block, interpret=interpret,
            )  # fmt: skip

        return jnp.concatenate([part(s) for s in range(0, B, rows_per_call)], axis=0)
    quantized = "ks" in pools
    n = nh // kvh
    P = min(pages_per_block, nb)
    nk = compute_blocks(nb, P)
    tq = queries_per_block or min(T, max(1, 256 // n))
    Tp = -(-T // tq) * tq
    R = tq * n
    # [B, T, kvh·n, hd] → [B, kvh, T·n, hd]: each (row, KV head) is one matrix of query rows
    qg = jnp.pad(q, ((0, 0), (0, Tp - T), (0, 0), (0, 0))).reshape(B, Tp, kvh, n, hd)
    qg = qg.transpose(0, 2, 1, 3, 4).reshape(B, kvh, Tp * n, hd)
    lo, hi = visible_block_range(first_block, q_start, q_len, num_blocks=nb, block_size=bs,
                                 pages_per_block=P, window=window)  # fmt: skip

    def page_map(p: int):
        def index(b, h, qi, kj, ids, first, start, qlen, lo_ref, hi_ref):
            kc = jnp.clip(kj, lo_ref[b], jnp.maximum(hi_ref[b], lo_ref[b]))  # outside: the edge, no new DMA
            return ids[b, jnp.minimum(kc * P + p, nb - 1)], h, 0, 0

        return index

    def q_map(b, h, qi, kj, *_):
        return b, h, qi, 0

    kv_spec = [pl.BlockSpec((None, None, bs, hd), page_map(p)) for p in range(P)]
    operands = [pools["k"]] * P + [pools["v"]] * P  # as stored: the kernel reinterprets what it loads
    in_specs = [pl.BlockSpec((None, None, R, hd), q_map), *kv_spec, *kv_spec]
    if quantized:  # scales as [NB, kvh, 1, bs]: a (1, bs) tile per page
        sc_spec = [pl.BlockSpec((None, None, 1, bs), page_map(p)) for p in range(P)]
        in_specs += sc_spec + sc_spec
        for name in ("ks", "vs"):
            operands += [pools[name].reshape(NB, kvh, 1, bs)] * P
    kv_item = jnp.dtype(dtypes["k"]).itemsize
    pages_read = min(nb, compute_blocks(window + Tp - 1, bs) + 1) if window is not None else nb
    page_bytes = 2 * bs * hd * kv_item + (2 * bs * jnp.dtype(dtypes["ks"]).itemsize if quantized else 0)
    keys = pages_read * bs
    cost = pl.CostEstimate(
        flops=4 * B * kvh * Tp * n * keys * hd,
        transcendentals=B * kvh * Tp * n * keys,
        bytes_accessed=B * kvh * pages_read * page_bytes + 2 * qg.size * qg.dtype.itemsize,
    )
    kernel = functools.partial(
        _kernel, pages=P, block_size=bs, heads_per_kv=n, queries_per_block=tq, num_blocks=nb, window=window,
        soft_cap=soft_cap, scale=scale, quantized=quantized, compute_dtype=q.dtype, kv_dtype=jnp.dtype(dtypes["k"]),
        scale_dtype=jnp.dtype(dtypes["ks"]) if quantized else None,
    )  # fmt: skip
    out = pl.pallas_call(
        kernel,
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=6,
            grid=(B, kvh, Tp // tq, nk),
            in_specs=in_specs,
            out_specs=pl.BlockSpec((None, None, R, hd), q_map),
            scratch_shapes=[
                pltpu.VMEM((R, LANES), jnp.float32),
                pltpu.VMEM((R, LANES), jnp.float32),
                pltpu.VMEM((R, hd), jnp.float32),
            ],
        ),
        out_shape=jax.ShapeDtypeStruct(qg.shape, q.dtype),
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "parallel", "parallel", "arbitrary")
        ),
        cost_estimate=cost,
        interpret=pltpu.InterpretParams() if interpret else False,
        name="g4bench_paged_attention",
    )(block_ids.astype(jnp.int32), first_block.astype(jnp.int32), q_start.astype(jnp.int32),
      q_len.astype(jnp.int32), lo, hi, qg, *operands)  # fmt: skip
    out = out.reshape(B, kvh, Tp, n, hd).transpose(0, 2, 1, 3, 4)[:, :T]
    return out.reshape(B, T, nh * hd)


@dataclass(frozen=True)
class PagedKernel:
    """The kernel as an attention choice (hashable: a jit static argument). Until the served step
    names attention implementations, forward takes one in place of `attention_block` and sends
    every paged read to `paged_attention`; a dense read there is an error, never a fallback."""

    pages_per_block: int = 8
    queries_per_block: int | None = None
    interpret: bool = False

    def __call__(self, q: jax.Array, paged: Any, key_pos: jax.Array, q_pos: jax.Array, q_valid: jax.Array,
                 window: int | None) -> jax.Array:  # fmt: skip
        """q [B, Tq, nh, hd] at positions q_pos [B, Tq] (contiguous per row), real where q_valid
        [B, Tq] (a prefix of each row); `paged` a paged_kv.PagedKeys with its key positions [B, K]."""
        if not isinstance(paged, PagedKeys):
            raise ValueError(
                f"the Pallas paged kernel reads a paged cache's pools, got {type(paged).__name__}"
            )
        return paged_attention(
            q, paged.pools, paged.ids, key_pos[:, 0] // paged.block_size, q_pos[:, 0],
            q_valid.sum(axis=1, dtype=jnp.int32), dtypes=paged.dtypes, window=window,
            pages_per_block=self.pages_per_block, queries_per_block=self.queries_per_block,
            interpret=self.interpret,
        )  # fmt: skip
