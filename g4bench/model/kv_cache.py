"""The KV cache of the KV-owning layers, allocated once: contiguous (`slots × length`) or paged.

Only layers below the first KV-shared layer own K/V (E2B: 15 of 35); shared layers attend with their
source layer's keys. Per owning layer:

    k, v     [S, kvh, Li, hd]   bf16, or int8 with
    ks, vs   [S, kvh, Li]       bf16 scales (symmetric, one per token and head: amax / 127)

`Li` is `max_len` for full-attention layers. Sliding layers hold either the full length too
(`ring=False`) or a ring of exactly `sliding_window` entries (`ring=True`): position p lives in
entry p mod W, so memory per stream is bounded and a decode step reads at most W sliding keys.

The int8 scales are folded into attention (scores × k-scale, probabilities × v-scale); no
dequantized copy of the cache is ever materialized.

Paged (`paged=True`, g4bench/model/paged_kv.py): each owning layer holds one pool of fixed-size
blocks instead of per-slot rows,

    k, v     [NB, kvh, block_size, hd]     (ks, vs [NB, kvh, block_size] for int8)

and every sequence names its blocks through a block table (logical block j → physical id). Layers
fall into two groups with one table each: "full" (full-attention layers, and sliding layers when
`ring=False`) with `blocks` physical blocks, and "window" (sliding layers when `ring=True`) with
`window_blocks`: a sequence only holds the window blocks its queries can still see, so sliding
layers keep the ring's bound (about W + chunk positions per sequence). Block 0 of every pool is
the null block: never written, named by table entries a sequence does not hold (always masked).
Every cache array of 16-bit floats (bf16 K/V, the int8 layout's bf16 scales), paged or contiguous,
is *stored* as its uint16 bits (`stored_dtype`): XLA:CPU's scatter into a bf16 buffer, or into a
bitcast view of one, is not done in place even when the buffer is donated and copies all of it on
every call (measured on jax 0.10.2: 24 ms vs 0.005 ms for a 64 MiB pool; 106 ms vs 0.09 ms for a
one-position write into a [32, 1, 8192, 256] × 2 cache), while a scatter into uint16 is. A TPU
v6e compile gains too (a b32 decode step's XLA bytes accessed 6.28 → 2.51 GB; docs/findings.md
§3). Writers store `as_bits(x)`; readers reinterpret what they read
(`from_bits`), a free bitcast on every backend. `entry_dtypes` names what each stored array holds.
"""

from __future__ import annotations

from dataclasses import dataclass

import jax
import jax.numpy as jnp

from g4bench.model.config import ModelConfig

KV_DTYPES = {"bf16": jnp.bfloat16, "int8": jnp.int8, "f32": jnp.float32}
SCALE_DTYPE = jnp.bfloat16

Cache = list[dict[str, jax.Array]]


