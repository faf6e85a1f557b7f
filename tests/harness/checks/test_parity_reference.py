"""The reference helpers in harness/checks/parity.py (transformers + compressed-tensors) behave as documented."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.parity
torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("compressed_tensors")

from safetensors import safe_open  # noqa: E402

from harness.checks import parity  # noqa: E402

MODELS = Path(__file__).resolve().parents[3] / "configs" / "models"
TINY = ["tiny-a", "tiny-b"]
SEED = 3


def _cfg(name: str) -> dict:
    return json.loads((MODELS / f"{name}.json").read_text())


def _tensors(ckpt: Path) -> dict[str, tuple[tuple[int, ...], str]]:
    with safe_open(ckpt / "model.safetensors", "pt") as f:
        return {k: (tuple(f.get_slice(k).get_shape()), f.get_slice(k).get_dtype()) for k in f.keys()}  # noqa: SIM118


def _prompt(cfg: dict, n: int, batch: int = 2, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(3, cfg["vocab_size"], size=(batch, n))


@pytest.fixture(scope="module", params=TINY)
def tiny(request, tmp_path_factory):
    name = request.param
    root = tmp_path_factory.mktemp(name)
    return {
        "name": name,
        "cfg": _cfg(name),
        "hf": parity.write_hf_checkpoint(MODELS / f"{name}.json", root / "hf", seed=SEED),
        "ct": parity.write_ct_w4a16_checkpoint(MODELS / f"{name}.json", root / "ct", seed=SEED),
    }


@pytest.mark.parametrize("name", TINY)
def test_tiny_configs_turn_on_every_feature(name):
    from transformers import Gemma4TextConfig

    d = _cfg(name)
    c = Gemma4TextConfig(**d)
    modes, types = c.kv_sharing_modes, c.layer_types
    reuse_types = {t for t, m in zip(types, modes, strict=True) if m == "reuse"}
    assert reuse_types == {"sliding_attention", "full_attention"}
    first_shared = d["num_hidden_layers"] - d["num_kv_shared_layers"]
    for t in ("sliding_attention", "full_attention"):
        last_own = max(i for i in range(first_shared) if types[i] == t)
        assert modes[last_own] == "store"
    assert d["head_dim"] != d["global_head_dim"]
    assert d["use_double_wide_mlp"] and d["hidden_size_per_layer_input"] > 0 and d["tie_word_embeddings"]
    assert d["vocab_size_per_layer_input"] == d["vocab_size"] >= 259
    assert d["rope_parameters"]["full_attention"]["rope_type"] == "proportional"
    assert d["final_logit_softcapping"] == 30.0
    # every matmul input dim is a multiple of the W4A16 group (32)
    heads = d["num_attention_heads"]
    for dim in (
        d["hidden_size"],
        d["intermediate_size"],
        heads * d["head_dim"],
        heads * d["global_head_dim"],
        d["hidden_size_per_layer_input"],
    ):
        assert dim % 32 == 0


@pytest.mark.parametrize(
    ("name", "expected"),
    [("gemma-4-e2b", 4_628_569_344), ("gemma-4-e4b", 7_463_013_376)],
)
def test_real_presets_param_count_on_meta(name, expected):
    from transformers import Gemma4ForCausalLM, Gemma4TextConfig

    d = _cfg(name)
    assert "_source" in d
    with torch.device("meta"):
        model = Gemma4ForCausalLM(Gemma4TextConfig(**d))
    assert sum(p.numel() for p in model.parameters()) == expected  # tied LM head counted once


def test_hf_checkpoint_layout(tiny):
    cfg, names = tiny["cfg"], _tensors(tiny["hf"])
    n_layers, shared = cfg["num_hidden_layers"], set(parity.shared_kv_layers(cfg))
    assert "lm_head.weight" not in names  # tied, not saved
    assert names["model.embed_tokens.weight"] == ((cfg["vocab_size"], cfg["hidden_size"]), "F32")
    ple = cfg["hidden_size_per_layer_input"]
    assert names["model.embed_tokens_per_layer.weight"][0] == (cfg["vocab_size"], n_layers * ple)
    assert names["model.per_layer_model_projection.weight"][0] == (n_layers * ple, cfg["hidden_size"])
    assert names["model.per_layer_projection_norm.weight"][0] == (ple,)
    for i in range(n_layers):
        p = f"model.layers.{i}."
        assert names[p + "layer_scalar"] == ((1,), "F32")
        full = cfg["layer_types"][i] == "full_attention"
        hd = cfg["global_head_dim"] if full else cfg["head_dim"]
        assert names[p + "self_attn.q_proj.weight"][0] == (
            cfg["num_attention_heads"] * hd,
            cfg["hidden_size"],
        )
        assert names[p + "self_attn.q_norm.weight"][0] == (hd,)
        width = cfg["intermediate_size"] * (2 if i in shared else 1)
        assert names[p + "mlp.gate_proj.weight"][0] == (width, cfg["hidden_size"])
        assert names[p + "mlp.down_proj.weight"][0] == (cfg["hidden_size"], width)
        has_kv = {s: p + f"self_attn.{s}.weight" in names for s in ("k_proj", "v_proj", "k_norm")}
        assert all(v == (i not in shared) for v in has_kv.values()), (i, has_kv)
        assert p + "self_attn.v_norm.weight" not in names
    k0 = "model.layers.0.self_attn.k_proj.weight"
    assert names[k0][0] == (cfg["num_key_value_heads"] * cfg["head_dim"], cfg["hidden_size"])
    # transformers writes per_layer_config (not global_head_dim) into config.json
    saved = json.loads((tiny["hf"] / "config.json").read_text())
    fulls = [i for i, t in enumerate(cfg["layer_types"]) if t == "full_attention"]
    assert saved["per_layer_config"] == {str(i): {"head_dim": cfg["global_head_dim"]} for i in fulls}


def test_hf_checkpoint_weights_are_random_and_deterministic(tiny, tmp_path):
    from safetensors.numpy import load_file

    w = load_file(tiny["hf"] / "model.safetensors")
    scalars = np.concatenate([v for k, v in w.items() if k.endswith("layer_scalar")])
    assert np.all((scalars >= 0.3) & (scalars <= 1.0)) and np.unique(scalars).size == scalars.size
    norm = w["model.layers.0.input_layernorm.weight"]
    assert not np.allclose(norm, 1.0) and abs(norm.mean() - 1.0) < 0.1
    again = load_file(
        parity.write_hf_checkpoint(tiny["cfg"], tmp_path / "again", seed=SEED) / "model.safetensors"
    )
    assert w.keys() == again.keys() and all(np.array_equal(w[k], again[k]) for k in w)


def test_hf_logits_shape_and_determinism(tiny):
    ids = _prompt(tiny["cfg"], 3 * tiny["cfg"]["sliding_window"])
    a = parity.hf_logits(tiny["hf"], ids)
    assert a.shape == (*ids.shape, tiny["cfg"]["vocab_size"]) and a.dtype == np.float32
    assert np.array_equal(a, parity.hf_logits(tiny["hf"], ids.tolist()))
    assert np.all(np.abs(a) < 30.0) and np.abs(a).max() > 5.0  # softcapped, not tiny
    # rows are independent: batch of 2 == each row alone
    assert np.allclose(a[1:], parity.hf_logits(tiny["hf"], ids[1:]), atol=1e-5)
    # float64 reference agrees to f32 rounding
    assert np.abs(a - parity.hf_logits(tiny["hf"], ids, dtype="float64")).max() < 1e-4


def test_extra_shared_kv_tensors_are_ignored(tiny, tmp_path):
    cfg = tiny["cfg"]
    extra = parity.write_hf_checkpoint(cfg, tmp_path / "extra", seed=SEED, extra_shared_kv=True)
    i = parity.shared_kv_layers(cfg)[0]
    assert f"model.layers.{i}.self_attn.k_proj.weight" in _tensors(extra)
    ids = _prompt(cfg, 20)
    assert np.array_equal(parity.hf_logits(extra, ids), parity.hf_logits(tiny["hf"], ids))


def test_ct_checkpoint_layout(tiny):
    cfg, names = tiny["cfg"], _tensors(tiny["ct"])
    q = json.loads((tiny["ct"] / "config.json").read_text())["quantization_config"]
    assert q["quant_method"] == "compressed-tensors" and q["format"] == "pack-quantized"
    assert q["ignore"] == ["lm_head"]
    (group,) = q["config_groups"].values()
    want = {"num_bits": 4, "type": "int", "symmetric": True, "strategy": "group", "group_size": 32}
    assert {k: group["weights"][k] for k in want} == want
    assert "lm_head.weight" not in names and "lm_head.weight_packed" not in names
    assert names["model.embed_tokens.weight"][1] == "BF16"
    assert names["model.layers.0.layer_scalar"] == ((1,), "BF16")
    packed = [k.removesuffix(".weight_packed") for k in names if k.endswith(".weight_packed")]
    assert "model.per_layer_model_projection" in packed
    shared = set(parity.shared_kv_layers(cfg))
    per_layer = [
        "q_proj",
        "o_proj",
        "gate_proj",
        "up_proj",
        "down_proj",
        "per_layer_input_gate",
        "per_layer_projection",
    ]
    expected = 1 + sum(len(per_layer) + (0 if i in shared else 2) for i in range(cfg["num_hidden_layers"]))
    assert len(packed) == expected
    hf = _tensors(tiny["hf"])
    for prefix in packed:
        out_f, in_f = hf[prefix + ".weight"][0]
        assert prefix + ".weight" not in names
        assert names[prefix + ".weight_packed"] == ((out_f, in_f // 8), "I32")
        assert names[prefix + ".weight_scale"] == ((out_f, in_f // 32), "BF16")
        assert names[prefix + ".weight_shape"][0] == (2,)
        assert prefix + ".weight_zero_point" not in names


def _ct_arrays(ckpt: Path, prefix: str):
    import ml_dtypes
    from safetensors.torch import load_file

    t = load_file(ckpt / "model.safetensors")
    scale = t[prefix + ".weight_scale"].to(torch.float32).numpy().astype(ml_dtypes.bfloat16)
    return t[prefix + ".weight_packed"].numpy(), scale, t[prefix + ".weight_shape"].tolist()


def test_ct_decompression_is_d5_layout_bit_exact(tiny):
    """nibble i of int32 word j = column 8j+i, stored q+8; value = bf16(q * bf16 scale)."""
    dense = parity.ct_decompressed_weights(tiny["ct"])
    assert dense
    for name, w in dense.items():
        packed, scale, shape = _ct_arrays(tiny["ct"], name.removesuffix(".weight"))
        assert w.dtype == np.float32 and list(w.shape) == shape
        mine = parity.unpack_w4a16_numpy(packed, scale, shape).astype(np.float32)
        assert np.array_equal(mine.view(np.uint32), w.view(np.uint32)), name


def test_ct_decompressed_within_half_step_of_original(tiny):
    model = parity.build_hf_model(tiny["cfg"], SEED).to(torch.bfloat16)
    original = {k: v.to(torch.float32).numpy() for k, v in model.state_dict().items()}
    for name, w in parity.ct_decompressed_weights(tiny["ct"]).items():
        _, scale, _ = _ct_arrays(tiny["ct"], name.removesuffix(".weight"))
        step = np.repeat(scale.astype(np.float32), 32, axis=1)
        err = np.abs(w - original[name]) / step
        # half a step, plus (in steps, |q| <= 8, bf16 half-ulp 2^-9) the bf16 rounding of w/s, of the
        # min-max scale (clamp overshoot at the group's absmax) and of q*s
        assert err.max() <= 0.5 + 3 * 8 * 2**-9, (name, err.max())
        assert np.mean(err) < 0.3


def test_hf_logits_on_ct_checkpoint_uses_ct_decompression(tiny):
    model = parity.load_hf_model(tiny["ct"])
    state = model.state_dict()
    for name, w in parity.ct_decompressed_weights(tiny["ct"]).items():
        assert torch.equal(state[name], torch.from_numpy(w)), name
    ids = _prompt(tiny["cfg"], 2 * tiny["cfg"]["sliding_window"] + 3)
    a = parity.hf_logits(tiny["ct"], ids)
    assert a.shape == (*ids.shape, tiny["cfg"]["vocab_size"]) and np.all(np.isfinite(a))
    assert np.array_equal(a, parity.hf_logits(tiny["ct"], ids))


def test_hf_cached_greedy_matches_full_forward(tiny):
    cfg = tiny["cfg"]
    prompt = _prompt(cfg, cfg["sliding_window"] + 5, batch=1, seed=7)[0].tolist()
    tokens, step_logits = parity.hf_greedy(tiny["hf"], prompt, 12)
    assert len(tokens) == 12 and step_logits.shape == (12, cfg["vocab_size"])
    full = parity.hf_logits(tiny["hf"], [prompt + tokens[:-1]])[0, len(prompt) - 1 :]
    assert np.abs(full - step_logits).max() < 1e-4
    assert np.array_equal(full.argmax(-1), np.array(tokens))
