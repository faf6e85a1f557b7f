"""Engine self-consistency on tiny-a (no torch): every path the engine can take to a logit agrees with
one unpadded full forward over the same tokens.

Weights: random f32 with the reference's scales (harness/checks/parity.py: linears 0.08·N, embeddings
0.3·N, norms 1 + 0.1·N, q/k norms 0.3 + 0.05·N, layer scalars U[0.3, 1]) so attention is far from
uniform and logits spread over ±10: a wrong mask or position moves them visibly.

The reference `REF` is `forward(all_logits=True)` over `SEQ` (44 tokens, one compile): by causality,
row t equals a fresh forward over SEQ[:t+1], so prefixes of every length are checked against it.
tiny-a's sliding window is 8; the engines use chunk size 32 (buckets 4, 16, 32) and KV buckets
(32, 64), so prompts of 3..33 tokens sit on both sides of the window and of the bucket boundaries,
and a 5-token chunk padded to 16 is padding larger than the window.

Tolerances (f32 compute, f32 KV unless stated): paths that should be the same arithmetic up to
summation order agree within 1e-4 (measured ≤ ~1e-5); greedy tokens must be equal except where the
reference's top-2 gap is below 1e-4 (a near-tie).
"""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from g4bench.engine.engine import Engine
from g4bench.engine.engine_config import EngineConfig
from g4bench.engine.sampling import SamplingParams
from g4bench.model.config import load_config
from g4bench.model.forward import forward
from g4bench.model.kv_cache import CacheLayout, init_cache
from g4bench.model.params import WeightFormat, param_specs

TOL = 1e-4
NEAR_TIE = 1e-4
PROMPT, STEPS = 20, 24
MAX_LEN = 64
# Storage rounding of K and V, measured on these weights (logits within ±9.8, std 2.4) over the
# prompt's last position and 24 teacher-forced decode steps, max |Δlogit| vs the f32-KV reference:
# bf16 KV 0.037 (25/25 greedy tokens), int8 KV 0.24 (22/25), int8 vs bf16 0.26. int8's error is
# ~6× bf16's as expected: an absmax/127 step per (token, head) is ~2.5σ/127 of a 32-wide head vs
# bf16's 2^-9 relative. Tolerances: 2× those, and at least 20 of 25 greedy tokens in common.
BF16_KV_TOL = 0.1
INT8_TOL = 0.5
INT8_MIN_AGREE = 20


def random_params(cfg, seed: int = 0):
    """f32 params with the reference's random scales (see the module docstring)."""
    rng = np.random.default_rng(seed)

    def leaf(path, spec):
        name = str(getattr(path[-1], "key", path[-1]))
        parent = str(getattr(path[-2], "key", "")) if len(path) > 1 else ""
        shape = spec.shape
        if name == "layer_scalar":
            x = rng.uniform(0.3, 1.0, shape)
        elif name in ("q_norm", "k_norm"):
            x = 0.3 + 0.05 * rng.standard_normal(shape)
        elif len(shape) == 1:
            x = 1.0 + 0.1 * rng.standard_normal(shape)
        elif name == "embed" or parent == "ple_table":
            x = 0.3 * rng.standard_normal(shape)
        else:
            x = 0.08 * rng.standard_normal(shape)
        return jnp.asarray(x, jnp.float32)

    return jax.tree_util.tree_map_with_path(
        leaf, param_specs(cfg, WeightFormat(layers="f32", ple="f32", embed="f32"))
    )


@pytest.fixture(scope="module")
def cfg():
    return load_config("tiny-a")


@pytest.fixture(scope="module")
def params(cfg):
    return random_params(cfg)


@pytest.fixture(scope="module")
def seq(cfg):
    rng = np.random.default_rng(7)
    return [cfg.bos_token_id, *rng.integers(3, cfg.vocab_size, PROMPT + STEPS - 1).tolist()]


@pytest.fixture(scope="module")
def full_forward(cfg, params):
    """tokens list → logits [T, V] of one unpadded forward over a fresh full-length cache."""
    layout = CacheLayout(max_len=MAX_LEN, kv_dtype="f32")
    run = jax.jit(partial(forward, cfg=cfg, layout=layout, all_logits=True, compute_dtype=jnp.float32))

    def call(tokens, pad_to=None, pad_id=0):
        n = len(tokens)
        padded = list(tokens) + [pad_id] * ((pad_to or n) - n)
        logits, _ = run(
            params, jnp.asarray([padded], jnp.int32), jnp.zeros(1, jnp.int32), jnp.full(1, n, jnp.int32),
            init_cache(cfg, 1, layout),
        )  # fmt: skip
        return np.asarray(logits[0])

    return call


