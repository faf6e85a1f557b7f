"""Parity with transformers' Gemma4ForCausalLM (eager) on tiny-a and tiny-b, every E-series feature on.

The reference runs in float64 (`hf_logits(dtype="float64")`): its own rounding is negligible, so the
measured difference is ours alone (f32 compute, f32 KV). Prompts are 40 tokens, five times tiny-a's
window (8) and 2.5× tiny-b's (16); decode runs 24 greedy steps, so the decode positions reach 63.

Data flow per model: transformers writes the checkpoint (save_pretrained) → our loader (no torch)
→ (a) `forward(all_logits=True)` over the prompt vs transformers at every prompt position;
(b) one Engine per sliding-KV mode whose slot 0 prefills one-shot and slot 1 in 5-token chunks
(padded to the 5-wide chunk bucket), then 24 greedy decode steps in the same batch; each slot's
logits vs transformers over the sequence that slot produced (one teacher-forced forward: by
causality its row t is a fresh forward over the first t+1 tokens).

int4: compressed-tensors quantizes and saves a W4A16 checkpoint; every packed tensor decodes, by
our numpy and our in-step jnp unpacking, to exactly compressed-tensors' own decompression; the
loader detects W4A16; and our logits (W4A16 packed and unpacked in the step, or dequantized to
dense f32 at load) match transformers running that checkpoint in float64, which dequantizes to the
same bf16 values (CompressedTensorsConfig(dequantize=True): bf16(q·s) widened) — so the tolerance
stays 1e-4.
"""

from __future__ import annotations

import numpy as np
import pytest

pytestmark = pytest.mark.parity
pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("compressed_tensors")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from safetensors.numpy import load_file  # noqa: E402

from g4bench.engine.engine import Engine  # noqa: E402
from g4bench.engine.engine_config import EngineConfig  # noqa: E402
from g4bench.engine.sampling import SamplingParams  # noqa: E402
from g4bench.model.checkpoint import detect_format, load_checkpoint, to_device  # noqa: E402
from g4bench.model.config import CONFIG_DIR  # noqa: E402
from g4bench.model.forward import forward  # noqa: E402
from g4bench.model.kv_cache import CacheLayout, init_cache  # noqa: E402
from g4bench.model.params import WeightFormat  # noqa: E402
from g4bench.model.quant import dequantize_w4a16_np, unpack_w4a16  # noqa: E402
from harness.checks import parity  # noqa: E402

TOL = 1e-4
PROMPT, STEPS, CHUNK = 40, 24, 5
MAX_LEN = 72
F32 = WeightFormat(layers="f32", ple="f32", embed="f32")
SEED = 1


def make_prompt(vocab: int, n: int = PROMPT, seed: int = 0) -> list[int]:
    return [2, *np.random.default_rng(seed).integers(3, vocab, n - 1).tolist()]


_forward = jax.jit(forward, static_argnames=("cfg", "layout", "all_logits", "compute_dtype"))


def prefill_logits(cfg, params, prompt) -> np.ndarray:
    """forward(all_logits=True) over the prompt from an empty full-length f32 cache: [T, V]."""
    layout = CacheLayout(max_len=len(prompt), kv_dtype="f32")
    logits, _ = _forward(
        params, jnp.asarray([prompt], jnp.int32), jnp.zeros(1, jnp.int32), jnp.full(1, len(prompt), jnp.int32),
        init_cache(cfg, 1, layout), cfg=cfg, layout=layout, all_logits=True, compute_dtype=jnp.float32,
    )  # fmt: skip
    return np.asarray(logits[0])


def make_engine(cfg, params, sliding) -> Engine:
    """Two slots; chunk buckets include 5 and 40 so slot 1 can prefill in padded 5-token chunks; one KV bucket."""
    ecfg = EngineConfig(
        max_slots=2,
        max_len=MAX_LEN,
        kv_dtype="f32",
        sliding_kv=sliding,
        chunk_size=PROMPT,
        min_kv_bucket=MAX_LEN,
        keep_logits=True,
    )
    assert CHUNK in ecfg.chunk_buckets and PROMPT in ecfg.chunk_buckets
    return Engine(cfg, params, ecfg, compute_dtype=jnp.float32)


