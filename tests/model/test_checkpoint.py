"""Checkpoint loading: prefixes, skipped towers, extra KV tensors on shared layers, loud errors that name
the tensor and the file, packed words kept exact, and no torch on the load path.

Checkpoints are written once by transformers (`write_hf_checkpoint`, tiny-a) and edited in copies
with `safetensors.numpy` (rename, drop, reshape, add tensors)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap

import ml_dtypes
import numpy as np
import pytest

pytestmark = pytest.mark.parity
pytest.importorskip("torch")
pytest.importorskip("transformers")

import jax  # noqa: E402
from safetensors.numpy import load_file, save_file  # noqa: E402

from g4bench.model.checkpoint import CheckpointError, detect_format, load_checkpoint  # noqa: E402
from g4bench.model.config import CONFIG_DIR  # noqa: E402
from g4bench.model.params import WeightFormat  # noqa: E402
from g4bench.model.quant import unpack_int4_np  # noqa: E402
from harness.checks import parity  # noqa: E402

F32 = WeightFormat(layers="f32", ple="f32", embed="f32")
FILE = "model.safetensors"


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return parity.write_hf_checkpoint(
        CONFIG_DIR / "tiny-a.json", tmp_path_factory.mktemp("ck") / "hf", seed=2
    )


@pytest.fixture(scope="module")
def reference_params(ckpt):
    return load_checkpoint(ckpt, F32)[1]


def edited_copy(src, dst, edit):
    """Copy the checkpoint dir, then rewrite its tensors as `edit(dict) -> dict`."""
    shutil.copytree(src, dst)
    tensors = load_file(dst / FILE)
    save_file(edit(tensors), dst / FILE, metadata={"format": "pt"})
    return dst


def assert_trees_equal(a, b):
    la, lb = jax.tree_util.tree_leaves_with_path(a), jax.tree_util.tree_leaves_with_path(b)
    assert [p for p, _ in la] == [p for p, _ in lb]
    for (path, x), (_, y) in zip(la, lb, strict=True):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y), err_msg=jax.tree_util.keystr(path))


def test_text_only_checkpoint_loads(ckpt, reference_params):
    assert detect_format(ckpt).layers == "bf16"
    cfg, _ = load_checkpoint(ckpt, F32)
    assert cfg.global_head_dim == 64  # from transformers' per_layer_config, not global_head_dim
    assert "k" not in reference_params["layers"][cfg.first_kv_shared_layer]


def test_multimodal_prefix_and_towers_skipped(ckpt, reference_params, tmp_path):
    """`model.language_model.` is detected; vision/audio tower tensors (even malformed) are never read."""

    def edit(t):
        out = {k.replace("model.", "model.language_model.", 1): v for k, v in t.items()}
        out["model.vision_tower.encoder.layers.0.weight"] = np.zeros((3, 5), np.float32)
        out["model.audio_tower.conv.weight"] = np.zeros((7,), np.float32)
        out["model.embed_vision.embedding_projection.weight"] = np.zeros((2, 2), np.float32)
        return out

    mm = edited_copy(ckpt, tmp_path / "mm", edit)
    _, params = load_checkpoint(mm, F32)
    assert_trees_equal(params, reference_params)


def test_extra_kv_tensors_on_shared_layers_are_harmless(tmp_path, reference_params):
    extra = parity.write_hf_checkpoint(
        CONFIG_DIR / "tiny-a.json", tmp_path / "extra", seed=2, extra_shared_kv=True
    )
    assert "model.layers.7.self_attn.k_proj.weight" in load_file(extra / FILE)
    _, params = load_checkpoint(extra, F32)
    assert_trees_equal(params, reference_params)


def test_missing_tensor_names_tensor_and_file(ckpt, tmp_path):
    name = "model.layers.2.mlp.up_proj.weight"
    broken = edited_copy(ckpt, tmp_path / "missing", lambda t: {k: v for k, v in t.items() if k != name})
    with pytest.raises(CheckpointError, match=rf"missing tensor '{name}'.*{FILE}"):
        load_checkpoint(broken, F32)


def test_misshaped_tensor_names_tensor_and_file(ckpt, tmp_path):
    name = "model.layers.1.self_attn.q_norm.weight"
    broken = edited_copy(ckpt, tmp_path / "shape", lambda t: {**t, name: np.ones(7, np.float32)})
    with pytest.raises(CheckpointError, match=rf"'{name}' in {FILE} has shape \(7,\), expected \(32,\)"):
        load_checkpoint(broken, F32)


def test_no_safetensors_or_config_is_an_error(tmp_path):
    with pytest.raises(CheckpointError, match="config.json"):
        load_checkpoint(tmp_path)


def test_packed_words_never_pass_through_float32(ckpt, tmp_path):
    """Words above 2^24 (and negative ones) come out of the loader bit-identical (f32 holds 24 bits)."""
    name = "model.layers.0.self_attn.q_proj"
    out_dim, in_dim = 64, 64  # tiny-a layer 0: 2 heads × 32 → 64, from hidden 64
    rng = np.random.default_rng(0)
    words = rng.integers(-(2**31), 2**31, size=(out_dim, in_dim // 8), dtype=np.int64).astype(np.int32)
    words[0, :4] = [2**24 + 1, 2**31 - 1, -1, -(2**31)]
    scale = np.full((out_dim, in_dim // 32), 0.01, ml_dtypes.bfloat16)

    def edit(t):
        t = {k: v for k, v in t.items() if k != f"{name}.weight"}
        return {**t, f"{name}.weight_packed": words, f"{name}.weight_scale": scale}

    packed_ckpt = edited_copy(ckpt, tmp_path / "packed", edit)
    assert detect_format(packed_ckpt).layers == "w4a16"
    _, params = load_checkpoint(packed_ckpt, WeightFormat(layers="w4a16", ple="bf16", embed="bf16"))
    got = params["layers"][0]["q"]["packed"]
    assert got.dtype == np.int32
    np.testing.assert_array_equal(got, words)
    # dequantized at load (dense f32): bf16((nibble − 8) · scale), as compressed-tensors computes it
    _, dense = load_checkpoint(packed_ckpt, F32)
    q = unpack_int4_np(words).astype(np.float32)
    want = (q * np.float32(scale[0, 0])).astype(ml_dtypes.bfloat16).astype(np.float32)
    np.testing.assert_array_equal(dense["layers"][0]["q"]["w"], want.T)


def test_torch_absent_after_checkpoint_load(ckpt):
    """A clean interpreter loads the checkpoint onto the device without importing torch."""
    code = textwrap.dedent(
        f"""
        import os, sys
        os.environ["JAX_PLATFORMS"] = "cpu"
        import jax
        from g4bench.engine.loading import load_model
        cfg, params, _ = load_model({str(ckpt)!r})
        jax.block_until_ready(params)
        bad = sorted(m for m in ("torch", "transformers", "compressed_tensors") if m in sys.modules)
        assert not bad, bad
        """
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