@pytest.fixture(scope="module")
def ref(seq, full_forward):
    return full_forward(seq)


def make_engine(cfg, params, **kw):
    base = dict(
        max_slots=3, max_len=MAX_LEN, kv_dtype="f32", sliding_kv="full", chunk_size=32, min_kv_bucket=32,
        kv_layout="contiguous", block_size=4,
    )  # fmt: skip
    base["keep_logits"] = True  # tests read Engine.last_logits after decode
    return Engine(cfg, params, EngineConfig(**{**base, **kw}), compute_dtype=jnp.float32)


@pytest.fixture(scope="module", params=["contiguous", "paged"])
def kv_layout(request):
    """Every engine-path test runs on both layouts. Paged uses 4-token blocks: a decode step's window
    read (3 blocks) is narrower than the KV bucket and chunks cross block boundaries."""
    return request.param


@pytest.fixture(scope="module")
def engine_full(cfg, params, kv_layout):
    return make_engine(cfg, params, kv_layout=kv_layout)


@pytest.fixture(scope="module")
def engine_ring(cfg, params, kv_layout):
    return make_engine(cfg, params, sliding_kv="ring", kv_layout=kv_layout)


def prefill(engine, slot, tokens, start=0, chunk=None, sampling=None):
    """Prefill `tokens` at start.. in chunks of `chunk` (default the engine's chunk size)."""
    chunk = chunk or engine.ecfg.chunk_size
    nxt = None
    for s in range(0, len(tokens), chunk):
        last = s + chunk >= len(tokens)
        nxt = engine.prefill(
            slot, tokens[s : s + chunk], start + s, (sampling or SamplingParams()) if last else None
        )
    return nxt


def greedy_run(engine, slot, prompt, steps, chunk=None, feed=None):
    """Prefill then `steps` decode steps on `slot` alone. Feeds the engine's own greedy tokens, or
    `feed` (teacher forcing). Returns (tokens g0..g_steps, logits [steps + 1, V])."""
    tokens = [prefill(engine, slot, prompt, chunk=chunk)]
    logits = [np.asarray(engine.last_logits)]
    S = engine.ecfg.max_slots
    for k in range(steps):
        fed = tokens[-1] if feed is None else feed[k]
        tok, pos, act = np.zeros(S, np.int32), np.zeros(S, np.int32), np.zeros(S, bool)
        tok[slot], pos[slot], act[slot] = fed, len(prompt) + k, True
        out = engine.decode(tok, pos, act)
        logits.append(np.asarray(engine.last_logits)[slot])
        tokens.append(int(out[slot]))
    return tokens, np.stack(logits)


def assert_greedy_matches(tokens, ref_rows):
    """tokens[k] == argmax(ref_rows[k]) except where the reference's top-2 gap is below NEAR_TIE."""
    top2 = np.sort(ref_rows, axis=-1)[:, -2:]
    for k, (tok, row, gap) in enumerate(zip(tokens, ref_rows, top2[:, 1] - top2[:, 0], strict=True)):
        assert tok == int(np.argmax(row)) or gap < NEAR_TIE, f"step {k}: token {tok} vs {int(np.argmax(row))}"


# ---------------------------------------------------------------------------- cached vs re-forward
@pytest.mark.parametrize("sliding", ["full", "ring"])
def test_cached_decode_equals_full_reforward(sliding, seq, full_forward, engine_full, engine_ring):
    """24 greedy steps from the KV cache (ring: past five wraps of the 8-entry window) equal one
    full re-forward over the generated sequence, logits and tokens."""
    engine = engine_full if sliding == "full" else engine_ring
    tokens, logits = greedy_run(engine, 0, seq[:PROMPT], STEPS)
    ref = full_forward(seq[:PROMPT] + tokens[:-1])[PROMPT - 1 :]
    assert np.abs(logits - ref).max() < TOL
    assert_greedy_matches(tokens, ref)
    assert len(set(tokens)) > 3  # a real continuation, not one repeated token


def test_ring_equals_full_length_sliding_kv(seq, ref, engine_full, engine_ring):
    """Teacher-forced through SEQ: the ring (window 8) and full-length sliding KV agree at every step,
    and both agree with the reference, also when the ring prefill is chunked with padding (5-token
    chunks padded to a bucket > window)."""
    feed = seq[PROMPT:]
    _, full = greedy_run(engine_full, 1, seq[:PROMPT], STEPS, feed=feed)
    _, ring = greedy_run(engine_ring, 1, seq[:PROMPT], STEPS, feed=feed)
    _, ring_chunked = greedy_run(engine_ring, 2, seq[:PROMPT], STEPS, chunk=5, feed=feed)
    expected = ref[PROMPT - 1 :]
    for got in (full, ring, ring_chunked):
        assert np.abs(got - expected).max() < TOL
    assert np.abs(ring - full).max() < TOL


