"""The assistant drafter against transformers' Gemma4AssistantForCausalLM, and its presets.

Data flow: transformers builds the tiny-a-assistant drafter with random weights (float64) and a
random token ordering → the same weights copied into our tree (f32) → both run one drafting step
over the same target K/V (`shared_kv_states`, 20 keys: 2.5× the 8-key sliding window, so the
sliding mask matters), the same `inputs_embeds` and position; logits and the projected hidden state
must agree to 1e-4. Both with ordered embeddings (the centroid head) and without.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from g4bench.model.config import CONFIG_DIR, UnsupportedConfigError, load_config
from g4bench.model.drafter import (
    DrafterConfig,
    TargetKV,
    draft_step,
    drafter_specs,
    init_drafter,
    load_drafter_config,
)
from g4bench.model.params import WeightFormat, param_bytes, tree_bytes

F32 = WeightFormat(layers="f32", ple="f32", embed="f32")
PRESETS = ("tiny-a", "tiny-b", "small", "e2b", "e4b")


@pytest.mark.parametrize("preset", PRESETS)
def test_every_preset_has_a_fitting_assistant(preset):
    target = load_config(preset)
    dc = load_drafter_config(f"{preset}-assistant")
    dc.check_target(target)
    assert dc.backbone_hidden_size == target.hidden_size
    # A drafter is a small fraction of its target.
    fmt = WeightFormat()
    assert tree_bytes(drafter_specs(dc, fmt)) < 0.25 * param_bytes(target, fmt)


def test_mismatched_target_is_refused():
    with pytest.raises(UnsupportedConfigError, match="backbone_hidden_size"):
        load_drafter_config("tiny-a-assistant").check_target(load_config("tiny-b"))


def test_non_shared_assistant_layers_are_refused():
    raw = json.loads((CONFIG_DIR / "tiny-a-assistant.json").read_text())
    raw["text_config"]["num_kv_shared_layers"] = 2
    with pytest.raises(UnsupportedConfigError, match="shares KV"):
        DrafterConfig.from_hf_dict(raw)


def test_synthetic_init_fills_the_spec_tree():
    dc = load_drafter_config("tiny-a-assistant")
    params = init_drafter(dc, WeightFormat())
    import jax

    specs = drafter_specs(dc, WeightFormat())
    assert jax.tree_util.tree_structure(params) == jax.tree_util.tree_structure(specs)
    order = np.asarray(params["token_ordering"])
    assert sorted(order.tolist()) == list(range(dc.text.vocab_size))


# ---------------------------------------------------------------------------- parity
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
L = 20


def _hf_model(raw: dict, seed: int):
    from transformers import Gemma4AssistantConfig, Gemma4AssistantForCausalLM

    cfg = Gemma4AssistantConfig(**{k: v for k, v in raw.items() if not k.startswith("_")})
    cfg.text_config._attn_implementation = "eager"  # type: ignore[union-attr]
    torch.manual_seed(seed)
    model = Gemma4AssistantForCausalLM(cfg).double().eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.normal_(0, 1.0 if "norm" in name or "scalar" in name else 0.2)
        if model.masked_embedding is not None:
            V = raw["text_config"]["vocab_size"]
            g = torch.Generator().manual_seed(seed)
            model.masked_embedding.token_ordering.copy_(torch.randperm(V, generator=g))
    return model


def _our_params(model, dc: DrafterConfig) -> dict:
    sd = {k: v.detach().numpy().astype(np.float32) for k, v in model.state_dict().items()}
    sd.update({k: v.detach().numpy() for k, v in model.state_dict().items() if "token_ordering" in k})
    lin = lambda name: {"w": sd[f"{name}.weight"].T.copy()}  # noqa: E731
    tree = {
        "embed": sd["model.embed_tokens.weight"],
        "pre_proj": lin("pre_projection"),
        "post_proj": lin("post_projection"),
        "final_norm": sd["model.norm.weight"],
        "layers": [],
    }
    if dc.use_ordered_embeddings:
        tree["centroids"] = lin("masked_embedding.centroids")
        tree["token_ordering"] = sd["masked_embedding.token_ordering"].astype(np.int32)
    names = {
        "input_norm": "input_layernorm", "post_attn_norm": "post_attention_layernorm",
        "pre_ffw_norm": "pre_feedforward_layernorm", "post_ffw_norm": "post_feedforward_layernorm",
        "q_norm": "self_attn.q_norm",
    }  # fmt: skip
    for i in range(dc.text.num_hidden_layers):
        p = f"model.layers.{i}."
        layer = {k: sd[p + v + ".weight"] for k, v in names.items()}
        layer |= {k: lin(p + v) for k, v in (("q", "self_attn.q_proj"), ("o", "self_attn.o_proj"),
                  ("gate", "mlp.gate_proj"), ("up", "mlp.up_proj"), ("down", "mlp.down_proj"))}  # fmt: skip
        layer["layer_scalar"] = sd[p + "layer_scalar"].reshape(1)
        tree["layers"].append(layer)
    return tree


@pytest.mark.parametrize("ordered", [True, False])
def test_draft_step_matches_transformers(ordered):
    import jax.numpy as jnp

    raw = json.loads((CONFIG_DIR / "tiny-a-assistant.json").read_text())
    raw["use_ordered_embeddings"] = ordered
    dc = DrafterConfig.from_hf_dict(raw, name="tiny-a-assistant")
    model = _hf_model(raw, seed=3)
    params = _our_params(model, dc)
    assert set(map(str, np.asarray(params["layers"][0]["q"]["w"]).shape)) <= {"32", "64"}

    rng = np.random.default_rng(0)
    kvh, B = dc.text.num_key_value_heads, dc.backbone_hidden_size
    kv_np = {
        t: (rng.standard_normal((1, kvh, L, d)), rng.standard_normal((1, kvh, L, d)))
        for t, d in (("sliding_attention", dc.text.head_dim), ("full_attention", dc.text.global_head_dim))
    }
    embeds = rng.standard_normal((1, 1, 2 * B))
    with torch.no_grad():
        out = model(
            inputs_embeds=torch.tensor(embeds),
            position_ids=torch.tensor([[L - 1]]),
            attention_mask=torch.ones((1, L), dtype=torch.long),
            shared_kv_states={t: (torch.tensor(k), torch.tensor(v)) for t, (k, v) in kv_np.items()},
        )
    ref_logits, ref_hidden = out.logits[0, 0].numpy(), out.last_hidden_state[0, 0].numpy()

    kv = {
        t: TargetKV(
            jnp.asarray(k, jnp.float32),
            jnp.asarray(v, jnp.float32),
            jnp.arange(L, dtype=jnp.int32)[None],
            jnp.ones((1, L), bool),
        )
        for t, (k, v) in kv_np.items()
    }
    logits, hidden = draft_step(
        params, dc, jnp.asarray(embeds[:, 0, :B], jnp.float32), jnp.asarray(embeds[:, 0, B:], jnp.float32),
        jnp.asarray([L - 1], jnp.int32), kv,
    )  # fmt: skip
    scale = np.abs(ref_logits).max()
    np.testing.assert_allclose(np.asarray(logits[0]), ref_logits, atol=1e-4 * max(scale, 1.0))
    np.testing.assert_allclose(
        np.asarray(hidden[0]), ref_hidden, atol=1e-4 * max(np.abs(ref_hidden).max(), 1)
    )
    assert int(np.argmax(logits[0])) == int(np.argmax(ref_logits))


def test_checkpoint_loads_into_the_spec_tree(tmp_path):
    """transformers' save_pretrained of the drafter → load_drafter (no torch) → the same arrays the
    parity test copies by hand, so the loaded drafter computes the same logits."""
    import jax

    from g4bench.model.drafter import load_drafter

    raw = json.loads((CONFIG_DIR / "tiny-a-assistant.json").read_text())
    model = _hf_model(raw, seed=4).float()
    model.save_pretrained(tmp_path / "ck")
    dc, params = load_drafter(tmp_path / "ck", F32)
    assert dc.use_ordered_embeddings and dc.backbone_hidden_size == 64
    want = _our_params(model, dc)
    assert jax.tree_util.tree_structure(params) == jax.tree_util.tree_structure(drafter_specs(dc, F32))
    for got, exp in zip(jax.tree_util.tree_leaves(params), jax.tree_util.tree_leaves(want), strict=True):
        np.testing.assert_array_equal(np.asarray(got), np.asarray(exp))
