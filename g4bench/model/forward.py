"""The Gemma 4 E-series forward pass as one pure function.

    forward(params, tokens, start, n_valid, cache, cfg, layout, kv_len=..., all_logits=...) -> (logits, cache)

One code path serves prefill, chunked prefill and decode. Every row b of the batch carries a run of
T token slots starting at logical position `start[b]`, of which the first `n_valid[b]` are real (the
rest is padding, and a row with `n_valid == 0` is an idle decode slot). Real tokens' K/V are written
into that row's cache; padding is never written and never attended, so padding is invisible to the
output. A prefill of one prompt is B=1, T=bucket; a decode step is B=slots, T=1.

Per layer (HF `Gemma4TextDecoderLayer`; seed-engine-notes §1.3):

    x = rms(h)·w_in;  q = rope(rms(x Wq)·w_q);  k = rope(rms(x Wk)·w_k);  v = rms(x Wv)   (no v weight)
    a = softmax(q kᵀ · 1.0 + mask) v                         (scaling 1.0, no score softcap)
    h += rms(a Wo)·w_post_attn;  h += rms(down(gelu_tanh(gate x') · up x'))·w_post_ffw
    h += rms(ple_up(gelu_tanh(ple_gate h) · ple_i))·w_post_ple;  h *= layer_scalar

KV-shared layers (≥ first_kv_shared_layer) compute no K/V: they attend with the keys, values and
mask of the last KV-owning layer of their type in this same pass. Because they write nothing, a
prefill that only needs the next token runs them on the last real position alone (`all_logits=False`).

Key positions are logical: full-length caches index by position; a sliding ring holds position p in
entry p mod W, and each entry's position is recomputed from the row's start, so masks are exact
whatever the padding or bucket size (the reference engine's window-vs-padding bug cannot occur).
A paged cache (g4bench/model/paged_kv.py) is written and read through block tables, and returns
key positions the same way, so the masks below serve both layouts.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp

from g4bench.model.attention import attend, attend_blocked, visible_keys
from g4bench.model.config import FULL, SLIDING, ModelConfig
from g4bench.model.kv_cache import Cache, CacheLayout, entry_dtypes, quantize_kv
from g4bench.model.kv_cache import as_bits as _as_bits
from g4bench.model.kv_cache import from_bits as _from_bits
from g4bench.model.paged_kernels import PagedKernel
from g4bench.model.paged_kv import PagedKeys, paged_read, paged_write
from g4bench.model.quant import dequantize_ple_rows, unpack_w4a16


# ---------------------------------------------------------------------------- building blocks
def rms_norm(x: jax.Array, weight: jax.Array | None, eps: float) -> jax.Array:
    """x · (mean(x²) + eps)^-½ · w in f32, cast back (Gemma 4: x·w, not x·(1+w))."""
    xf = x.astype(jnp.float32)
    out = xf * jax.lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + eps)
    if weight is not None:
        out = out * weight.astype(jnp.float32)
    return out.astype(x.dtype)


def linear(x: jax.Array, lin: dict[str, jax.Array]) -> jax.Array:
    """x [..., in] → [..., out]; dense `w` [in, out] or W4A16 unpacked inside the step."""
    if "w" in lin:
        return jnp.einsum("...i,io->...o", x, lin["w"].astype(x.dtype))
    # The barrier ties the unpack to this call's input: without it XLA may hoist the unpacks of
    # many layers ahead of their use and hold their dense weights at once (temporaries).
    x, packed, scale = jax.lax.optimization_barrier((x, lin["packed"], lin["scale"]))
    w = unpack_w4a16(packed, scale, x.dtype)  # [out, in]
    return jnp.einsum("...i,oi->...o", x, w)


def rope_tables(
    positions: jax.Array, head_dim: int, theta: float, rotary_pairs: int
) -> tuple[jax.Array, jax.Array]:
    """cos, sin [B, T, head_dim] for `cat(freqs, freqs)` pairing (i, i + d/2); pairs ≥ rotary_pairs
    get frequency 0 (identity) — HF's "proportional" partial RoPE."""
    i = jnp.arange(head_dim // 2, dtype=jnp.float32)
    inv_freq = jnp.where(i < rotary_pairs, 1.0 / (theta ** (2.0 * i / head_dim)), 0.0)
    freqs = positions.astype(jnp.float32)[..., None] * inv_freq
    emb = jnp.concatenate([freqs, freqs], axis=-1)
    return jnp.cos(emb), jnp.sin(emb)


def apply_rope(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
    """x [B, T, heads, d]; cos/sin [B, T, d]."""
    half = x.shape[-1] // 2
    rotated = jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    return x * cos[:, :, None, :].astype(x.dtype) + rotated * sin[:, :, None, :].astype(x.dtype)


# ---------------------------------------------------------------------------- KV write + gather
def _store(k: jax.Array, v: jax.Array, quantized: bool) -> dict[str, jax.Array]:
    if not quantized:
        return {"k": k, "v": v}
    kq, ks = quantize_kv(k)
    vq, vs = quantize_kv(v)
    return {"k": kq, "v": vq, "ks": ks, "vs": vs}


def _write_full(
    entry: dict[str, jax.Array],
    new: dict[str, jax.Array],
    write_pos: jax.Array,
    rows: jax.Array | None,
    dtypes: dict[str, jnp.dtype],
) -> dict[str, jax.Array]:
    """Scatter new [B, kvh, T(, d)] at positions write_pos [B, T] of cache rows `rows` (None: row b
    is batch row b); out-of-range positions are dropped. Only the written positions are touched:
    the stored arrays hold 16-bit floats as bits (kv_cache.stored_dtype), so XLA updates them in place."""
    if rows is None:

        def put(cache_row: jax.Array, new_row: jax.Array, idx: jax.Array) -> jax.Array:
            return cache_row.at[:, idx].set(new_row, mode="drop")

        return {
            name: jax.vmap(put)(arr, _as_bits(new[name].astype(dtypes[name])), write_pos)
            for name, arr in entry.items()
        }
    out = {}
    for name, arr in entry.items():
        # advanced indices (rows, positions) come first: the update is [B, T, kvh(, d)]
        update = _as_bits(jnp.swapaxes(new[name], 1, 2).astype(dtypes[name]))
        out[name] = arr.at[rows[:, None], :, write_pos].set(update, mode="drop")
    return out


def _write_ring(
    entry: dict[str, jax.Array],
    new: dict[str, jax.Array],
    start: jax.Array,
    n_valid: jax.Array,
    dtypes: dict[str, jnp.dtype],
) -> dict[str, jax.Array]:
    """Ring entry r takes the newest real chunk token whose position ≡ r (mod W), else keeps its value."""
    W = entry["k"].shape[2]
    T = new["k"].shape[2]
    r = jnp.arange(W)[None, :]
    last = (start + n_valid - 1)[:, None]
    newest = last - jnp.mod(last - r, W)  # [B, W]
    take = newest >= start[:, None]
    j = jnp.clip(newest - start[:, None], 0, T - 1)

    def pick(old: jax.Array, chunk: jax.Array) -> jax.Array:
        idx = j.reshape(j.shape[0], 1, W, *([1] * (old.ndim - 3)))
        gathered = jnp.take_along_axis(chunk, idx, axis=2)
        keep = take.reshape(take.shape[0], 1, W, *([1] * (old.ndim - 3)))
        return jnp.where(keep, gathered, old)

    return {name: pick(entry[name], _as_bits(new[name].astype(dtypes[name]))) for name in entry}


def _ring_positions(start: jax.Array, W: int) -> jax.Array:
    """Logical position held by each ring entry before this chunk is written: [B, W] (< 0 = empty)."""
    last = (start - 1)[:, None]
    return last - jnp.mod(last - jnp.arange(W)[None, :], W)


def _update_and_read(
    entry: dict[str, jax.Array],
    new: dict[str, jax.Array],
    start: jax.Array,
    n_valid: jax.Array,
    positions: jax.Array,
    valid_q: jax.Array,
    write_pos: jax.Array,
    *,
    rows: jax.Array | None,
    ring: bool,
    kv_len: int,
    dtypes: dict[str, jnp.dtype],
) -> tuple[dict[str, jax.Array], dict[str, jax.Array], jax.Array, jax.Array]:
    """Write this call's K/V into one layer's cache and return what the layer attends over.

    Returns (updated cache entry, keys/values(/scales) [B, kvh, K(, d)], key positions [B, K],
    key valid [B, K]). A full-length cache is written first and its first kv_len positions read
    (stale positions beyond the sequence are excluded by the causal mask). A ring is read as its
    W entries before this chunk plus the chunk itself (W + T keys), then rewritten. The entry is
    stored (kv_cache.stored_dtype); what is read comes back in `dtypes` (kv_cache.entry_dtypes)."""
    if ring:
        W = entry["k"].shape[2]
        old = entry if rows is None else {name: arr[rows] for name, arr in entry.items()}
        kv = {
            name: jnp.concatenate(
                [_from_bits(old[name], dtypes[name]), new[name].astype(dtypes[name])], axis=2
            )
            for name in old
        }
        ring_pos = _ring_positions(start, W)
        key_pos = jnp.concatenate([ring_pos, positions], axis=1)
        key_ok = jnp.concatenate([ring_pos >= 0, valid_q], axis=1)
        updated = _write_ring(old, new, start, n_valid, dtypes)
        if rows is not None:
            updated = {name: entry[name].at[rows].set(updated[name]) for name in entry}
        return updated, kv, key_pos, key_ok
    written = _write_full(entry, new, write_pos, rows, dtypes)
    kv = {
        name: _from_bits(arr[:, :, :kv_len] if rows is None else arr[rows, :, :kv_len], dtypes[name])
        for name, arr in written.items()
    }
    B = positions.shape[0]
    key_pos = jnp.broadcast_to(jnp.arange(kv_len, dtype=jnp.int32)[None, :], (B, kv_len))
    return written, kv, key_pos, jnp.ones((B, kv_len), bool)


# ---------------------------------------------------------------------------- the pass
@dataclass(frozen=True)
class Segment:
    """One batch of rows of a call: tokens i32[B, T] at positions start[b] + t for t < n_valid[b],
    and (paged) the rows' block tables {group: i32[B, max_len // block_size]}."""

    tokens: jax.Array
    start: jax.Array
    n_valid: jax.Array
    tables: dict[str, jax.Array] | None = None
    # i32[K]: the rows whose last-token logits are wanted (None: every row). Rows not named still
    # write their K/V; from the first KV-shared layer on, only the named rows are computed.
    logit_rows: jax.Array | None = None

    @property
    def shape(self) -> tuple[int, int]:
        return self.tokens.shape[0], self.tokens.shape[1]


def forward(
    params: dict[str, Any],
    tokens: jax.Array,
    start: jax.Array,
    n_valid: jax.Array,
    cache: Cache,
    cfg: ModelConfig,
    layout: CacheLayout,
    *,
    kv_len: int | None = None,
    all_logits: bool = False,
    compute_dtype: Any = jnp.float32,
    rows: jax.Array | None = None,
    tables: dict[str, jax.Array] | None = None,
    attention_block: int | PagedKernel | None = None,
) -> tuple[jax.Array, Cache]:
    """Run the model over tokens i32[B, T] written at positions start[b] + t for t < n_valid[b].

    `kv_len` (static) bounds how much of each full-length cache is read: it must exceed every real
    position in this call; None reads the whole buffer. `rows` i32[B] maps batch rows to cache rows
    (a prefill of one slot in a many-slot cache: only that row's chunk positions are written and
    only its first kv_len positions read); None means cache row b is batch row b. A paged layout
    takes `tables` instead: {group: i32[B, max_len // block_size]}, the batch rows' block tables
    (g4bench/model/paged_kv.py). Returns logits f32 [B, T, V] if `all_logits` else [B, V] at each
    row's last real token, and the updated cache (rows with n_valid 0 unchanged).
    `attention_block` (static): attend over key blocks of that many keys, visiting only those some
    real query can see (model/attention.py's attend_blocked; the engine's CPU prefill and decode);
    None: one pass over every key read."""
    logits, cache = forward_segments(
        params, [Segment(tokens, start, n_valid, tables)], cache, cfg, layout, kv_len=kv_len,
        all_logits=all_logits, compute_dtype=compute_dtype, rows=rows, attention_block=attention_block,
    )  # fmt: skip
    return logits[0], cache


def forward_segments(
    params: dict[str, Any],
    segments: Sequence[Segment],
    cache: Cache,
    cfg: ModelConfig,
    layout: CacheLayout,
    *,
    kv_len: int | None = None,
    all_logits: bool = False,
    compute_dtype: Any = jnp.float32,
    rows: jax.Array | None = None,
    attention_block: int | PagedKernel | None = None,
    hidden: bool = False,
) -> tuple[list[jax.Array], Cache]:
    """`forward` over several segments in one pass (the mixed step: a decode segment [S, 1] and a
    segment of prefill pieces [P, piece]). Every linear runs once over all segments' token rows
    (flattened to [N, hidden]), so the weights are read once; each KV-owning layer writes every
    segment's K/V before any segment reads (paged), so a piece attends to the earlier pieces of its
    prompt written in the same call; attention runs per segment at its own shape. More than one
    segment needs the paged layout. Returns one logits array per segment (as `forward`'s), or with
    `hidden` the final-normed hidden states [K, hidden] that `lm_head` turns into them (so a caller
    can skip the head for rows it will not sample)."""
    if len(segments) > 1 and not layout.paged:
        raise ValueError("several segments in one call need the paged cache layout")
    if layout.paged and any(seg.tables is None for seg in segments):
        raise ValueError("a paged cache layout needs block tables")
    cdt = compute_dtype
    eps = cfg.rms_norm_eps
    kv_len = layout.max_len if kv_len is None else min(kv_len, layout.max_len)
    shapes = [seg.shape for seg in segments]
    positions = [
        seg.start[:, None] + jnp.arange(T, dtype=jnp.int32)[None, :]
        for seg, (_, T) in zip(segments, shapes, strict=True)
    ]
    valid_q = [
        jnp.arange(T)[None, :] < seg.n_valid[:, None] for seg, (_, T) in zip(segments, shapes, strict=True)
    ]
    flat_tokens = jnp.concatenate([seg.tokens.reshape(-1) for seg in segments])  # [N]

    embed = params["embed"]
    h = embed[flat_tokens].astype(cdt) * jnp.asarray(math.sqrt(cfg.hidden_size), embed.dtype).astype(cdt)
    ple = _per_layer_inputs(params, flat_tokens[None], h[None], cfg, cdt)[0] if cfg.has_ple else None

    def rope_for(pos: jax.Array) -> dict[str, tuple[jax.Array, jax.Array]]:
        out = {}
        for ltype, theta in ((SLIDING, cfg.rope_theta_sliding), (FULL, cfg.rope_theta_full)):
            if ltype in cfg.layer_types:
                i = cfg.layer_types.index(ltype)
                out[ltype] = rope_tables(pos, cfg.head_dim_of(i), theta, cfg.rotary_pairs(i))
        return out

    rope = rope_for(jnp.concatenate([p.reshape(-1) for p in positions]))  # [N, d] per layer type
    q_pos, q_ok, q_shapes = positions, valid_q, shapes
    new_cache = list(cache)
    dtypes = entry_dtypes(layout)  # what each stored cache array holds
    shared: dict[str, list[tuple]] = {}
    # flat index of each row's last real token
    offsets = [sum(B * T for B, T in shapes[:j]) for j in range(len(shapes))]
    keep = [
        jnp.arange(B) if seg.logit_rows is None else seg.logit_rows
        for seg, (B, _) in zip(segments, shapes, strict=True)
    ]
    out_shapes = [(int(k.shape[0]), 1) for k in keep]
    last_flat = jnp.concatenate([
        off + k * T + jnp.maximum(seg.n_valid[k] - 1, 0)
        for seg, k, (_, T), off in zip(segments, keep, shapes, offsets, strict=True)
    ])  # fmt: skip

    def last_of(x: list[jax.Array]) -> list[jax.Array]:
        """Per segment [B, T, ...] → [K, 1, ...] at each kept row's last real token."""
        return [
            xi[k, jnp.maximum(seg.n_valid[k] - 1, 0)][:, None]
            for xi, seg, k in zip(x, segments, keep, strict=True)
        ]

    for i, lp in enumerate(params["layers"]):
        if i == cfg.first_kv_shared_layer and cfg.num_kv_shared_layers and not all_logits:
            # Shared layers write no K/V: only each row's last real token's query matters from here on.
            h, ple = h[last_flat], (ple[last_flat] if ple is not None else None)
            rope = {t: (c[last_flat], s[last_flat]) for t, (c, s) in rope.items()}
            q_pos, q_ok, q_shapes = last_of(q_pos), last_of(q_ok), out_shapes
            # a segment that keeps every row reads the stored K/V as it is: taking "all rows" of a
            # contiguous cache would copy every row of it (a gather XLA does not elide on TPU)
            shared = {
                t: [
                    read if seg.logit_rows is None else _take_rows(read, k)
                    for read, k, seg in zip(reads, keep, segments, strict=True)
                ]
                for t, reads in shared.items()
            }
        ltype = cfg.layer_types[i]
        hd, nh = cfg.head_dim_of(i), cfg.num_attention_heads
        cos, sin = rope[ltype]

        x = rms_norm(h, lp["input_norm"], eps)
        q = apply_rope(
            rms_norm(linear(x, lp["q"]).reshape(1, -1, nh, hd), lp["q_norm"], eps), cos[None], sin[None]
        )[0]
        if cfg.owns_kv(i):
            kvh = cfg.kv_heads_of(i)
            k = apply_rope(
                rms_norm(linear(x, lp["k"]).reshape(1, -1, kvh, hd), lp["k_norm"], eps), cos[None], sin[None]
            )[0]
            v = rms_norm(linear(x, lp["v"]).reshape(-1, kvh, hd), None, eps)
            news = [
                _store(kj.transpose(0, 2, 1, 3), vj.transpose(0, 2, 1, 3), layout.quantized)
                for kj, vj in zip(_split(k, shapes), _split(v, shapes), strict=True)
            ]
            slot = cfg.kv_layers.index(i)
            reads = _update_and_read_segments(
                cache[slot], news, segments, positions, valid_q, layout=layout, cfg=cfg, layer=i,
                rows=rows, kv_len=kv_len, dtypes=dtypes,
            )  # fmt: skip
            new_cache[slot], seg_reads = reads
            if i == cfg.kv_store_layer(ltype):
                shared[ltype] = seg_reads
        else:
            seg_reads = shared[ltype]

        window = None if ltype == FULL else cfg.sliding_window
        attn = [
            _attend_segment(qj, kv, key_pos, key_ok, qp, qv, window, attention_block)
            for qj, (kv, key_pos, key_ok), qp, qv in zip(
                _split(q, q_shapes), seg_reads, q_pos, q_ok, strict=True
            )
        ]
        a = jnp.concatenate([aj.reshape(-1, aj.shape[-1]) for aj in attn])
        h = h + rms_norm(linear(a, lp["o"]), lp["post_attn_norm"], eps)

        x = rms_norm(h, lp["pre_ffw_norm"], eps)
        m = linear(jax.nn.gelu(linear(x, lp["gate"]), approximate=True) * linear(x, lp["up"]), lp["down"])
        h = h + rms_norm(m, lp["post_ffw_norm"], eps)

        if ple is not None:
            g = jax.nn.gelu(linear(h, lp["ple_gate"]), approximate=True) * ple[:, i, :]
            h = h + rms_norm(linear(g, lp["ple_up"]), lp["post_ple_norm"], eps)
        h = h * lp["layer_scalar"].astype(cdt)

    if not all_logits and h.shape[0] != last_flat.shape[0]:
        h = h[last_flat]
    h = rms_norm(h, params["final_norm"], eps)
    if hidden and not all_logits:
        return [x[:, 0] for x in _split(h, out_shapes)], new_cache
    per_seg = _split(lm_head(params, h, cfg, cdt), shapes if all_logits else out_shapes)
    return (per_seg if all_logits else [x[:, 0] for x in per_seg]), new_cache


def lm_head(params: dict[str, Any], h: jax.Array, cfg: ModelConfig, cdt: Any) -> jax.Array:
    """Final-normed hidden states [N, hidden] → logits f32 [N, V] (tied embedding, soft cap)."""
    logits = jnp.einsum("nh,vh->nv", h, params["embed"].astype(cdt), preferred_element_type=jnp.float32)
    if cfg.final_logit_softcapping:
        cap = cfg.final_logit_softcapping
        logits = jnp.tanh(logits / cap) * cap
    return logits


def _take_rows(read: tuple[Any, jax.Array, jax.Array], rows: jax.Array) -> tuple[Any, jax.Array, jax.Array]:
    """A segment's read (keys, key positions, validity) for batch rows `rows` only."""
    kv, key_pos, key_ok = read
    if isinstance(kv, PagedKeys):
        kv = PagedKeys(pools=kv.pools, ids=kv.ids[rows], dtypes=kv.dtypes, block_size=kv.block_size)
    else:
        kv = {name: arr[rows] for name, arr in kv.items()}
    return kv, key_pos[rows], key_ok[rows]


def _split(x: jax.Array, shapes: Sequence[tuple[int, int]]) -> list[jax.Array]:
    """Flat rows [N, ...] → one [B, T, ...] per segment of `shapes`."""
    out, at = [], 0
    for B, T in shapes:
        out.append(x[at : at + B * T].reshape(B, T, *x.shape[1:]))
        at += B * T
    return out


def _update_and_read_segments(
    entry: dict[str, jax.Array],
    news: list[dict[str, jax.Array]],
    segments: Sequence[Segment],
    positions: list[jax.Array],
    valid_q: list[jax.Array],
    *,
    layout: CacheLayout,
    cfg: ModelConfig,
    layer: int,
    rows: jax.Array | None,
    kv_len: int,
    dtypes: dict[str, jnp.dtype],
) -> tuple[dict[str, jax.Array], list[tuple[Any, jax.Array, jax.Array]]]:
    """Write every segment's K/V into one layer's cache, then read what each segment attends over:
    (updated entry, [(keys (dict or PagedKeys), key positions, key valid)] per segment)."""
    if not layout.paged:
        seg = segments[0]
        written, kv, key_pos, key_ok = _update_and_read(
            entry, news[0], seg.start, seg.n_valid, positions[0], valid_q[0],
            jnp.where(valid_q[0], positions[0], layout.max_len),  # padding goes out of range → dropped
            rows=rows, ring=layout.is_ring(cfg, layer), kv_len=kv_len, dtypes=dtypes,
        )  # fmt: skip
        return written, [(kv, key_pos, key_ok)]
    group = layout.group_of(cfg, layer)
    window = cfg.sliding_window if group == "window" else None
    bs = layout.block_size
    written = entry
    for seg, new, pos, ok in zip(segments, news, positions, valid_q, strict=True):
        assert seg.tables is not None  # checked on entry
        written = paged_write(written, new, seg.tables[group], pos, ok, block_size=bs, dtypes=dtypes)
    reads = []
    for seg in segments:
        assert seg.tables is not None
        reads.append(paged_read(written, seg.tables[group], seg.start, seg.shape[1], block_size=bs, kv_len=kv_len,
                                window=window, dtypes=dtypes))  # fmt: skip
    return written, reads


def _attend_segment(
    q: jax.Array,
    kv: Any,
    key_pos: jax.Array,
    key_ok: jax.Array,
    q_pos: jax.Array,
    valid_q: jax.Array,
    window: int | None,
    attention_block: int | PagedKernel | None,
) -> jax.Array:
    """One segment's attention: q [B, T, nh, d] over what it read → [B, T, nh·d]. A `PagedKernel`
    (model/paged_kernels.py) attends through the Pallas kernel, reading the pools in place."""
    if isinstance(attention_block, PagedKernel):
        return attention_block(q, kv, key_pos, q_pos, valid_q, window)
    # a paged read goes to the blocked attention ungathered when its blocks tile the attention's
    paged = (
        kv if isinstance(kv, PagedKeys) and attention_block and attention_block % kv.block_size == 0 else None
    )
    dense = {} if paged is not None else kv.gather() if isinstance(kv, PagedKeys) else kv
    keys, vals, kscale, vscale = (dense.get(name) for name in ("k", "v", "ks", "vs"))
    if attention_block:
        return attend_blocked(q, keys, vals, kscale, vscale, key_pos, key_ok, q_pos, valid_q,
                              window=window, block=attention_block, paged=paged)  # fmt: skip
    mask = visible_keys(key_pos, key_ok, q_pos, window)
    return attend(q, dense["k"], dense["v"], kscale, vscale, mask)


def _per_layer_inputs(
    params: dict[str, Any], tokens: jax.Array, h: jax.Array, cfg: ModelConfig, cdt: Any
) -> jax.Array:
    """PLE: (rms(h Wple · H^-½)·w + table[token] · √P) · 2^-½ → [B, T, L, P]. The table is gathered."""
    B, T = tokens.shape
    L, P = cfg.num_hidden_layers, cfg.hidden_size_per_layer_input
    table = params["ple_table"]
    if "w" in table:
        rows = table["w"][tokens]
        tok = rows.astype(cdt) * jnp.asarray(math.sqrt(P), rows.dtype).astype(cdt)
    else:
        tok = dequantize_ple_rows(table["q"][tokens], table["scale"][tokens], cdt) * math.sqrt(P)
    tok = tok.reshape(B, T, L, P)
    proj = (linear(h, params["ple_proj"]) * (cfg.hidden_size**-0.5)).reshape(B, T, L, P)
    proj = rms_norm(proj, params["ple_norm"], cfg.rms_norm_eps)
    return (proj + tok) * (2.0**-0.5)