# ---------------------------------------------------------------------------- padding, chunking
@pytest.mark.parametrize("n", [3, 4, 5, 7, 8, 9, 31, 32, 33])
def test_padded_prefill_equals_unpadded(n, seq, ref, engine_full, engine_ring):
    """The engine pads each chunk to a bucket (4, 16, 32) and reads a bucketed KV length (32 or 64):
    the last-position logits equal the unpadded reference, on both sides of the window (8) and of
    both bucket boundaries, full and ring."""
    for engine in (engine_full, engine_ring):
        prefill(engine, 0, seq[:n])
        np.testing.assert_allclose(np.asarray(engine.last_logits), ref[n - 1], atol=TOL, rtol=0)


def test_forward_right_padding_is_invisible(seq, ref, full_forward):
    """forward itself with right-padding (junk ids, not just pad) and n_valid: real rows unchanged."""
    for n in (5, 9, 20):
        padded = full_forward(seq[:n], pad_to=44, pad_id=77)
        np.testing.assert_allclose(padded[:n], ref[:n], atol=TOL, rtol=0)


@pytest.mark.parametrize("chunk", [1, 3, 8, 13])
def test_chunked_prefill_equals_one_shot(chunk, seq, ref, engine_full, engine_ring):
    """Prefill of 30 tokens in chunks of 1, 3, 8, 13 gives the one-shot logits (full and ring)."""
    for engine in (engine_full, engine_ring):
        prefill(engine, 1, seq[:30], chunk=chunk)
        np.testing.assert_allclose(np.asarray(engine.last_logits), ref[29], atol=TOL, rtol=0)


@pytest.mark.parametrize("block", [None, 5, 8])
@pytest.mark.parametrize("sliding", ["full", "ring"])
def test_attention_blocks_equal_one_pass(block, sliding, cfg, params, seq, ref, kv_layout):
    """Attention over 5- and 8-key blocks (many blocks, trip counts that skip what no query sees;
    ragged edges: tests/model/test_attention.py; paged with 8: pool blocks gathered block by block,
    with 5: the read gathered whole) and in one pass (the accelerator path) both give the
    reference logits: prefill chunked and one-shot, then decode steps with two slots at different
    positions; the CPU engine picks blocks by default."""
    engine = make_engine(cfg, params, sliding_kv=sliding, kv_layout=kv_layout)
    assert engine.attention_block == (256 if jax.default_backend() == "cpu" else None)
    engine = Engine(cfg, params, engine.ecfg, compute_dtype=jnp.float32, attention_block=block)
    for chunk in (7, 32):
        prefill(engine, 1, seq[:30], chunk=chunk)
        np.testing.assert_allclose(np.asarray(engine.last_logits), ref[29], atol=TOL, rtol=0)
    prefill(engine, 0, seq[:10])
    S = engine.ecfg.max_slots
    active = np.arange(S) < 2
    for step in range(6):
        pos = np.zeros(S, np.int32)
        pos[0], pos[1] = 10 + step, 30 + step
        engine.decode(np.asarray(seq)[pos], pos, active)
        got = np.asarray(engine.last_logits)
        np.testing.assert_allclose(got[:2], ref[pos[:2]], atol=TOL, rtol=0)
    with pytest.raises(ValueError, match="attention_block"):
        Engine(cfg, params, engine.ecfg, attention_block=0)


def test_inactive_slots_are_untouched(seq, ref, engine_full):
    """A decode step with a slot inactive writes nothing into it: its later continuation is exact."""
    prefill(engine_full, 2, seq[:PROMPT])
    S = engine_full.ecfg.max_slots
    # Step the other slots at positions that overlap slot 2's (same cache rows for other slots only).
    engine_full.decode(np.full(S, 9), np.full(S, PROMPT), np.array([True, True, False]))
    tok, pos, act = np.zeros(S, np.int32), np.zeros(S, np.int32), np.zeros(S, bool)
    tok[2], pos[2], act[2] = seq[PROMPT], PROMPT, True
    engine_full.decode(tok, pos, act)
    np.testing.assert_allclose(np.asarray(engine_full.last_logits)[2], ref[PROMPT], atol=TOL, rtol=0)