def engine_runs(engine, prompt, steps=STEPS):
    """Slot 0: one-shot prefill; slot 1: 5-token chunks. Then `steps` greedy decode steps of both
    slots together. Returns {slot: (tokens g0..g_steps, logits [steps + 1, V])}."""
    runs = {}
    for slot, chunk in ((0, PROMPT), (1, CHUNK)):
        for s in range(0, PROMPT, chunk):
            nxt = engine.prefill(
                slot, prompt[s : s + chunk], s, SamplingParams() if s + chunk >= PROMPT else None
            )
        runs[slot] = ([nxt], [np.asarray(engine.last_logits)])
    for k in range(steps):
        tokens = np.array([runs[s][0][-1] for s in (0, 1)], np.int32)
        out = engine.decode(tokens, np.full(2, PROMPT + k, np.int32), np.ones(2, bool))
        for s in (0, 1):
            runs[s][0].append(int(out[s]))
            runs[s][1].append(np.asarray(engine.last_logits)[s])
    return {s: (toks, np.stack(lg)) for s, (toks, lg) in runs.items()}


@pytest.fixture(scope="module", params=["tiny-a", "tiny-b"])
def model(request, tmp_path_factory):
    name = request.param
    ckpt = parity.write_hf_checkpoint(
        CONFIG_DIR / f"{name}.json", tmp_path_factory.mktemp(name) / "hf", seed=SEED
    )
    cfg, host = load_checkpoint(ckpt, F32)
    params = to_device(host)
    engines = {sliding: make_engine(cfg, params, sliding) for sliding in ("full", "ring")}  # compiled lazily
    return {"name": name, "ckpt": ckpt, "cfg": cfg, "params": params, "engines": engines}


def test_prefill_all_positions_match_transformers(model):
    cfg = model["cfg"]
    assert 2 * cfg.sliding_window < PROMPT
    prompt = make_prompt(cfg.vocab_size)
    ours = prefill_logits(cfg, model["params"], prompt)
    ref = parity.hf_logits(model["ckpt"], [prompt], dtype="float64")[0]
    err = np.abs(ours - ref).max(axis=-1)
    assert err.max() < TOL, f"{model['name']}: worst position {int(err.argmax())}: {err.max():.2e}"
    assert np.abs(ref).max() > 3  # logits with real spread, not a flat distribution


@pytest.mark.parametrize("sliding", ["full", "ring"])
def test_decode_steps_match_transformers(model, sliding):
    """Every decode step (and the prefill's last position), one-shot and chunked prefill."""
    cfg = model["cfg"]
    prompt = make_prompt(cfg.vocab_size)
    runs = engine_runs(model["engines"][sliding], prompt)
    refs: dict[tuple[int, ...], np.ndarray] = {}
    for slot, (tokens, logits) in runs.items():
        seq = tuple(prompt + tokens[:-1])
        if seq not in refs:
            refs[seq] = parity.hf_logits(model["ckpt"], [list(seq)], dtype="float64")[0][PROMPT - 1 :]
        ref = refs[seq]
        err = np.abs(logits - ref).max(axis=-1)
        assert err.max() < TOL, (
            f"{model['name']} {sliding} slot {slot}: step {int(err.argmax())}: {err.max():.2e}"
        )
        top2 = np.sort(ref, axis=-1)[:, -2:]
        ok = (np.asarray(tokens) == ref.argmax(-1)) | (top2[:, 1] - top2[:, 0] < TOL)
        assert ok.all(), f"greedy disagreement at steps {np.flatnonzero(~ok)}"


def test_transformers_own_greedy_agrees(model):
    """transformers' cached generate() picks the tokens our engine picks (a second, independent
    decode path on the reference side; its f32 cache is compared with our f32 engine)."""
    cfg = model["cfg"]
    prompt = make_prompt(cfg.vocab_size, seed=3)
    tokens, logits = engine_runs(model["engines"]["ring"], prompt, steps=8)[0]
    ref_tokens, ref_logits = parity.hf_greedy(model["ckpt"], prompt, 9, dtype="float64")
    assert np.abs(logits - ref_logits).max() < TOL
    assert tokens == ref_tokens


