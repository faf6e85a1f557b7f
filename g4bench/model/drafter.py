"""The Gemma 4 assistant drafter ("gemma4_assistant", MTP-style), as pure JAX.

Parity reference: transformers' `Gemma4AssistantForCausalLM` (models/gemma4_assistant) driven by
`SinglePositionMultiTokenCandidateGenerator` (generation/candidate_generator.py). Data flow of one
drafting step, for each sequence:

    x = pre_proj(cat(target_embed(last_token) · √H_t, last_hidden))      2·B → H_d
    for each drafter layer (every one KV-shared: no K/V projections):
        q = rope(rms(x Wq)·w_q, position);  a = softmax(q kᵀ + mask) v     k, v: the TARGET's cache
        (the target's last KV-owning layer of the same type; sliding layers see keys p−W..p)
        h += rms(a Wo)·w_post_attn;  h += rms(mlp(rms(h)·w_pre_ffw))·w_post_ffw;  h *= layer_scalar
    h = rms(h)·w_final
    logits = h · embedᵀ   (or, with ordered embeddings, only the top-k centroids' token clusters)
    next_hidden = post_proj(h)                                             H_d → B

The next step feeds the drafted token (target embedding) and `next_hidden` at the SAME position
(the drafter never writes KV: it is locked to the last position the target has seen). B is the
target's hidden size (`backbone_hidden_size`); the attention head dims and KV heads equal the
target's, because the drafter reads the target's K/V.

`DrafterConfig` reads an HF assistant config.json (`text_config` + assistant fields);
`drafter_specs` / `init_drafter` give the parameter tree and synthetic weights; `load_drafter`
reads the safetensors checkpoint; `draft_step` is one step. Presets `<preset>-assistant`
(configs/models/) carry the drafter dims assumed for each target (see their `_source`).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from g4bench.model.config import FULL, SLIDING, ModelConfig, UnsupportedConfigError, resolve_config_path
from g4bench.model.forward import apply_rope, linear, rms_norm, rope_tables
from g4bench.model.params import NORM_DTYPE, Params, WeightFormat, init_tree, linear_spec

ASSISTANT_SUFFIX = "-assistant"


@dataclass(frozen=True)
class DrafterConfig:
    """An assistant drafter: its own layer dims (`text`) plus the target-facing fields.

    `text` is a ModelConfig used as a carrier of layer dims (heads, head dims, MLP width, RoPE,
    layer types); its `num_kv_shared_layers` is 0 there, but every drafter layer is KV-shared."""

    text: ModelConfig
    backbone_hidden_size: int
    use_ordered_embeddings: bool
    num_centroids: int
    centroid_top_k: int
    name: str = "custom-assistant"

    @classmethod
    def from_hf_dict(cls, raw: dict[str, Any], name: str = "custom-assistant") -> DrafterConfig:
        if raw.get("model_type", "gemma4_assistant") != "gemma4_assistant":
            raise UnsupportedConfigError(f"model_type={raw.get('model_type')!r}: not a gemma4_assistant")
        if "text_config" not in raw:
            raise UnsupportedConfigError("an assistant config.json needs a text_config")
        d = dict(raw["text_config"])
        layers = int(d["num_hidden_layers"])
        for key, want in (("hidden_size_per_layer_input", 0), ("vocab_size_per_layer_input", 0)):
            if int(d.get(key) or 0) != want:
                raise UnsupportedConfigError(f"text_config.{key} must be 0 in an assistant, got {d[key]}")
        if d.get("use_double_wide_mlp"):
            raise UnsupportedConfigError("text_config.use_double_wide_mlp must be false in an assistant")
        shared = d.get("num_kv_shared_layers") or layers
        if int(shared) != layers:
            raise UnsupportedConfigError(f"every assistant layer shares KV: num_kv_shared_layers={shared}")
        d.update(num_kv_shared_layers=0, hidden_size_per_layer_input=0)
        d["vocab_size_per_layer_input"] = d["vocab_size"]
        text = ModelConfig.from_hf_dict(d, name=f"{name}/text")
        c = cls(
            text=text,
            backbone_hidden_size=int(raw.get("backbone_hidden_size", 1536)),
            use_ordered_embeddings=bool(raw.get("use_ordered_embeddings", False)),
            num_centroids=int(raw.get("num_centroids", 2048)),
            centroid_top_k=int(raw.get("centroid_intermediate_top_k", 32)),
            name=name,
        )
        if c.use_ordered_embeddings and text.vocab_size % c.num_centroids:
            raise UnsupportedConfigError(f"vocab_size {text.vocab_size} not a multiple of num_centroids")
        return c

    def check_target(self, target: ModelConfig) -> None:
        """Raise unless this drafter can read `target`'s KV and hidden states."""
        t, d = target, self.text
        problems = []
        if self.backbone_hidden_size != t.hidden_size:
            problems.append(
                f"backbone_hidden_size {self.backbone_hidden_size} != target hidden {t.hidden_size}"
            )
        if d.vocab_size != t.vocab_size:
            problems.append(f"vocab {d.vocab_size} != target vocab {t.vocab_size}")
        if (d.head_dim, d.global_head_dim, d.num_key_value_heads) != (
            t.head_dim,
            t.global_head_dim,
            t.num_key_value_heads,
        ):
            problems.append("head dims / KV heads differ from the target's (it reads the target's KV)")
        if set(d.layer_types) - set(t.layer_types[: t.first_kv_shared_layer]):
            problems.append("a drafter layer type has no KV-owning target layer")
        if problems:
            raise UnsupportedConfigError(
                f"drafter {self.name} does not fit target {t.name}: {'; '.join(problems)}"
            )


