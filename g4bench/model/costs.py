"""Bytes moved and FLOPs of one decode or prefill step: the roofline model, as pure functions.

    cost = decode_cost(cfg, WeightFormat(layers="w4a16"), CacheLayout(max_len=8192), batch=32, kv_len=8192)
    cost.bytes, cost.flops, cost.bytes_by_part["kv_read"], cost.intensity

Everything derives from the abstract parameter tree (`param_specs`) and cache tree (`cache_specs`),
so a new weight format or KV dtype is counted without touching this file. The model counts what
*our engine's* step touches in memory (g4bench/model/forward.py), part by part:

- ``weights``: every transformer-layer linear (W4A16 packed words *and* their bf16 scales), the
  norms and layer scalars, the PLE projection and its norm, the final norm — all streamed once.
- ``lm_head``: the tied LM head is the token embedding, read in full for the logits.
- ``embed_gather`` / ``ple_gather``: the token embedding and the PLE table are *gathered*, one row
  per token (B·T rows × row bytes). The 4.70 GB E2B PLE table is not streamed; the reference engine
  counted it as streamed and overstated its traffic by 2.5× (seed-engine-notes §3.4).
- ``kv_read``: K and V read by attention. With full-length caches the step reads the first
  `kv_len` positions of *every* layer's cache and masks what a sliding window excludes, so sliding
  layers read `kv_len` keys too, not `min(ctx, window)`. KV-shared layers (E2B: 20 of 35) attend
  with their source layer's K/V in a separate attention, so that cache is read again per sharing
  layer: E2B reads 43,008 bf16 bytes per sequence per context position per step, although it stores
  only 18,432. With a sliding ring (`layout.ring`) a sliding layer reads its W ring entries plus the
  new token (W + 1 keys) whatever the context.
- ``kv_write``: one token per sequence per KV-owning layer (in place: the cache is donated). A ring
  layer rewrites its whole ring (`_write_ring` selects per entry: read W, write W). A copying
  step (``donated=False``) also copies the whole cache buffer: ``kv_copy`` = read + write of it.
- ``logits``: f32 [B, V] written by the LM head and read once by the sampler.

Activations of width H are left out (kilobytes). FLOPs: 2·rows·(linear weights touched) +
attention 2·2·queries·heads·hd·keys per layer + LM head 2·rows·H·V; shared layers in a prefill that
only needs the next token run on the last position alone (forward.py), and that is counted too.

Used by `g4bench roofline` (harness/roofline/main.py), and by capacity and plots.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from g4bench.model.config import ModelConfig
from g4bench.model.kv_cache import CacheLayout, cache_bytes, cache_specs
from g4bench.model.params import WeightFormat, linear_dims, param_specs, tree_bytes

LOGIT_BYTES = 4  # the step's logits are f32


@dataclass(frozen=True)
class StepCost:
    """Bytes moved and FLOPs of one step, by part (see the module docstring for each part)."""

    bytes_by_part: dict[str, int] = field(default_factory=dict)
    flops_by_part: dict[str, int] = field(default_factory=dict)

    @property
    def bytes(self) -> int:
        return int(sum(self.bytes_by_part.values()))

    @property
    def flops(self) -> int:
        return int(sum(self.flops_by_part.values()))

    @property
    def streamed_weight_bytes(self) -> int:
        """Weights read in full each step: transformer layers, PLE projection, final norm, LM head."""
        return self.bytes_by_part.get("weights", 0) + self.bytes_by_part.get("lm_head", 0)

    @property
    def intensity(self) -> float:
        """FLOPs per byte moved (compare with the device's ridge point)."""
        return self.flops / self.bytes if self.bytes else 0.0


# ---------------------------------------------------------------------------- weights
def _linears(tree: Any) -> Iterator[dict[str, Any]]:
    """Every linear leaf-dict (`{"w"}` or `{"packed", "scale"}`) in a parameter (sub)tree."""
    if isinstance(tree, dict):
        if "w" in tree or "packed" in tree:
            yield tree
            return
        for value in tree.values():
            yield from _linears(value)
    elif isinstance(tree, list | tuple):
        for value in tree:
            yield from _linears(value)


def _linear_params(tree: Any) -> int:
    """Weight entries (in·out) of every linear in `tree`: what a matmul touches per row."""
    return int(sum(np.prod(linear_dims(lin)) for lin in _linears(tree)))


def streamed_weight_bytes(cfg: ModelConfig, fmt: WeightFormat) -> dict[str, int]:
    """Bytes a step reads in full: {"weights": layers + PLE projection/norm + final norm, "lm_head"}.

    The PLE table is gathered, not streamed, and is absent here. E2B with W4A16 layers and a bf16
    embedding: ≈ 1.86 GB (capacity-anchors, key numbers)."""
    specs = param_specs(cfg, fmt)
    weights = tree_bytes(specs["layers"]) + tree_bytes(specs["final_norm"])
    weights += tree_bytes(specs.get("ple_proj", {})) + tree_bytes(specs.get("ple_norm", {}))
    return {"weights": weights, "lm_head": tree_bytes(specs["embed"])}


def gathered_row_bytes(cfg: ModelConfig, fmt: WeightFormat) -> dict[str, int]:
    """Bytes of one gathered row: {"embed": H·itemsize, "ple": the PLE table's row incl. scales}."""
    specs = param_specs(cfg, fmt)
    ple = specs.get("ple_table", {})
    return {
        "embed": tree_bytes(specs["embed"]) // cfg.vocab_size,
        "ple": tree_bytes(ple) // cfg.vocab_size_per_layer_input if ple else 0,
    }


# ---------------------------------------------------------------------------- KV cache
def kv_position_bytes(cfg: ModelConfig, layout: CacheLayout) -> dict[int, int]:
    """KV-owning layer → bytes one position of one sequence occupies there (K, V and int8 scales)."""
    specs = cache_specs(cfg, 1, layout)
    out = {}
    for layer, entry in zip(cfg.kv_layers, specs, strict=True):
        length = layout.length_of(cfg, layer)
        out[layer] = tree_bytes(entry) // length
    return out


def kv_stored_bytes_per_token(cfg: ModelConfig, layout: CacheLayout) -> int:
    """Bytes one token occupies summed over the KV-owning layers (E2B bf16: 18,432)."""
    return int(sum(kv_position_bytes(cfg, layout).values()))


def keys_read(cfg: ModelConfig, layout: CacheLayout, layer: int, kv_len: int) -> int:
    """Key positions layer `layer`'s attention reads per sequence: `kv_len` from a full-length cache
    (sliding layers mask, they do not slice), W + 1 from a ring (the ring and the new token)."""
    source = cfg.kv_source(layer)
    if layout.is_ring(cfg, source):
        return layout.length_of(cfg, source) + 1
    return min(kv_len, layout.max_len)


def kv_read_bytes(cfg: ModelConfig, layout: CacheLayout, rows: int, kv_len: int) -> int:
    """KV bytes all attention layers read for `rows` sequences at KV length `kv_len`; a shared layer
    re-reads its source layer's cache."""
    per_pos = kv_position_bytes(cfg, layout)
    total = 0
    for layer in range(cfg.num_hidden_layers):
        total += per_pos[cfg.kv_source(layer)] * keys_read(cfg, layout, layer, kv_len)
    return rows * total


def kv_write_bytes(cfg: ModelConfig, layout: CacheLayout, rows: int, tokens: int) -> int:
    """KV bytes written for `tokens` new positions of `rows` sequences; a ring layer rewrites its ring."""
    total = 0
    for layer, per_pos in kv_position_bytes(cfg, layout).items():
        if layout.is_ring(cfg, layer):
            total += 2 * per_pos * layout.length_of(cfg, layer)  # select per entry: read W, write W
        else:
            total += per_pos * tokens
    return rows * total


# ---------------------------------------------------------------------------- FLOPs
def _attention_flops(cfg: ModelConfig, layout: CacheLayout, layer: int, queries: int, kv_len: int) -> int:
    """scores q·kᵀ and probs·v: 2 matmuls × 2 FLOPs × queries × heads × hd × keys."""
    keys = keys_read(cfg, layout, layer, kv_len)
    return 4 * queries * cfg.num_attention_heads * cfg.head_dim_of(layer) * keys


def _layer_linear_params(cfg: ModelConfig, fmt: WeightFormat) -> list[int]:
    return [_linear_params(layer) for layer in param_specs(cfg, fmt)["layers"]]


# ---------------------------------------------------------------------------- steps
def decode_cost(
    cfg: ModelConfig,
    fmt: WeightFormat,
    layout: CacheLayout,
    batch: int,
    kv_len: int,
    *,
    donated: bool = True,
) -> StepCost:
    """One decode step: `batch` sequences, one token each, attending over KV length `kv_len`
    (the engine's bucket; the benchmark uses kv_len = ctx)."""
    if batch < 1 or kv_len < 1:
        raise ValueError(f"batch and kv_len must be positive, got {batch}, {kv_len}")
    streamed = streamed_weight_bytes(cfg, fmt)
    rows = gathered_row_bytes(cfg, fmt)
    specs = param_specs(cfg, fmt)
    parts = {
        **streamed,
        "embed_gather": batch * rows["embed"],
        "ple_gather": batch * rows["ple"],
        "kv_read": kv_read_bytes(cfg, layout, batch, kv_len),
        "kv_write": kv_write_bytes(cfg, layout, batch, 1),
        "kv_copy": 0 if donated else 2 * cache_bytes(cfg, batch, layout),
        "logits": 2 * batch * cfg.vocab_size * LOGIT_BYTES,
    }
    linear = sum(_layer_linear_params(cfg, fmt)) + _linear_params(specs.get("ple_proj", {}))
    flops = {
        "linears": 2 * batch * linear,
        "attention": sum(
            _attention_flops(cfg, layout, i, batch, kv_len) for i in range(cfg.num_hidden_layers)
        ),
        "lm_head": 2 * batch * cfg.hidden_size * cfg.vocab_size,
    }
    return StepCost(bytes_by_part=parts, flops_by_part=flops)


def prefill_cost(
    cfg: ModelConfig,
    fmt: WeightFormat,
    layout: CacheLayout,
    tokens: int,
    kv_len: int,
    *,
    rows: int = 1,
) -> StepCost:
    """One prefill call: `rows` sequences × `tokens` new positions (a chunk), attending over KV
    length `kv_len`, next-token logits only (the engine's prefill). KV-shared layers run on the
    last position alone, since they write no K/V (forward.py, `all_logits=False`)."""
    if tokens < 1 or kv_len < 1 or rows < 1:
        raise ValueError(f"tokens, kv_len and rows must be positive, got {tokens}, {kv_len}, {rows}")
    streamed = streamed_weight_bytes(cfg, fmt)
    row_bytes = gathered_row_bytes(cfg, fmt)
    specs = param_specs(cfg, fmt)
    first_shared = cfg.first_kv_shared_layer
    queries = [tokens if i < first_shared else 1 for i in range(cfg.num_hidden_layers)]
    parts = {
        **streamed,
        "embed_gather": rows * tokens * row_bytes["embed"],
        "ple_gather": rows * tokens * row_bytes["ple"],
        "kv_read": kv_read_bytes(cfg, layout, rows, kv_len),
        "kv_write": kv_write_bytes(cfg, layout, rows, tokens),
        "kv_copy": 0,
        "logits": 2 * rows * cfg.vocab_size * LOGIT_BYTES,
    }
    layer_params = _layer_linear_params(cfg, fmt)
    linear = sum(q * p for q, p in zip(queries, layer_params, strict=True))
    linear += tokens * _linear_params(specs.get("ple_proj", {}))
    flops = {
        "linears": 2 * rows * linear,
        "attention": rows
        * sum(_attention_flops(cfg, layout, i, queries[i], kv_len) for i in range(cfg.num_hidden_layers)),
        "lm_head": 2 * rows * cfg.hidden_size * cfg.vocab_size,
    }
    return StepCost(bytes_by_part=parts, flops_by_part=flops)


def mixed_cost(
    cfg: ModelConfig,
    fmt: WeightFormat,
    layout: CacheLayout,
    decode_rows: int,
    piece_rows: int,
    piece_tokens: int,
    kv_len: int,
) -> StepCost:
    """One mixed call (g4bench/engine/mixed.py): `decode_rows` one-token rows plus `piece_rows`
    prefill rows of `piece_tokens` positions, all attending over KV length `kv_len` (an upper
    bound for pieces, which read only up to their own positions), the weights streamed once."""
    dec = decode_cost(cfg, fmt, layout, decode_rows, kv_len)
    pre = prefill_cost(cfg, fmt, layout, piece_tokens, kv_len, rows=piece_rows)
    streamed = set(streamed_weight_bytes(cfg, fmt))
    parts = {
        k: v + (0 if k in streamed else pre.bytes_by_part.get(k, 0)) for k, v in dec.bytes_by_part.items()
    }
    flops = {k: v + pre.flops_by_part.get(k, 0) for k, v in dec.flops_by_part.items()}
    return StepCost(bytes_by_part=parts, flops_by_part=flops)


def describe(cost: StepCost) -> dict[str, Any]:
    """A JSON-ready summary: total bytes and FLOPs, each part, intensity."""
    return {
        "model_bytes": cost.bytes,
        "model_flops": cost.flops,
        "streamed_weight_bytes": cost.streamed_weight_bytes,
        "model_bytes_by_part": dict(cost.bytes_by_part),
        "model_flops_by_part": dict(cost.flops_by_part),
        "flop_per_byte": cost.intensity,
    }