# ---------------------------------------------------------------------------- prefix sharing
@pytest.mark.parametrize("sliding", ["full", "ring"])
def test_copy_slot_then_continue_equals_cold_prefill(sliding, seq, ref, engine_full, engine_ring, kv_layout):
    if kv_layout == "paged":
        pytest.skip("a paged cache shares blocks (test_block_cache.py), it does not copy slots")
    engine = engine_full if sliding == "full" else engine_ring
    prefill(engine, 0, seq[:PROMPT])
    engine.copy_slot(0, 1)
    prefill(engine, 1, seq[PROMPT:30], start=PROMPT)
    warm = np.asarray(engine.last_logits)
    prefill(engine, 2, seq[:30])
    np.testing.assert_allclose(warm, np.asarray(engine.last_logits), atol=TOL, rtol=0)
    np.testing.assert_allclose(warm, ref[29], atol=TOL, rtol=0)


def test_can_resume_rules(cfg, params):
    full = make_engine(cfg, params)
    ring = make_engine(cfg, params, sliding_kv="ring")
    ring_wide = make_engine(cfg, params, sliding_kv="ring", max_len=cfg.sliding_window)  # ring never wraps
    assert full.can_resume(20, 20) and full.can_resume(20, 5)
    assert ring.can_resume(20, 20) and not ring.can_resume(20, 19) and not ring.can_resume(20, 5)
    assert ring_wide.can_resume(8, 3)
    for engine in (full, ring):
        assert not engine.can_resume(20, 0) and not engine.can_resume(20, 21)


# ---------------------------------------------------------------------------- step variants
def test_donated_equals_copying(cfg, params, seq, engine_full):
    copying = make_engine(cfg, params, donate=False, max_slots=1, min_kv_bucket=64)
    a_tokens, a = greedy_run(engine_full, 0, seq[:PROMPT], 8)
    b_tokens, b = greedy_run(copying, 0, seq[:PROMPT], 8)
    assert a_tokens == b_tokens
    np.testing.assert_allclose(a, b, atol=TOL, rtol=0)


def test_int8_kv_close_to_bf16(cfg, params, seq, ref, kv_layout):
    """int8 KV (per-token, per-head scales folded into attention) stays within INT8_TOL of bf16 KV
    over the prompt and 24 teacher-forced decode steps (ring), and mostly picks the same tokens."""
    runs = {}
    for kv in ("bf16", "int8"):
        engine = make_engine(
            cfg, params, kv_dtype=kv, sliding_kv="ring", max_slots=1, min_kv_bucket=64, kv_layout=kv_layout
        )
        runs[kv] = greedy_run(engine, 0, seq[:PROMPT], STEPS, feed=seq[PROMPT:])[1]
    diff = np.abs(runs["int8"] - runs["bf16"]).max()
    assert 0 < diff < INT8_TOL, diff
    same = int((runs["int8"].argmax(-1) == runs["bf16"].argmax(-1)).sum())
    assert same >= INT8_MIN_AGREE, same
    assert np.abs(runs["bf16"] - ref[PROMPT - 1 :]).max() < BF16_KV_TOL
    assert np.abs(runs["int8"] - ref[PROMPT - 1 :]).max() < INT8_TOL


# ---------------------------------------------------------------------------- errors and helpers
def test_prefill_errors_are_clear(engine_full):
    with pytest.raises(ValueError, match=r"prefill chunk of 33 tokens; must be 1\.\.32"):
        engine_full.prefill(0, [5] * 33, 0)
    with pytest.raises(ValueError, match="prefill chunk of 0 tokens"):
        engine_full.prefill(0, [], 0)
    with pytest.raises(ValueError, match=r"slot 3 out of range 0\.\.2"):
        engine_full.prefill(3, [5], 0)
    with pytest.raises(ValueError, match="exceed max_len 64"):
        engine_full.prefill(0, [5] * 8, 60)
    with pytest.raises(ValueError, match="exceeds max_len 64"):
        engine_full.decode(np.zeros(3, np.int32), np.array([64, 0, 0]), np.array([True, False, False]))


def test_generate_helper_matches_greedy_run(seq, engine_full):
    """Engine.generate (the CLI's batch helper) gives the same greedy tokens as a manual run, for
    two prompts batched together."""
    out = engine_full.generate([seq[:PROMPT], seq[:12]], max_tokens=6).outputs
    alone = [greedy_run(engine_full, 2, p, 5)[0] for p in (seq[:PROMPT], seq[:12])]
    for got, want in zip(out, alone, strict=True):
        stop = next((i + 1 for i, t in enumerate(want) if t in engine_full.eos_token_ids), len(want))
        assert got == want[:stop]