@dataclass(frozen=True)
class CacheLayout:
    """Static shape facts of a cache (hashable: a jit static argument)."""

    max_len: int
    kv_dtype: str = "bf16"
    ring: bool = False
    paged: bool = False
    block_size: int = 16
    blocks: int = 0  # paged: physical blocks per "full"-group pool, null block included
    window_blocks: int = 0  # paged: physical blocks per "window"-group pool (0: no window group)

    def __post_init__(self) -> None:
        if self.kv_dtype not in KV_DTYPES:
            raise ValueError(f"kv_dtype must be one of {sorted(KV_DTYPES)}, got {self.kv_dtype!r}")
        if self.paged and self.block_size < 1:
            raise ValueError(f"block_size must be positive, got {self.block_size}")
        if self.paged and self.blocks < 2:
            raise ValueError(
                f"a paged cache needs at least 2 blocks (one is the null block), got {self.blocks}"
            )

    @property
    def table_len(self) -> int:
        """Logical blocks per sequence (paged): ⌈max_len / block_size⌉."""
        return -(-self.max_len // self.block_size)

    def group_of(self, cfg: ModelConfig, layer: int) -> str:
        """Paged: which block table and pool size a layer uses ("full" or "window")."""
        return "window" if self.paged and self.is_ring(cfg, layer) and self.window_blocks else "full"

    @property
    def quantized(self) -> bool:
        return self.kv_dtype == "int8"

    def length_of(self, cfg: ModelConfig, layer: int) -> int:
        if self.ring and not cfg.is_full(layer):
            return min(cfg.sliding_window, self.max_len)
        return self.max_len

    def is_ring(self, cfg: ModelConfig, layer: int) -> bool:
        return self.ring and not cfg.is_full(layer) and cfg.sliding_window < self.max_len


def cache_specs(cfg: ModelConfig, slots: int, layout: CacheLayout) -> list[dict[str, jax.ShapeDtypeStruct]]:
    """Abstract cache (ShapeDtypeStruct leaves), one dict per KV-owning layer."""
    specs = []
    for layer in cfg.kv_layers:
        if layout.paged:  # `slots` is ignored: the pools are shared by every sequence
            n = layout.window_blocks if layout.group_of(cfg, layer) == "window" else layout.blocks
            shape = (n, cfg.kv_heads_of(layer), layout.block_size, cfg.head_dim_of(layer))
        else:
            shape = (slots, cfg.kv_heads_of(layer), layout.length_of(cfg, layer), cfg.head_dim_of(layer))
        specs.append(
            {
                name: jax.ShapeDtypeStruct(
                    shape if name in ("k", "v") else shape[:3],
                    stored_dtype(dtype),
                )
                for name, dtype in entry_dtypes(layout).items()
            }
        )
    return specs


def entry_dtypes(layout: CacheLayout) -> dict[str, jnp.dtype]:
    """The dtype each array of a layer's entry holds: K and V, and the int8 layout's scales."""
    kv = jnp.dtype(KV_DTYPES[layout.kv_dtype])
    scales = {"ks": jnp.dtype(SCALE_DTYPE), "vs": jnp.dtype(SCALE_DTYPE)} if layout.quantized else {}
    return {"k": kv, "v": kv, **scales}


def stored_dtype(dtype: jnp.dtype) -> jnp.dtype:
    """How a cache array of `dtype` is stored: 16-bit floats as their uint16 bits (module docstring)."""
    return jnp.dtype(jnp.uint16) if jnp.dtype(dtype) == jnp.bfloat16 else jnp.dtype(dtype)


def init_cache(cfg: ModelConfig, slots: int, layout: CacheLayout) -> Cache:
    return jax.tree_util.tree_map(lambda s: jnp.zeros(s.shape, s.dtype), cache_specs(cfg, slots, layout))


def cache_bytes(cfg: ModelConfig, slots: int, layout: CacheLayout) -> int:
    return int(
        sum(
            x.size * jnp.dtype(x.dtype).itemsize
            for x in jax.tree_util.tree_leaves(cache_specs(cfg, slots, layout))
        )
    )


def quantize_kv(x: jax.Array) -> tuple[jax.Array, jax.Array]:
    """x [..., hd] → (int8 [..., hd], bf16 scale [...]); scale = amax/127, all-zero rows get 1."""
    amax = jnp.max(jnp.abs(x.astype(jnp.float32)), axis=-1)
    scale = jnp.where(amax > 0, amax / 127.0, 1.0).astype(SCALE_DTYPE)
    q = jnp.clip(jnp.round(x.astype(jnp.float32) / scale.astype(jnp.float32)[..., None]), -127, 127)
    return q.astype(jnp.int8), scale


def as_bits(x: jax.Array) -> jax.Array:
    """16-bit floats as their uint16 bits (a free reinterpretation): what a cache array stores, so that
    XLA:CPU updates it in place (module docstring); anything else unchanged."""
    stored = stored_dtype(x.dtype)
    return x if stored == x.dtype else jax.lax.bitcast_convert_type(x, stored)


def from_bits(x: jax.Array, dtype: jnp.dtype) -> jax.Array:
    """A stored array (`as_bits`) back as the `dtype` it holds."""
    return x if stored_dtype(dtype) == jnp.dtype(dtype) else jax.lax.bitcast_convert_type(x, dtype)
