"""`ModelConfig`: one frozen description of a Gemma 4 E-series text model.

Read from a Hugging Face `config.json` (the multimodal export nests the text model under
`text_config`; a text-only export is flat). Every derived value the engine, the byte counts and the
capacity arithmetic need (first KV-shared layer, the KV share map keyed by layer type, per-layer
head dim / KV heads / MLP width, KV bytes per token) is a property here, so no other module
re-derives architecture facts.

Presets live as data in `configs/models/*.json` (`gemma-4-e2b.json`, `gemma-4-e4b.json`, tiny test
configs); `load_config("e2b")` finds them by short name.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path
from typing import Any

SLIDING = "sliding_attention"
FULL = "full_attention"

CONFIG_DIR = Path(__file__).resolve().parents[2] / "configs" / "models"
PRESET_ALIASES = {"e2b": "gemma-4-e2b", "e4b": "gemma-4-e4b", "small": "gemma-4-small"}

KV_DTYPE_BYTES = {"bf16": 2, "int8": 1, "f32": 4}
# int8 KV keeps one bf16 scale per (token, KV head) for K and one for V (kv_cache.SCALE_DTYPE).
KV_SCALE_BYTES = 2


class UnsupportedConfigError(ValueError):
    """A config.json field asks for something this engine does not implement."""


@dataclass(frozen=True)
class ModelConfig:
    """Architecture of one Gemma 4 E-series text model (field names follow HF's Gemma4TextConfig)."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int  # sliding layers
    global_head_dim: int  # full-attention layers (their Q and KV head dim)
    layer_types: tuple[str, ...]
    sliding_window: int
    num_kv_shared_layers: int
    hidden_size_per_layer_input: int  # PLE width per layer (0 = no PLE)
    vocab_size_per_layer_input: int
    use_double_wide_mlp: bool
    final_logit_softcapping: float | None
    rope_theta_sliding: float
    rope_theta_full: float
    partial_rotary_factor_full: float
    rms_norm_eps: float = 1e-6
    tie_word_embeddings: bool = True
    max_position_embeddings: int = 131072
    pad_token_id: int = 0
    bos_token_id: int = 2
    eos_token_ids: tuple[int, ...] = (1,)
    name: str = "custom"
    hf_config: dict[str, Any] = field(default_factory=dict, compare=False, hash=False, repr=False)

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_hf_dict(cls, raw: dict[str, Any], name: str = "custom") -> ModelConfig:
        """Build from a config.json dict (nested `text_config` or flat); unsupported fields raise."""
        d = raw.get("text_config", raw)
        if d.get("enable_moe_block"):
            raise UnsupportedConfigError("enable_moe_block=true: MoE Gemma 4 models are not E-series")
        if d.get("attention_k_eq_v"):
            raise UnsupportedConfigError("attention_k_eq_v=true: only the 31B uses K=V attention")
        if d.get("use_bidirectional_attention") == "all":
            raise UnsupportedConfigError("use_bidirectional_attention='all' is not a causal LM")
        if d.get("attn_logit_softcapping"):
            raise UnsupportedConfigError("attn_logit_softcapping: Gemma 4 text attention has no softcap")
        if d.get("hidden_activation", "gelu_pytorch_tanh") != "gelu_pytorch_tanh":
            raise UnsupportedConfigError(f"hidden_activation={d['hidden_activation']!r}")
        layers = int(d["num_hidden_layers"])
        layer_types = tuple(d.get("layer_types") or [SLIDING if (i + 1) % 6 else FULL for i in range(layers)])
        if len(layer_types) != layers or set(layer_types) - {SLIDING, FULL}:
            raise UnsupportedConfigError(f"layer_types must be {layers} of {SLIDING!r}/{FULL!r}")

        rope = d.get("rope_parameters") or {
            SLIDING: {"rope_type": "default", "rope_theta": 10_000.0},
            FULL: {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1_000_000.0},
        }
        sliding_rope, full_rope = rope.get(SLIDING, {}), rope.get(FULL, {})
        if sliding_rope.get("rope_type", "default") != "default":
            raise UnsupportedConfigError(
                f"rope_parameters.sliding_attention.rope_type={sliding_rope.get('rope_type')!r}"
            )
        if full_rope.get("rope_type", "default") not in ("default", "proportional"):
            raise UnsupportedConfigError(
                f"rope_parameters.full_attention.rope_type={full_rope.get('rope_type')!r}"
            )
        for which, params in ((SLIDING, sliding_rope), (FULL, full_rope)):
            if params.get("factor", 1.0) != 1.0:
                raise UnsupportedConfigError(f"rope_parameters.{which}.factor={params['factor']}")
        full_factor = (
            float(full_rope.get("partial_rotary_factor", 1.0))
            if full_rope.get("rope_type") == "proportional"
            else 1.0
        )
        # num_global_key_value_heads only applies together with attention_k_eq_v in HF (rejected above).
        eos = d.get("eos_token_id", 1)
        return cls(
            vocab_size=int(d["vocab_size"]),
            hidden_size=int(d["hidden_size"]),
            intermediate_size=int(d["intermediate_size"]),
            num_hidden_layers=layers,
            num_attention_heads=int(d["num_attention_heads"]),
            num_key_value_heads=int(d["num_key_value_heads"]),
            head_dim=int(d.get("head_dim", 256)),
            global_head_dim=_global_head_dim(d, layer_types),
            layer_types=layer_types,
            sliding_window=int(d.get("sliding_window", 512)),
            num_kv_shared_layers=int(d.get("num_kv_shared_layers", 0)),
            hidden_size_per_layer_input=int(d.get("hidden_size_per_layer_input") or 0),
            vocab_size_per_layer_input=int(d.get("vocab_size_per_layer_input", d["vocab_size"])),
            use_double_wide_mlp=bool(d.get("use_double_wide_mlp", False)),
            final_logit_softcapping=d.get("final_logit_softcapping"),
            rope_theta_sliding=float(sliding_rope.get("rope_theta", 10_000.0)),
            rope_theta_full=float(full_rope.get("rope_theta", 1_000_000.0)),
            partial_rotary_factor_full=full_factor,
            rms_norm_eps=float(d.get("rms_norm_eps", 1e-6)),
            tie_word_embeddings=bool(d.get("tie_word_embeddings", raw.get("tie_word_embeddings", True))),
            max_position_embeddings=int(d.get("max_position_embeddings", 131072)),
            pad_token_id=int(d.get("pad_token_id", 0) or 0),
            bos_token_id=int(d.get("bos_token_id", 2) if d.get("bos_token_id") is not None else 2),
            eos_token_ids=tuple(eos) if isinstance(eos, list) else (int(eos),),
            name=name,
            hf_config=dict(d),
        )._validated()

    def _validated(self) -> ModelConfig:
        if not self.tie_word_embeddings:
            raise UnsupportedConfigError("tie_word_embeddings=false: E-series models tie the LM head")
        if self.num_attention_heads % self.num_key_value_heads:
            raise UnsupportedConfigError("num_attention_heads must be a multiple of num_key_value_heads")
        if not 0 <= self.num_kv_shared_layers < self.num_hidden_layers:
            raise UnsupportedConfigError(f"num_kv_shared_layers={self.num_kv_shared_layers}")
        owners = set(self.layer_types[: self.first_kv_shared_layer])
        if self.num_kv_shared_layers and set(self.layer_types[self.first_kv_shared_layer :]) - owners:
            raise UnsupportedConfigError(
                "num_kv_shared_layers: a shared layer type has no earlier layer storing KV"
            )
        return self

    def scaled(self, **changes: Any) -> ModelConfig:
        """A copy with some fields replaced (tiny test configs, scaled CPU benchmarks)."""
        return replace(self, **changes)._validated()

    # ------------------------------------------------------------------ derived architecture
    @property
    def first_kv_shared_layer(self) -> int:
        return self.num_hidden_layers - self.num_kv_shared_layers

    def is_full(self, layer: int) -> bool:
        return self.layer_types[layer] == FULL

    def owns_kv(self, layer: int) -> bool:
        return layer < self.first_kv_shared_layer

    @cached_property
    def kv_share_map(self) -> tuple[int, ...]:
        """Layer → the layer whose K/V it attends with: itself below the first shared layer, else the
        last non-shared layer of the same type (E2B: sliding → 13, full → 14)."""
        first = self.first_kv_shared_layer
        last_of = {
            t: max(i for i in range(first) if self.layer_types[i] == t) for t in set(self.layer_types[:first])
        }
        return tuple(i if i < first else last_of[self.layer_types[i]] for i in range(self.num_hidden_layers))

    def kv_store_layer(self, layer_type: str) -> int:
        """The last KV-owning layer of a type: the one whose K/V the shared layers of that type use."""
        return max(i for i in self.kv_layers if self.layer_types[i] == layer_type)

    def kv_source(self, layer: int) -> int:
        return self.kv_share_map[layer]

    @property
    def kv_layers(self) -> tuple[int, ...]:
        """Layers that compute and store K/V."""
        return tuple(range(self.first_kv_shared_layer))

    def head_dim_of(self, layer: int) -> int:
        return self.global_head_dim if self.is_full(layer) else self.head_dim

    def kv_heads_of(self, layer: int) -> int:
        return self.num_key_value_heads

    def mlp_width_of(self, layer: int) -> int:
        double = self.use_double_wide_mlp and not self.owns_kv(layer)
        return self.intermediate_size * (2 if double else 1)

    @property
    def has_ple(self) -> bool:
        return self.hidden_size_per_layer_input > 0

    @property
    def ple_width(self) -> int:
        """Columns of the packed PLE table: num_layers × per-layer width."""
        return self.num_hidden_layers * self.hidden_size_per_layer_input

    def rotary_pairs(self, layer: int) -> int:
        """How many (i, i + d/2) dimension pairs RoPE rotates on this layer."""
        d = self.head_dim_of(layer)
        factor = self.partial_rotary_factor_full if self.is_full(layer) else 1.0
        return int(factor * d // 2)

    def kv_bytes_per_token(
        self, kv_dtype: str = "bf16", *, sliding: str = "full", ctx: int | None = None
    ) -> float:
        """KV bytes one token occupies, summed over the KV-owning layers (K and V).

        `sliding="ring"` caps sliding layers at the window: then the figure depends on the context
        (`ctx` tokens per sequence) and is the per-sequence bytes divided by `ctx`."""
        if kv_dtype not in KV_DTYPE_BYTES:
            raise ValueError(f"kv_dtype must be one of {sorted(KV_DTYPE_BYTES)}, got {kv_dtype!r}")
        if sliding == "ring" and ctx is None:
            raise ValueError("sliding='ring' needs ctx")
        total = 0.0
        for layer in self.kv_layers:
            per_token: float = (
                2 * self.kv_heads_of(layer) * self.head_dim_of(layer) * KV_DTYPE_BYTES[kv_dtype]
            )
            if kv_dtype == "int8":
                per_token += 2 * self.kv_heads_of(layer) * KV_SCALE_BYTES
            if sliding == "ring" and not self.is_full(layer):
                assert ctx is not None
                per_token *= min(ctx, self.sliding_window) / ctx
            total += per_token
        return total


def _global_head_dim(d: dict[str, Any], layer_types: tuple[str, ...]) -> int:
    """Hub configs carry `global_head_dim`; transformers' save_pretrained instead writes a
    `per_layer_config` override ({layer: {"head_dim": ...}}) for every full-attention layer."""
    if d.get("global_head_dim"):
        return int(d["global_head_dim"])
    overrides = d.get("per_layer_config") or {}
    dims = {
        int(v["head_dim"]) for k, v in overrides.items() if layer_types[int(k)] == FULL and "head_dim" in v
    }
    if len(dims) > 1:
        raise UnsupportedConfigError(
            f"per_layer_config: full-attention layers disagree on head_dim {sorted(dims)}"
        )
    if any("num_key_value_heads" in v for v in overrides.values()):
        raise UnsupportedConfigError(
            "per_layer_config.num_key_value_heads: per-layer KV heads are a K=V (31B) feature"
        )
    return dims.pop() if dims else 512


def resolve_config_path(name_or_path: str | Path) -> Path:
    """A preset short name ("e2b", "tiny-a"), a preset file name, a config.json path or a checkpoint dir."""
    p = Path(name_or_path)
    if p.is_dir():
        p = p / "config.json"
    if p.is_file():
        return p
    stem = PRESET_ALIASES.get(str(name_or_path), str(name_or_path))
    candidate = CONFIG_DIR / f"{stem}.json"
    if candidate.is_file():
        return candidate
    known = sorted(list(PRESET_ALIASES) + [f.stem for f in CONFIG_DIR.glob("*.json")])
    raise FileNotFoundError(
        f"no model config {name_or_path!r}: not a file or directory, and not a preset ({known})"
    )


def load_config(name_or_path: str | Path) -> ModelConfig:
    path = resolve_config_path(name_or_path)
    raw = json.loads(path.read_text())
    name = path.parent.name if path.name == "config.json" else path.stem
    return ModelConfig.from_hf_dict(raw, name=name)
