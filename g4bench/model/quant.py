"""Quantized storage formats and their exact unpacking.

W4A16 (compressed-tensors "pack-quantized", symmetric int4, group 32): a linear layer of shape
[out, in] is stored as `packed` int32 [out, in/8] and `scale` bf16 [out, in/32]. Nibble i (bits
4i..4i+3) of word j holds input column 8j+i as the biased value q+8, q ∈ [-8, 7]. Dequantized:
w[o, c] = (nibble − 8) · scale[o, c // 32]. Packed words are integers end to end here; they never
pass through float32 (words above 2^24 would lose bits).

PLE table int8 / int4: one symmetric scale per (vocabulary row, 256-wide layer slice). int8 keeps
int8 [V, L·P]; int4 packs two biased nibbles per uint8 [V, L·P/2], the even column in the low nibble.
The table is gathered (one row per token), so only the gathered rows are unpacked.

Numpy functions (`pack_int4_np`, `quantize_*_np`) run on the host at load/init time; jnp functions
(`unpack_w4a16`, `dequantize_ple_rows`) run inside the jitted step.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np

W4A16_GROUP = 32
NIBBLES_PER_WORD = 8


# ---------------------------------------------------------------------------- W4A16 (host side)
def pack_int4_np(q: np.ndarray) -> np.ndarray:
    """q int [out, in] with values in [-8, 7] → int32 [out, in/8] (nibble i of word j = column 8j+i)."""
    out_dim, in_dim = q.shape
    if in_dim % NIBBLES_PER_WORD:
        raise ValueError(f"input dim {in_dim} is not a multiple of {NIBBLES_PER_WORD}")
    u = (
        (q.astype(np.int64) + 8)
        .astype(np.uint32)
        .reshape(out_dim, in_dim // NIBBLES_PER_WORD, NIBBLES_PER_WORD)
    )
    shifts = (4 * np.arange(NIBBLES_PER_WORD, dtype=np.uint32))[None, None, :]
    words = np.bitwise_or.reduce(u << shifts, axis=-1)
    return words.view(np.int32)


def unpack_int4_np(packed: np.ndarray) -> np.ndarray:
    """int32 [out, in/8] → int8 [out, in] in [-8, 7]."""
    u = packed.view(np.uint32)[..., None] >> (4 * np.arange(NIBBLES_PER_WORD, dtype=np.uint32))
    return ((u & 0xF).astype(np.int8) - 8).reshape(packed.shape[0], -1)


def dequantize_w4a16_np(packed: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """Dense weight [out, in] as compressed-tensors gives it: bf16(q · scale), returned widened to f32.
    (The f32 product is exact; rounding it once to bf16 is what a bf16 multiply does.)"""
    q = unpack_int4_np(packed).astype(np.float32)
    s = np.asarray(scale).astype(np.float32)
    group = q.shape[1] // s.shape[1]
    w = (q.reshape(q.shape[0], s.shape[1], group) * s[:, :, None]).reshape(q.shape)
    return w.astype(ml_dtypes.bfloat16).astype(np.float32)


def quantize_w4a16_np(w: np.ndarray, group: int = W4A16_GROUP) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric int4 min-max quantization of w [out, in] → (packed int32, scale bf16)."""
    out_dim, in_dim = w.shape
    g = w.astype(np.float32).reshape(out_dim, in_dim // group, group)
    scale = (np.abs(g).max(axis=-1) / 7.0).astype(ml_dtypes.bfloat16)
    s = np.where(scale.astype(np.float32) == 0, 1.0, scale.astype(np.float32))
    q = np.clip(np.round(g / s[:, :, None]), -8, 7).astype(np.int8).reshape(out_dim, in_dim)
    return pack_int4_np(q), scale


# ---------------------------------------------------------------------------- W4A16 (device side)
def unpack_w4a16(packed: jax.Array, scale: jax.Array, dtype: jnp.dtype) -> jax.Array:
    """int32 [out, in/8], bf16 [out, in/G] → dense [out, in] in `dtype` (inside jit; XLA fuses it).

    Values equal compressed-tensors' decompression, bf16(q · scale): the product is formed exactly
    in f32 and rounded once to bf16, then widened to `dtype`."""
    out_dim, words = packed.shape
    shifts = (4 * jnp.arange(NIBBLES_PER_WORD, dtype=jnp.uint32))[None, None, :]
    nibbles = (jax.lax.bitcast_convert_type(packed, jnp.uint32)[:, :, None] >> shifts) & 0xF
    q = nibbles.astype(jnp.int32) - 8  # [out, in/8, 8]
    groups = scale.shape[1]
    q = q.reshape(out_dim, groups, (words * NIBBLES_PER_WORD) // groups)
    if dtype == jnp.bfloat16:
        # Same values: bf16(q) is exact and a bf16 product is the exact product rounded once. No f32
        # [out, in] intermediates: compiled for TPU v6e those were materialized (u32 nibbles, f32
        # products), 0.7 GB of the decode step's temporaries at 170 slots.
        w = q.astype(jnp.bfloat16) * scale.astype(jnp.bfloat16)[:, :, None]
    else:
        w = (q.astype(jnp.float32) * scale.astype(jnp.float32)[:, :, None]).astype(jnp.bfloat16)
    return w.astype(dtype).reshape(out_dim, words * NIBBLES_PER_WORD)


# ---------------------------------------------------------------------------- PLE table
def quantize_ple_np(table: np.ndarray, bits: int, slice_width: int) -> tuple[np.ndarray, np.ndarray]:
    """table [V, L·P] (any float) → (q, scale bf16 [V, L]); q is int8 [V, L·P] for 8 bits or
    uint8 [V, L·P/2] (two biased nibbles, even column low) for 4 bits. Works in row chunks so a
    4.7 GB table never needs an f32 copy."""
    if bits not in (4, 8):
        raise ValueError(f"PLE bits must be 4 or 8, got {bits}")
    rows, cols = table.shape
    slices = cols // slice_width
    qmax = 127 if bits == 8 else 7
    q_out = np.empty((rows, cols if bits == 8 else cols // 2), np.int8 if bits == 8 else np.uint8)
    s_out = np.empty((rows, slices), ml_dtypes.bfloat16)
    chunk = max(1, (64 << 20) // (cols * 4))
    for r0 in range(0, rows, chunk):
        x = table[r0 : r0 + chunk].astype(np.float32).reshape(-1, slices, slice_width)
        s = (np.abs(x).max(axis=-1) / qmax).astype(ml_dtypes.bfloat16)
        sf = np.where(s.astype(np.float32) == 0, 1.0, s.astype(np.float32))
        q = np.clip(np.round(x / sf[:, :, None]), -qmax - (bits == 4), qmax).reshape(x.shape[0], cols)
        if bits == 8:
            q_out[r0 : r0 + chunk] = q.astype(np.int8)
        else:
            u = (q + 8).astype(np.uint8)
            q_out[r0 : r0 + chunk] = u[:, 0::2] | (u[:, 1::2] << 4)
        s_out[r0 : r0 + chunk] = s
    return q_out, s_out


def dequantize_ple_rows(q_rows: jax.Array, scale_rows: jax.Array, dtype: jnp.dtype) -> jax.Array:
    """Gathered rows (…, C or C/2) + scales (…, L) → dense (…, C) in `dtype`."""
    if q_rows.dtype == jnp.uint8:  # int4: two nibbles per byte, even column low
        lo = (q_rows & 0xF).astype(jnp.int32) - 8
        hi = (q_rows >> 4).astype(jnp.int32) - 8
        vals = jnp.stack([lo, hi], axis=-1).reshape(*q_rows.shape[:-1], q_rows.shape[-1] * 2)
    else:
        vals = q_rows.astype(jnp.int32)
    slices = scale_rows.shape[-1]
    vals = vals.reshape(*vals.shape[:-1], slices, vals.shape[-1] // slices).astype(dtype)
    return (vals * scale_rows.astype(dtype)[..., None]).reshape(*q_rows.shape[:-1], -1)
