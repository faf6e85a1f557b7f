"""Checkpoint loading: safetensors → the parameter PyTree, with no torch anywhere on this path.

Formats:
- BF16 Hugging Face exports (`google/gemma-4-E2B-it`): dense `.weight` [out, in].
- `-qat-w4a16-ct`: compressed-tensors pack-quantized linears (`.weight_packed` int32 [out, in/8],
  `.weight_scale` bf16 [out, in/32], `.weight_shape`); embeddings, norms and `layer_scalar` dense.
- `-qat-q4_0-unquantized`: dense like the BF16 export.

Text weights sit under `model.language_model.` (multimodal export) or `model.` (text-only); the
prefix is detected, and vision/audio towers are never read. KV-shared layers need no k/v/k_norm
tensors (their presence is harmless: they are not read). Every tensor the tree needs is checked for
presence and shape, and a miss names the tensor and the file it was expected in.

The target storage format is `WeightFormat`: linears follow the checkpoint (packed → "w4a16",
dense → "bf16") unless asked otherwise; packed words stay integers (they never pass through f32);
dense → W4A16 quantizes with symmetric min-max; W4A16 → dense dequantizes exactly.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jax.numpy as jnp
import ml_dtypes
import numpy as np
from safetensors import safe_open

from g4bench.model.config import ModelConfig
from g4bench.model.params import Params, WeightFormat, linear_dims, param_specs
from g4bench.model.quant import dequantize_w4a16_np, quantize_ple_np, quantize_w4a16_np

PREFIXES = ("model.language_model.", "language_model.model.", "model.")
SKIP_MARKERS = (
    "vision_tower",
    "audio_tower",
    "vision_model",
    "audio_model",
    "multi_modal_projector",
    "embed_vision",
    "embed_audio",
)

# Our short names → checkpoint names (relative to the text prefix / `layers.N.`).
TOP_LEVEL = {
    "embed": "embed_tokens",
    "ple_proj": "per_layer_model_projection",
    "ple_norm": "per_layer_projection_norm",
    "final_norm": "norm",
}
PER_LAYER = {
    "input_norm": "input_layernorm",
    "post_attn_norm": "post_attention_layernorm",
    "pre_ffw_norm": "pre_feedforward_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm",
    "post_ple_norm": "post_per_layer_input_norm",
    "q": "self_attn.q_proj",
    "k": "self_attn.k_proj",
    "v": "self_attn.v_proj",
    "o": "self_attn.o_proj",
    "q_norm": "self_attn.q_norm",
    "k_norm": "self_attn.k_norm",
    "gate": "mlp.gate_proj",
    "up": "mlp.up_proj",
    "down": "mlp.down_proj",
    "ple_gate": "per_layer_input_gate",
    "ple_up": "per_layer_projection",
    "layer_scalar": "layer_scalar",
}


class CheckpointError(ValueError):
    """A tensor the model needs is missing or has the wrong shape/dtype."""


class TensorIndex:
    """Which safetensors file holds each tensor name (text tensors only)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        files = sorted(directory.glob("*.safetensors"))
        if not files:
            raise CheckpointError(f"no *.safetensors files in {directory}")
        self.file_of: dict[str, Path] = {}
        for f in files:
            with safe_open(str(f), framework="numpy") as handle:
                for name in handle.keys():  # noqa: SIM118 (safe_open is not iterable)
                    if not any(marker in name for marker in SKIP_MARKERS):
                        self.file_of[name] = f
        prefix = next((p for p in PREFIXES if f"{p}embed_tokens.weight" in self.file_of), None)
        if prefix is None:
            raise CheckpointError(
                f"{directory}: no embed_tokens.weight under any of the prefixes {PREFIXES} "
                f"(files: {[f.name for f in files]})"
            )
        self.prefix: str = prefix

    def has(self, name: str) -> bool:
        return self.prefix + name in self.file_of

    def get(self, name: str) -> np.ndarray:
        full = self.prefix + name
        if full not in self.file_of:
            files = sorted({f.name for f in self.file_of.values()})
            raise CheckpointError(f"missing tensor {full!r} in {self.directory} (files: {files})")
        with safe_open(str(self.file_of[full]), framework="numpy") as handle:
            return handle.get_tensor(full)

    def where(self, name: str) -> str:
        full = self.prefix + name
        return f"{full!r} in {self.file_of[full].name}" if full in self.file_of else repr(full)


