"""Exactness of block sharing on the real engine (tiny-a, random weights of test_engine.py).

A request served from shared blocks — a system prompt another request computed, in another slot —
gives the same logits and greedy tokens as the same request prefilled cold on a fresh engine: for
full-length and window (sliding) groups, f32 / bf16 / int8 KV, prompts that end inside a block, and
under concurrent admission through the Scheduler. tiny-a's window is 8; blocks are 4 tokens, chunks
16, so prefill chunks use the window read (7 blocks < the 32-token KV bucket) and decode steps pass
several windows past the shared prefix.

Tolerances: f32 KV: TOL (the same arithmetic up to summation order), greedy tokens identical.
bf16 / int8 KV: the shared blocks were written by another prefill whose chunks had other shapes, and
f32 noise that small flips a stored bf16 ulp or int8 step: measured warm vs cold, teacher-forced,
max |Δlogit| 0.003 (bf16) and up to ~0.1 (int8), the same size as between two cold runs chunked
differently (a free-running int8 run then flips a near-tie and diverges, with or without sharing).
So quantized runs are teacher-forced with the cold run's tokens and held to test_engine.py's
storage-rounding bounds (BF16_KV_TOL, INT8_TOL), greedy picks equal except at near-ties.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from g4bench.engine.block_cache import BlockCache
from g4bench.engine.engine import Engine
from g4bench.engine.engine_config import EngineConfig
from g4bench.engine.sampling import SamplingParams
from g4bench.engine.scheduler import GenerationParams, Scheduler
from g4bench.model.config import load_config
from tests.engine.test_engine import BF16_KV_TOL, INT8_TOL, TOL, assert_greedy_matches, random_params
from tests.engine.test_scheduler import Collect

QUANT_TOL = {"f32": TOL, "bf16": BF16_KV_TOL, "int8": INT8_TOL}
MAX_LEN = 64
STEPS = 10


@pytest.fixture(scope="module")
def cfg():
    return load_config("tiny-a")


@pytest.fixture(scope="module")
def params(cfg):
    return random_params(cfg)


def make_engine(cfg, params, **kw):
    base = dict(
        max_slots=3, max_len=MAX_LEN, kv_dtype="f32", sliding_kv="ring", chunk_size=16, min_kv_bucket=32,
        kv_layout="paged", block_size=4, keep_logits=True,  # tests read Engine.last_logits after decode
    )  # fmt: skip
    return Engine(cfg, params, EngineConfig(**{**base, **kw}), compute_dtype=jnp.float32)


def cache_for(engine) -> BlockCache:
    lay = engine.layout
    return BlockCache(
        engine.ecfg.max_slots,
        block_size=lay.block_size,
        table_len=lay.table_len,
        full_blocks=lay.blocks,
        window_blocks=lay.window_blocks,
        window=engine.cfg.sliding_window,
        set_table=engine.set_block_table,
    )


def serve(engine, cache, prompt, steps=STEPS, feed=None):
    """One request through the BlockCache protocol the scheduler follows: match, prefill the rest in
    chunks, decode greedily (or feed `feed`, teacher forcing). Returns (reused tokens, greedy
    tokens, logits [steps + 1, V])."""
    slot = cache.claim(0)
    reuse = cache.begin(slot, prompt, steps + 1)
    chunk = engine.ecfg.chunk_size
    for s in range(reuse, len(prompt), chunk):
        piece = prompt[s : s + chunk]
        cache.prepare(slot, s, len(piece))
        tok = engine.prefill(slot, piece, s, SamplingParams() if s + chunk >= len(prompt) else None)
        cache.extend(slot, piece)
    tokens, logits = [tok], [np.asarray(engine.last_logits)]
    S = engine.ecfg.max_slots
    for k in range(steps):
        pos = len(prompt) + k
        t, p, a = np.zeros(S, np.int32), np.zeros(S, np.int32), np.zeros(S, bool)
        t[slot], p[slot], a[slot] = tokens[-1] if feed is None else feed[k], pos, True
        cache.prepare(slot, pos, 1)
        tokens.append(int(engine.decode(t, p, a)[slot]))
        logits.append(np.asarray(engine.last_logits)[slot])
        cache.extend(slot, [t[slot]])
    cache.release(slot)
    return reuse, tokens, np.stack(logits)


def prompts_of(cfg, system_len, suffixes):
    rng = np.random.default_rng(11)
    system = [cfg.bos_token_id, *rng.integers(3, cfg.vocab_size, system_len - 1).tolist()]
    return system, [system + rng.integers(3, cfg.vocab_size, n).tolist() for n in suffixes]


@pytest.mark.parametrize(
    ("kv_dtype", "sliding_kv"), [("f32", "ring"), ("f32", "full"), ("bf16", "ring"), ("int8", "ring")]
)
def test_shared_blocks_equal_cold_prefill(cfg, params, kv_dtype, sliding_kv):
    """Request A computes a 21-token system prompt (5 blocks and one token); B and C reuse its 5
    blocks from other slots (C after the LRU had to evict nothing); each equals a cold run."""
    system, (a, b, c) = prompts_of(cfg, 21, [6, 3, 13])
    warm_engine = make_engine(cfg, params, kv_dtype=kv_dtype, sliding_kv=sliding_kv)
    cache = cache_for(warm_engine)
    assert serve(warm_engine, cache, a)[0] == 0
    warm = {name: serve(warm_engine, cache, p) for name, p in (("b", b), ("c", c))}
    for name, p in (("b", b), ("c", c)):
        reuse, tokens, logits = warm[name]
        assert reuse == 20, name
        cold_engine = make_engine(cfg, params, kv_dtype=kv_dtype, sliding_kv=sliding_kv)
        cold_reuse, cold_tokens, cold_logits = serve(cold_engine, cache_for(cold_engine), p)
        assert cold_reuse == 0
        if kv_dtype == "f32":
            assert np.abs(logits - cold_logits).max() < TOL and tokens == cold_tokens, name
            continue
        # teacher-forced with the cold run's tokens (see the module docstring)
        _, tokens, logits = serve(warm_engine, cache, p, feed=cold_tokens)
        assert np.abs(logits - cold_logits).max() < QUANT_TOL[kv_dtype], name
        assert_greedy_matches(tokens, cold_logits)


def test_next_turn_reuses_history_and_equals_cold(cfg, params):
    """An agent's next turn (its prompt + reply + a tool result) reuses the previous turn's whole
    blocks, including blocks written by decode steps, and matches a cold prefill."""
    _, (turn1,) = prompts_of(cfg, 9, [4])
    engine = make_engine(cfg, params)
    cache = cache_for(engine)
    _, out1, _ = serve(engine, cache, turn1)
    turn2 = turn1 + out1 + [17, 18, 19]
    reuse, tokens, logits = serve(engine, cache, turn2, steps=4)
    assert reuse == (len(turn1) + len(out1) - 1) // 4 * 4
    cold = make_engine(cfg, params)
    _, cold_tokens, cold_logits = serve(cold, cache_for(cold), turn2, steps=4)
    assert np.abs(logits - cold_logits).max() < TOL and tokens == cold_tokens


@pytest.mark.parametrize("kv_dtype", ["f32", "int8"])
def test_concurrent_admission_through_the_scheduler(cfg, params, kv_dtype):
    """Three agents with a common system prompt submitted at once to a paged scheduler: the first
    computes it, the others reuse it, and every greedy output equals the contiguous engine's."""
    system, prompts = prompts_of(cfg, 25, [5, 2, 9])
    engine = make_engine(cfg, params, kv_dtype=kv_dtype)
    sched = Scheduler(engine, warmup=False).start()
    try:
        sinks = [Collect() for _ in prompts]
        for p, s in zip(prompts, sinks, strict=True):
            sched.submit(p, GenerationParams(max_tokens=8), s)
        results = [s.wait() for s in sinks]
    finally:
        sched.stop()
    contiguous = make_engine(cfg, params, kv_dtype=kv_dtype, kv_layout="contiguous")
    want = contiguous.generate(prompts, max_tokens=8).outputs
    assert [r.output_ids for r in results] == want
    assert sorted(r.cached_tokens for r in results) == [0, 24, 24]
