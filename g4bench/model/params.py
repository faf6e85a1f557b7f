"""The parameter PyTree, described once.

`param_specs(cfg, fmt)` returns the tree of `jax.ShapeDtypeStruct` leaves for a config and a weight
format; synthetic init, byte counts, `jax.eval_shape` checks and capacity arithmetic all derive from
it, and the checkpoint loader fills exactly this tree.

Tree layout (short names, checkpoint names in checkpoint.py):

    embed        [V, H]                    token embedding, also the tied LM head
    ple_table    {"w": [Vp, L·P]} (bf16) | {"q": int8 [Vp, L·P] | uint8 [Vp, L·P/2], "scale": [Vp, L]}
    ple_proj     linear H → L·P            per_layer_model_projection
    ple_norm     [P]                       per_layer_projection_norm
    final_norm   [H]
    layers[i]    input_norm, post_attn_norm, pre_ffw_norm, post_ffw_norm, post_ple_norm [H]
                 q: linear H → nh·hd, q_norm [hd], o: linear nh·hd → H
                 k, v: linear H → kvh·hd, k_norm [hd]          (KV-owning layers only)
                 gate, up: linear H → I_i, down: linear I_i → H
                 ple_gate: linear H → P, ple_up: linear P → H
                 layer_scalar [1] f32

A linear is `{"w": [in, out]}` when dense (bf16 or f32) or `{"packed": int32 [out, in/8],
"scale": bf16 [out, in/32]}` in W4A16 (the checkpoint's own orientation, so no repacking).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np

from g4bench.model.config import ModelConfig
from g4bench.model.quant import NIBBLES_PER_WORD, W4A16_GROUP

LAYER_FORMATS = ("w4a16", "bf16", "f32")
PLE_FORMATS = ("bf16", "int8", "int4", "f32")
EMBED_FORMATS = ("bf16", "f32")
NORM_DTYPE = jnp.float32

Params = dict[str, Any]


@dataclass(frozen=True)
class WeightFormat:
    """Storage format of each weight family.

    layers: transformer linears and PLE projections ("w4a16" = compressed-tensors int4 g32).
    ple:    the per-layer-embedding table (gathered per token, never streamed); "f32" only for
            reference-parity runs of f32 checkpoints.
    embed:  token embedding / tied LM head."""

    layers: str = "w4a16"
    ple: str = "bf16"
    embed: str = "bf16"

    def __post_init__(self) -> None:
        for name, value, allowed in (
            ("layers", self.layers, LAYER_FORMATS),
            ("ple", self.ple, PLE_FORMATS),
            ("embed", self.embed, EMBED_FORMATS),
        ):
            if value not in allowed:
                raise ValueError(f"weight format {name}={value!r}; expected one of {allowed}")

    @property
    def name(self) -> str:
        return f"layers-{self.layers}/ple-{self.ple}/embed-{self.embed}"


def _dtype(name: str) -> jnp.dtype:
    return {"bf16": jnp.bfloat16, "f32": jnp.float32}[name]


def linear_spec(in_dim: int, out_dim: int, layers: str) -> dict[str, jax.ShapeDtypeStruct]:
    if layers == "w4a16":
        if in_dim % W4A16_GROUP:
            raise ValueError(f"W4A16 needs input dims divisible by {W4A16_GROUP}, got {in_dim}")
        return {
            "packed": jax.ShapeDtypeStruct((out_dim, in_dim // NIBBLES_PER_WORD), jnp.int32),
            "scale": jax.ShapeDtypeStruct((out_dim, in_dim // W4A16_GROUP), jnp.bfloat16),
        }
    return {"w": jax.ShapeDtypeStruct((in_dim, out_dim), _dtype(layers))}


def linear_dims(lin: dict[str, Any]) -> tuple[int, int]:
    """(in, out) of a linear leaf dict, whatever its format."""
    if "w" in lin:
        return lin["w"].shape[0], lin["w"].shape[1]
    return lin["packed"].shape[1] * NIBBLES_PER_WORD, lin["packed"].shape[0]


def _norm(dim: int) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct((dim,), NORM_DTYPE)


def ple_table_spec(cfg: ModelConfig, ple: str) -> dict[str, jax.ShapeDtypeStruct]:
    rows, cols, slices = cfg.vocab_size_per_layer_input, cfg.ple_width, cfg.num_hidden_layers
    if ple in ("bf16", "f32"):
        return {"w": jax.ShapeDtypeStruct((rows, cols), _dtype(ple))}
    q = (
        jax.ShapeDtypeStruct((rows, cols), jnp.int8)
        if ple == "int8"
        else jax.ShapeDtypeStruct((rows, cols // 2), jnp.uint8)
    )
    return {"q": q, "scale": jax.ShapeDtypeStruct((rows, slices), jnp.bfloat16)}


def param_specs(cfg: ModelConfig, fmt: WeightFormat) -> Params:
    """The abstract parameter tree (ShapeDtypeStruct leaves) for `cfg` stored as `fmt`."""
    H, P = cfg.hidden_size, cfg.hidden_size_per_layer_input
    tree: Params = {
        "embed": jax.ShapeDtypeStruct((cfg.vocab_size, H), _dtype(fmt.embed)),
        "final_norm": _norm(H),
        "layers": [],
    }
    if cfg.has_ple:
        tree["ple_table"] = ple_table_spec(cfg, fmt.ple)
        tree["ple_proj"] = linear_spec(H, cfg.ple_width, fmt.layers)
        tree["ple_norm"] = _norm(P)
    for i in range(cfg.num_hidden_layers):
        hd, nh, kvh, inter = (
            cfg.head_dim_of(i),
            cfg.num_attention_heads,
            cfg.kv_heads_of(i),
            cfg.mlp_width_of(i),
        )
        layer: Params = {
            "input_norm": _norm(H),
            "post_attn_norm": _norm(H),
            "pre_ffw_norm": _norm(H),
            "post_ffw_norm": _norm(H),
            "q": linear_spec(H, nh * hd, fmt.layers),
            "q_norm": _norm(hd),
            "o": linear_spec(nh * hd, H, fmt.layers),
            "gate": linear_spec(H, inter, fmt.layers),
            "up": linear_spec(H, inter, fmt.layers),
            "down": linear_spec(inter, H, fmt.layers),
            "layer_scalar": jax.ShapeDtypeStruct((1,), jnp.float32),
        }
        if cfg.owns_kv(i):
            layer["k"] = linear_spec(H, kvh * hd, fmt.layers)
            layer["v"] = linear_spec(H, kvh * hd, fmt.layers)
            layer["k_norm"] = _norm(hd)
        if cfg.has_ple:
            layer["ple_gate"] = linear_spec(H, P, fmt.layers)
            layer["ple_up"] = linear_spec(P, H, fmt.layers)
            layer["post_ple_norm"] = _norm(H)
        tree["layers"].append(layer)
    return tree


def tree_bytes(tree: Any) -> int:
    return int(sum(np.prod(x.shape) * jnp.dtype(x.dtype).itemsize for x in jax.tree_util.tree_leaves(tree)))


def param_bytes(cfg: ModelConfig, fmt: WeightFormat) -> int:
    return tree_bytes(param_specs(cfg, fmt))


def param_bytes_by_family(cfg: ModelConfig, fmt: WeightFormat) -> dict[str, int]:
    """Bytes per weight family: what a decode step streams vs what it only gathers."""
    specs = param_specs(cfg, fmt)
    return {
        "embed": tree_bytes(specs["embed"]),
        "ple_table": tree_bytes(specs.get("ple_table", {})),
        "ple_proj": tree_bytes(specs.get("ple_proj", {})) + tree_bytes(specs.get("ple_norm", {})),
        "layers": tree_bytes(specs["layers"]),
        "final_norm": tree_bytes(specs["final_norm"]),
    }


# ---------------------------------------------------------------------------- synthetic init
_BLOCK = 1 << 20


class _BlockSource:
    """Random blocks of at most `_BLOCK` values, one per leaf, from a few pools drawn once.

    Each (dtype, std) pool is drawn once per `init_params` call; a leaf gets the pool rotated by a
    random offset, so leaves differ from one another while the 10 GB E2B init draws ~4 Mi random
    values instead of ~300 Mi (drawing was a third of a measuring child's start-up)."""

    def __init__(self, rng: np.random.Generator) -> None:
        self._rng = rng
        self._pools: dict[tuple[str, float], np.ndarray] = {}

    def _pool(self, dtype: np.dtype, std: float) -> np.ndarray:
        key = (dtype.name, std)
        if key not in self._pools:
            rng = self._rng
            if dtype == jnp.int32:  # packed int4 words: uniformly random nibbles
                pool = rng.integers(0, 2**32, size=_BLOCK, dtype=np.uint64).astype(np.uint32).view(np.int32)
            elif dtype == jnp.uint8:
                pool = rng.integers(0, 256, size=_BLOCK, dtype=np.uint8)
            elif dtype == jnp.int8:
                pool = rng.integers(-127, 128, size=_BLOCK, dtype=np.int8)
            else:
                normal = (rng.standard_normal(_BLOCK) * std).astype(np.float32)
                pool = normal.astype(ml_dtypes.bfloat16 if dtype == jnp.bfloat16 else dtype)
            self._pools[key] = pool
        return self._pools[key]

    def block(self, spec: jax.ShapeDtypeStruct, std: float) -> np.ndarray:
        """A block of min(size, `_BLOCK`) values in `spec`'s dtype."""
        n = min(int(np.prod(spec.shape)), _BLOCK)
        pool = self._pool(jnp.dtype(spec.dtype), std)
        return np.roll(pool, -int(self._rng.integers(0, _BLOCK)))[:n]


@partial(jax.jit, static_argnums=(1,))
def _tile(block: jax.Array, shape: tuple[int, ...]) -> jax.Array:
    """The block repeated to fill `shape`, built on the device in one allocation (the 2.3 G-entry
    PLE table never exists twice in host memory)."""
    n = int(np.prod(shape))
    reps = -(-n // block.size)
    return jnp.tile(block, reps)[:n].reshape(shape)


def init_params(cfg: ModelConfig, fmt: WeightFormat, seed: int = 0) -> Params:
    """Synthetic weights with the exact checkpoint shapes: valid for timing and memory, not quality.

    Norm weights are 1, layer scalars 1, W4A16 scales sized so dequantized weights have std ≈ 0.02."""
    return init_tree(param_specs(cfg, fmt), seed)


def init_tree(specs: Params, seed: int = 0) -> Params:
    """`init_params`'s leaf rules over any spec tree (the drafter's too: g4bench/model/drafter.py)."""
    blocks = _BlockSource(np.random.default_rng(seed))

    def leaf(path: tuple[Any, ...], spec: jax.ShapeDtypeStruct) -> jax.Array:
        name = str(getattr(path[-1], "key", path[-1]))
        parent = str(getattr(path[-2], "key", "")) if len(path) > 1 else ""
        if name.endswith("norm") or name == "layer_scalar":
            return jnp.ones(spec.shape, spec.dtype)
        if name == "scale":
            value = 0.2 / 7 if parent == "ple_table" else 0.02 / 4.6
            return jnp.full(spec.shape, value, spec.dtype)
        std = 0.5 if name == "embed" or parent == "ple_table" else 0.02
        return _tile(jnp.asarray(blocks.block(spec, std)), tuple(spec.shape))

    return jax.tree_util.tree_map_with_path(leaf, specs)