def _expect(index: TensorIndex, name: str, arr: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    if tuple(arr.shape) != tuple(shape):
        raise CheckpointError(
            f"tensor {index.where(name)} has shape {tuple(arr.shape)}, expected {tuple(shape)}"
        )
    return arr


def _load_linear(index: TensorIndex, name: str, in_dim: int, out_dim: int, layers: str) -> dict[str, Any]:
    if index.has(f"{name}.weight_packed"):
        packed = _expect(
            index, f"{name}.weight_packed", index.get(f"{name}.weight_packed"), (out_dim, in_dim // 8)
        )
        if packed.dtype != np.int32:
            raise CheckpointError(
                f"tensor {index.where(name + '.weight_packed')} is {packed.dtype}, expected int32"
            )
        scale = index.get(f"{name}.weight_scale")
        if scale.ndim != 2 or scale.shape[0] != out_dim or in_dim % scale.shape[1]:
            raise CheckpointError(f"tensor {index.where(name + '.weight_scale')} has shape {scale.shape}")
        if scale.shape[1] != in_dim // 32:
            raise CheckpointError(
                f"{index.where(name + '.weight_scale')}: group size {in_dim // scale.shape[1]}, expected 32"
            )
        if layers == "w4a16":
            return {"packed": packed, "scale": scale.astype(ml_dtypes.bfloat16)}
        dense = dequantize_w4a16_np(packed, scale)
        return {"w": dense.T.astype(_np_dtype(layers))}
    w = _expect(index, f"{name}.weight", index.get(f"{name}.weight"), (out_dim, in_dim))
    if layers == "w4a16":
        packed, scale = quantize_w4a16_np(w.astype(np.float32))
        return {"packed": packed, "scale": scale}
    return {"w": np.ascontiguousarray(w.T).astype(_np_dtype(layers))}


def _np_dtype(name: str) -> Any:
    return {"bf16": ml_dtypes.bfloat16, "f32": np.float32}[name]


def detect_format(directory: Path) -> WeightFormat:
    """The format the checkpoint is stored in (packed linears → w4a16, else bf16)."""
    index = TensorIndex(directory)
    packed = index.has("layers.0.self_attn.q_proj.weight_packed")
    return WeightFormat(layers="w4a16" if packed else "bf16", ple="bf16", embed="bf16")


def load_checkpoint(directory: str | Path, fmt: WeightFormat | None = None) -> tuple[ModelConfig, Params]:
    """Read config.json and the text weights of an HF checkpoint into host (numpy) arrays."""
    directory = Path(directory)
    cfg_path = directory / "config.json"
    if not cfg_path.is_file():
        raise CheckpointError(f"{directory} has no config.json")
    cfg = ModelConfig.from_hf_dict(json.loads(cfg_path.read_text()), name=directory.name)
    fmt = fmt or detect_format(directory)
    index = TensorIndex(directory)
    specs = param_specs(cfg, fmt)
    H = cfg.hidden_size

    def norm(name: str, dim: int) -> np.ndarray:
        return _expect(index, name, index.get(name), (dim,)).astype(np.float32)

    params: Params = {
        "embed": _expect(
            index, "embed_tokens.weight", index.get("embed_tokens.weight"), (cfg.vocab_size, H)
        ).astype(_np_dtype(fmt.embed)),
        "final_norm": norm("norm.weight", H),
        "layers": [],
    }
    if cfg.has_ple:
        table = _expect(
            index,
            "embed_tokens_per_layer.weight",
            index.get("embed_tokens_per_layer.weight"),
            (cfg.vocab_size_per_layer_input, cfg.ple_width),
        )
        if fmt.ple in ("bf16", "f32"):
            params["ple_table"] = {"w": table.astype(_np_dtype(fmt.ple))}
        else:
            q, scale = quantize_ple_np(table, 8 if fmt.ple == "int8" else 4, cfg.hidden_size_per_layer_input)
            params["ple_table"] = {"q": q, "scale": scale}
        params["ple_proj"] = _load_linear(index, "per_layer_model_projection", H, cfg.ple_width, fmt.layers)
        params["ple_norm"] = norm("per_layer_projection_norm.weight", cfg.hidden_size_per_layer_input)

    for i, layer_spec in enumerate(specs["layers"]):
        layer: Params = {}
        for short, spec in layer_spec.items():
            name = f"layers.{i}.{PER_LAYER[short]}"
            if short == "layer_scalar":
                value = index.get(name) if index.has(name) else index.get(f"{name}.weight")
                layer[short] = _expect(index, name, np.asarray(value).reshape(-1), (1,)).astype(np.float32)
            elif isinstance(spec, dict):
                in_dim, out_dim = linear_dims(spec)
                layer[short] = _load_linear(index, name, in_dim, out_dim, fmt.layers)
            else:
                layer[short] = norm(f"{name}.weight", spec.shape[0])
        params["layers"].append(layer)
    return cfg, params


def to_device(params: Params) -> Params:
    """Host arrays → device arrays (one transfer per leaf)."""
    import jax

    return jax.tree_util.tree_map(jnp.asarray, params)