def is_assistant(name_or_path: str | Path) -> bool:
    """Whether a model name, config.json or checkpoint directory is an assistant drafter (a preset
    `<preset>-assistant`, or a config whose model_type is gemma4_assistant)."""
    name = str(name_or_path)
    if name.endswith(ASSISTANT_SUFFIX):
        return True
    try:
        path = resolve_config_path(name)
    except (FileNotFoundError, ValueError, UnsupportedConfigError):
        return False  # not a config this engine can find: loading it reports why
    return json.loads(path.read_text()).get("model_type") == "gemma4_assistant"


def load_drafter_config(name_or_path: str | Path) -> DrafterConfig:
    """A preset ("tiny-a-assistant", "e2b-assistant"), a config.json or a checkpoint directory."""
    name = str(name_or_path)
    if name.endswith(ASSISTANT_SUFFIX) and not Path(name).exists():
        from g4bench.model.config import PRESET_ALIASES

        base = name[: -len(ASSISTANT_SUFFIX)]
        name = PRESET_ALIASES.get(base, base) + ASSISTANT_SUFFIX
    path = resolve_config_path(name)
    stem = path.parent.name if path.name == "config.json" else path.stem
    return DrafterConfig.from_hf_dict(json.loads(path.read_text()), name=stem)


# ---------------------------------------------------------------------------- parameters
def drafter_specs(dc: DrafterConfig, fmt: WeightFormat) -> Params:
    """Abstract parameter tree: embed [V, Hd] (tied head), pre_proj 2B → Hd, post_proj Hd → B,
    final_norm, optional centroids Hd → C + token_ordering i32 [V], and per layer the target
    layer's leaves minus k / v / k_norm / PLE."""
    c = dc.text
    H, B = c.hidden_size, dc.backbone_hidden_size
    norm = lambda n: jax.ShapeDtypeStruct((n,), NORM_DTYPE)  # noqa: E731
    dt = {"bf16": jnp.bfloat16, "f32": jnp.float32}
    tree: Params = {
        "embed": jax.ShapeDtypeStruct((c.vocab_size, H), dt[fmt.embed]),
        "pre_proj": linear_spec(2 * B, H, fmt.layers),
        "post_proj": linear_spec(H, B, fmt.layers),
        "final_norm": norm(H),
        "layers": [],
    }
    if dc.use_ordered_embeddings:
        tree["centroids"] = linear_spec(H, dc.num_centroids, fmt.layers)
        tree["token_ordering"] = jax.ShapeDtypeStruct((c.vocab_size,), jnp.int32)
    for i in range(c.num_hidden_layers):
        hd, nh = c.head_dim_of(i), c.num_attention_heads
        tree["layers"].append({
            "input_norm": norm(H), "post_attn_norm": norm(H), "pre_ffw_norm": norm(H), "post_ffw_norm": norm(H),
            "q": linear_spec(H, nh * hd, fmt.layers), "q_norm": norm(hd), "o": linear_spec(nh * hd, H, fmt.layers),
            "gate": linear_spec(H, c.intermediate_size, fmt.layers),
            "up": linear_spec(H, c.intermediate_size, fmt.layers),
            "down": linear_spec(c.intermediate_size, H, fmt.layers),
            "layer_scalar": jax.ShapeDtypeStruct((1,), jnp.float32),
        })  # fmt: skip
    return tree