# ---------------------------------------------------------------------------- int4 (compressed-tensors)
@pytest.fixture(scope="module")
def ct_model(tmp_path_factory):
    ckpt = parity.write_ct_w4a16_checkpoint(
        CONFIG_DIR / "tiny-a.json", tmp_path_factory.mktemp("ct") / "ct", seed=SEED
    )
    return {"ckpt": ckpt, "decompressed": parity.ct_decompressed_weights(ckpt)}


def test_w4a16_dequantization_is_bit_exact(ct_model):
    """Every packed tensor: our numpy dequantization and the in-step jnp unpacking equal
    compressed-tensors' decompression bit for bit."""
    tensors = {}
    for f in sorted(ct_model["ckpt"].glob("*.safetensors")):
        tensors.update(load_file(f))
    packed_names = sorted(k.removesuffix(".weight_packed") for k in tensors if k.endswith(".weight_packed"))
    expected = ct_model["decompressed"]
    assert len(packed_names) == len(expected) > 8 * 7  # q k v o gate up down ple_gate ple_up (+ owners' k, v)
    unpack = jax.jit(unpack_w4a16, static_argnums=(2,))
    for name in packed_names:
        packed, scale = tensors[f"{name}.weight_packed"], tensors[f"{name}.weight_scale"]
        want = expected[f"{name}.weight"]
        ours_np = dequantize_w4a16_np(packed, scale)
        ours_jnp = np.asarray(unpack(jnp.asarray(packed), jnp.asarray(scale), jnp.float32))
        assert ours_np.view(np.uint32).tolist() == want.view(np.uint32).tolist(), name
        assert ours_jnp.view(np.uint32).tolist() == want.view(np.uint32).tolist(), name
        ours_bf16 = np.asarray(unpack(jnp.asarray(packed), jnp.asarray(scale), jnp.bfloat16))  # accelerators
        assert ours_bf16.astype(np.float32).view(np.uint32).tolist() == want.view(np.uint32).tolist(), name


def test_w4a16_checkpoint_loads_packed(ct_model):
    """The loader detects W4A16 and keeps the packed words and bf16 scales as stored."""
    ckpt = ct_model["ckpt"]
    assert detect_format(ckpt).layers == "w4a16"
    cfg, params = load_checkpoint(ckpt)
    tensors = load_file(next(ckpt.glob("*.safetensors")))
    q = params["layers"][0]["q"]
    np.testing.assert_array_equal(q["packed"], tensors["model.layers.0.self_attn.q_proj.weight_packed"])
    assert q["packed"].dtype == np.int32 and q["scale"].dtype.name == "bfloat16"
    assert "packed" in params["ple_proj"] and "packed" in params["layers"][-1]["ple_up"]
    # dense f32 at load: exactly the decompressed weights, transposed to [in, out]
    _, dense = load_checkpoint(ckpt, F32)
    want = ct_model["decompressed"]["model.layers.0.mlp.down_proj.weight"]
    assert dense["layers"][0]["down"]["w"].view(np.uint32).tolist() == want.T.view(np.uint32).tolist()


def test_w4a16_logits_match_transformers(ct_model):
    """Our side on the compressed-tensors checkpoint vs transformers running the same checkpoint in
    float64: the engine with W4A16 linears unpacked in the step (the last prompt position after a
    chunked prefill, and 8 decode steps), and dense f32 weights dequantized at load (every prompt
    position)."""
    ckpt = ct_model["ckpt"]
    cfg, host = load_checkpoint(ckpt, WeightFormat(layers="w4a16", ple="f32", embed="f32"))
    packed = to_device(host)
    prompt = make_prompt(cfg.vocab_size)
    tokens, logits = engine_runs(make_engine(cfg, packed, "ring"), prompt, steps=8)[1]
    ref = parity.hf_logits(ckpt, [prompt + tokens[:-1]], dtype="float64")[0]
    assert np.abs(logits - ref[PROMPT - 1 :]).max() < TOL
    _, dense = load_checkpoint(ckpt, F32)
    assert np.abs(prefill_logits(cfg, to_device(dense), prompt) - ref[:PROMPT]).max() < TOL
