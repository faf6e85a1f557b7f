"""ModelConfig: HF config.json (nested and flat), unsupported fields, E2B/E4B derived architecture."""

from __future__ import annotations

import json

import pytest

from g4bench.model.config import CONFIG_DIR, FULL, SLIDING, ModelConfig, UnsupportedConfigError, load_config


def _raw(name: str) -> dict:
    return json.loads((CONFIG_DIR / f"{name}.json").read_text())


def test_nested_text_config_equals_flat():
    flat = _raw("gemma-4-e2b")
    nested = {"model_type": "gemma4", "text_config": flat, "vision_config": {"hidden_size": 768}}
    assert ModelConfig.from_hf_dict(nested) == ModelConfig.from_hf_dict(flat)


def test_e2b_derived_values():
    cfg = load_config("e2b")
    assert (cfg.num_hidden_layers, cfg.hidden_size, cfg.num_key_value_heads, cfg.sliding_window) == (
        35,
        1536,
        1,
        512,
    )
    assert cfg.first_kv_shared_layer == 15
    assert cfg.kv_layers == tuple(range(15))
    full = [i for i in range(35) if cfg.is_full(i)]
    assert full == [4, 9, 14, 19, 24, 29, 34]
    for i in range(15, 35):
        assert cfg.kv_source(i) == (14 if i in full else 13)
        assert cfg.mlp_width_of(i) == 12288
    for i in range(15):
        assert cfg.kv_source(i) == i
        assert cfg.mlp_width_of(i) == 6144
    assert [cfg.head_dim_of(i) for i in (0, 4)] == [256, 512]
    # proportional partial RoPE: 0.25 of the 256 pairs of a 512-wide full-attention head
    assert cfg.rotary_pairs(4) == 64 and cfg.rotary_pairs(0) == 128
    assert cfg.ple_width == 35 * 256 and cfg.final_logit_softcapping == 30.0


def test_e4b_derived_values():
    cfg = load_config("e4b")
    assert cfg.first_kv_shared_layer == 42 - 18 == 24
    assert {cfg.mlp_width_of(i) for i in range(42)} == {10240}  # not double-wide
    assert cfg.kv_source(41) == 23 and cfg.kv_source(40) == 22  # last full / sliding owners below 24
    assert cfg.num_key_value_heads == 2


def test_global_head_dim_from_per_layer_config():
    """transformers' save_pretrained writes per_layer_config overrides instead of global_head_dim."""
    d = _raw("tiny-a")
    del d["global_head_dim"]
    d["per_layer_config"] = {"3": {"head_dim": 64}, "7": {"head_dim": 64}}
    assert ModelConfig.from_hf_dict(d).global_head_dim == 64


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"enable_moe_block": True}, "enable_moe_block"),
        ({"attention_k_eq_v": True}, "attention_k_eq_v"),
        (
            {
                "rope_parameters": {
                    SLIDING: {"rope_type": "default"},
                    FULL: {"rope_type": "yarn", "factor": 8.0},
                }
            },
            "rope_type",
        ),
        (
            {"rope_parameters": {SLIDING: {"rope_type": "linear"}, FULL: {"rope_type": "default"}}},
            "rope_type",
        ),
        ({"hidden_activation": "relu"}, "hidden_activation"),
        ({"tie_word_embeddings": False}, "tie_word_embeddings"),
    ],
)
def test_unsupported_configs_name_the_field(change, field):
    d = {**_raw("tiny-a"), **change}
    with pytest.raises(UnsupportedConfigError, match=field):
        ModelConfig.from_hf_dict(d)


def test_kv_bytes_per_token_rejects_unknown_dtype():
    with pytest.raises(ValueError, match="kv_dtype"):
        load_config("tiny-a").kv_bytes_per_token("fp8")