def init_drafter(dc: DrafterConfig, fmt: WeightFormat, seed: int = 0) -> Params:
    """Synthetic weights with the real shapes (timing and memory, not quality); the token ordering
    is a random permutation, so every token belongs to exactly one centroid cluster."""
    specs = drafter_specs(dc, fmt)
    ordering = specs.pop("token_ordering", None)
    tree = init_tree(specs, seed)
    if ordering is not None:
        perm = np.random.default_rng(seed).permutation(dc.text.vocab_size).astype(np.int32)
        tree["token_ordering"] = jnp.asarray(perm)
    return tree


# ---------------------------------------------------------------------------- one step
@dataclass(frozen=True)
class TargetKV:
    """The target's K/V for one layer type, as the drafter reads it: k, v [B, kvh, L, d]
    (compute dtype), key positions i32 [B, L], key_ok bool [B, L] (a real, written key)."""

    k: jax.Array
    v: jax.Array
    key_pos: jax.Array
    key_ok: jax.Array


jax.tree_util.register_dataclass(TargetKV, data_fields=["k", "v", "key_pos", "key_ok"], meta_fields=[])


def draft_step(
    params: Params,
    dc: DrafterConfig,
    token_embed: jax.Array,
    prev_hidden: jax.Array,
    position: jax.Array,
    kv: dict[str, TargetKV],
    compute_dtype: Any = jnp.float32,
) -> tuple[jax.Array, jax.Array]:
    """One drafting step for B sequences.

    token_embed [B, Bh]: the target's scaled embedding of the last token; prev_hidden [B, Bh]: the
    target's final hidden state there (first step) or the previous step's projected state;
    position i32 [B]: the last position the target has seen. Returns (logits f32 [B, V],
    next_hidden [B, Bh])."""
    c, eps, cdt = dc.text, dc.text.rms_norm_eps, compute_dtype
    x = linear(jnp.concatenate([token_embed, prev_hidden], axis=-1).astype(cdt), params["pre_proj"])
    h = x[:, None, :]  # [B, 1, H]
    for i, lp in enumerate(params["layers"]):
        ltype = c.layer_types[i]
        hd, nh = c.head_dim_of(i), c.num_attention_heads
        theta = c.rope_theta_full if ltype == FULL else c.rope_theta_sliding
        cos, sin = rope_tables(position[:, None], hd, theta, c.rotary_pairs(i))
        xn = rms_norm(h, lp["input_norm"], eps)
        q = apply_rope(rms_norm(linear(xn, lp["q"]).reshape(-1, 1, nh, hd), lp["q_norm"], eps), cos, sin)
        t = kv[ltype]
        ok = t.key_ok
        if ltype == SLIDING:
            # HF's bidirectional sliding overlay is inclusive (|q − k| ≤ W): W + 1 keys, one more
            # than the target's own causal window (k > q − W).
            ok = ok & (t.key_pos >= position[:, None] - c.sliding_window)
        kvh = t.k.shape[1]
        qg = q[:, 0].reshape(-1, kvh, nh // kvh, hd).astype(jnp.float32)  # [B, kvh, g, d]
        scores = jnp.einsum("bkgd,bkld->bkgl", qg, t.k.astype(jnp.float32))
        scores = jnp.where(ok[:, None, None, :], scores, -jnp.inf)
        a = jnp.einsum("bkgl,bkld->bkgd", jax.nn.softmax(scores, axis=-1), t.v.astype(jnp.float32))
        a = a.reshape(-1, 1, nh * hd).astype(cdt)
        h = h + rms_norm(linear(a, lp["o"]), lp["post_attn_norm"], eps)
        xn = rms_norm(h, lp["pre_ffw_norm"], eps)
        m = linear(jax.nn.gelu(linear(xn, lp["gate"]), approximate=True) * linear(xn, lp["up"]), lp["down"])
        h = h + rms_norm(m, lp["post_ffw_norm"], eps)
        h = h * lp["layer_scalar"].astype(cdt)
    h = rms_norm(h[:, 0], params["final_norm"], eps)
    embed = params["embed"].astype(cdt)
    if dc.use_ordered_embeddings:
        logits = _ordered_logits(params, dc, h, embed)
    else:
        logits = jnp.einsum("bh,vh->bv", h, embed, preferred_element_type=jnp.float32)
    return logits, linear(h, params["post_proj"])


def _ordered_logits(params: Params, dc: DrafterConfig, h: jax.Array, embed: jax.Array) -> jax.Array:
    """HF's Gemma4AssistantMaskedEmbedder: score only the tokens of the top-k centroids; every
    other token gets (the row's lowest selected logit − 1)."""
    V, C = dc.text.vocab_size, dc.num_centroids
    _, top = jax.lax.top_k(linear(h, params["centroids"]).astype(jnp.float32), dc.centroid_top_k)
    clusters = params["token_ordering"].reshape(C, V // C)
    sel = clusters[top].reshape(h.shape[0], -1)  # [B, k·V/C] canonical token ids
    scores = jnp.einsum("bh,bnh->bn", h, embed[sel], preferred_element_type=jnp.float32)
    fill = scores.min(axis=-1, keepdims=True) - 1.0
    out = jnp.broadcast_to(fill, (h.shape[0], V))
    return out.at[jnp.arange(h.shape[0])[:, None], sel].set(scores)


def target_embed(target_params: Params, target: ModelConfig, tokens: jax.Array, cdt: Any) -> jax.Array:
    """The target's scaled token embedding (the drafter's first input half)."""
    e = target_params["embed"]
    return e[tokens].astype(cdt) * jnp.asarray(math.sqrt(target.hidden_size), e.dtype).astype(cdt)


# ---------------------------------------------------------------------------- checkpoint
_LAYER_NAMES = {
    "input_norm": "input_layernorm", "post_attn_norm": "post_attention_layernorm",
    "pre_ffw_norm": "pre_feedforward_layernorm", "post_ffw_norm": "post_feedforward_layernorm",
    "q": "self_attn.q_proj", "q_norm": "self_attn.q_norm", "o": "self_attn.o_proj",
    "gate": "mlp.gate_proj", "up": "mlp.up_proj", "down": "mlp.down_proj", "layer_scalar": "layer_scalar",
}  # fmt: skip


def load_drafter(directory: str | Path, fmt: WeightFormat | None = None) -> tuple[DrafterConfig, Params]:
    """An HF `Gemma4AssistantForCausalLM` checkpoint (config.json + safetensors) → (config, host
    arrays in `drafter_specs`' tree). Layer tensors sit under `model.`; `pre_projection`,
    `post_projection` and `masked_embedding.*` at the top level; every shape is checked."""
    import copy

    from g4bench.model.checkpoint import CheckpointError, TensorIndex, _expect, _load_linear, _np_dtype

    directory = Path(directory)
    if not (directory / "config.json").is_file():
        raise CheckpointError(f"{directory} has no config.json")
    dc = DrafterConfig.from_hf_dict(json.loads((directory / "config.json").read_text()), name=directory.name)
    fmt = fmt or WeightFormat(layers="bf16", ple="bf16", embed="bf16")
    index = TensorIndex(directory)
    top = copy.copy(index)
    top.prefix = ""
    specs = drafter_specs(dc, fmt)

    def norm(ix: TensorIndex, name: str, dim: int) -> np.ndarray:
        return _expect(ix, name, ix.get(name), (dim,)).astype(np.float32)

    def lin(ix: TensorIndex, name: str, spec: dict[str, Any]) -> dict[str, Any]:
        from g4bench.model.params import linear_dims

        return _load_linear(ix, name, *linear_dims(spec), fmt.layers)

    H = dc.text.hidden_size
    embed = _expect(index, "embed_tokens.weight", index.get("embed_tokens.weight"), (dc.text.vocab_size, H))
    params: Params = {
        "embed": embed.astype(_np_dtype(fmt.embed)),
        "pre_proj": lin(top, "pre_projection", specs["pre_proj"]),
        "post_proj": lin(top, "post_projection", specs["post_proj"]),
        "final_norm": norm(index, "norm.weight", H),
        "layers": [],
    }
    if dc.use_ordered_embeddings:
        params["centroids"] = lin(top, "masked_embedding.centroids", specs["centroids"])
        order = _expect(top, "masked_embedding.token_ordering", top.get("masked_embedding.token_ordering"),
                        (dc.text.vocab_size,))  # fmt: skip
        params["token_ordering"] = order.astype(np.int32)
    for i, layer_spec in enumerate(specs["layers"]):
        layer: Params = {}
        for short, spec in layer_spec.items():
            name = f"layers.{i}.{_LAYER_NAMES[short]}"
            if short == "layer_scalar":
                value = index.get(name) if index.has(name) else index.get(f"{name}.weight")
                layer[short] = _expect(index, name, np.asarray(value).reshape(-1), (1,)).astype(np.float32)
            elif isinstance(spec, dict):
                layer[short] = lin(index, name, spec)
            else:
                layer[short] = norm(index, f"{name}.weight", spec.shape[0])
        params["layers"].append(layer)
    return dc, params
