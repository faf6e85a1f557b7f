"""Speculative decoding in the scheduler (serve --draft-model --spec-k): the served form of spec_decode.

Greedy identity is checked against the same scheduler without speculation, for several requests
decoding at once (so rows of one verify call differ in length, k and acceptance), on the paged
layout with ring sliding KV (the rejected drafts' K/V must never be read through a window) and with
a sliding window shorter than the outputs. The host sampler mirror (`target_probs`) is checked
against the device sampler's draws.
"""

from __future__ import annotations

import threading

import jax.numpy as jnp
import numpy as np
import pytest
from scipy.stats import chisquare

from g4bench.engine.engine import Engine
from g4bench.engine.engine_config import EngineConfig
from g4bench.engine.sampling import SamplingParams, SamplingState, sample
from g4bench.engine.scheduler import GenerationParams, Scheduler
from g4bench.engine.spec_batch import SpecDecoder, check_layout, target_probs
from g4bench.model.config import load_config
from tests.engine.test_engine import random_params

DEADLINE_S = 120.0


class Sink:
    def __init__(self) -> None:
        self.tokens: list[int] = []
        self.result = None
        self.done = threading.Event()

    def on_token(self, token: int) -> bool:
        self.tokens.append(token)
        return False

    def on_finish(self, result) -> None:
        self.result = result
        self.done.set()


class SpecCounts:
    def __init__(self) -> None:
        self.drafted = self.accepted = self.rows = 0

    def on_spec(self, drafted: int, accepted: int, rows: int) -> None:
        self.drafted, self.accepted, self.rows = (
            self.drafted + drafted,
            self.accepted + accepted,
            self.rows + rows,
        )


def _engine(cfg, seed: int, **kw) -> Engine:
    ecfg = EngineConfig(max_slots=3, max_len=128, chunk_size=32, min_kv_bucket=64, kv_dtype="f32",
                        prefill_policy="chunk", **kw)  # fmt: skip
    return Engine(cfg, random_params(cfg, seed), ecfg, compute_dtype=jnp.float32)


def _draft(cfg, seed: int) -> Engine:
    ecfg = EngineConfig(max_slots=3, max_len=128, chunk_size=32, min_kv_bucket=64, kv_dtype="f32",
                        kv_layout="contiguous", sliding_kv="full")  # fmt: skip
    return Engine(cfg, random_params(cfg, seed), ecfg, compute_dtype=jnp.float32)


def _run(sched: Scheduler, prompts, max_tokens, sampling=SamplingParams()) -> list[list[int]]:
    sched.start()
    try:
        assert sched.wait_ready(DEADLINE_S)
        sinks = []
        for p, n in zip(prompts, max_tokens, strict=True):
            sinks.append(Sink())
            sched.submit(p, GenerationParams(max_tokens=n, ignore_eos=True, sampling=sampling), sinks[-1])
        for s in sinks:
            assert s.done.wait(DEADLINE_S), "request did not finish"
            assert s.result.finish_reason == "length", s.result
        return [s.tokens for s in sinks]
    finally:
        sched.stop()


@pytest.fixture(scope="module")
def tiny_a():
    cfg = load_config("tiny-a")
    return cfg, [
        [2, *np.random.default_rng(s).integers(3, cfg.vocab_size, n).tolist()]
        for s, n in ((1, 19), (2, 40), (3, 7))
    ]


@pytest.mark.parametrize("draft_seed", [0, 1], ids=["self-draft", "other-draft"])
def test_greedy_outputs_identical_with_and_without_speculation(tiny_a, draft_seed):
    """Three requests at once, outputs past the sliding window: speculative greedy = plain greedy.
    A drafter with the target's weights keeps every draft; one with other weights keeps few."""
    cfg, prompts = tiny_a
    lengths = [40, 25, 50]
    plain = _run(Scheduler(_engine(cfg, 0), warmup=False), prompts, lengths)
    target = _engine(cfg, 0)
    counts = SpecCounts()
    sched = Scheduler(target, spec=SpecDecoder(target, _draft(cfg, draft_seed), k=3), warmup=False)
    sched.observers.append(counts)
    assert _run(sched, prompts, lengths) == plain
    assert counts.rows > 0 and counts.drafted > 0
    rate = counts.accepted / counts.drafted
    assert rate == 1.0 if draft_seed == 0 else rate < 0.5, rate
    # every verify row emits its kept drafts + 1 token; the first tokens come from prefill
    assert counts.rows + counts.accepted == sum(lengths) - len(lengths)


def test_check_layout_refuses_a_contiguous_ring_and_a_k_past_the_chunk():
    cfg = load_config("tiny-a")
    ring = Engine(cfg, random_params(cfg, 0), EngineConfig(max_slots=1, max_len=64, chunk_size=16,
                                                            kv_layout="contiguous", sliding_kv="ring"))  # fmt: skip
    with pytest.raises(ValueError, match="paged KV layout or --sliding-kv full"):
        check_layout(ring, 3)
    paged = Engine(cfg, random_params(cfg, 0), EngineConfig(max_slots=1, max_len=64, chunk_size=16))
    with pytest.raises(ValueError, match="spec k must be 1..15"):
        check_layout(paged, 16)


def test_a_mixed_policy_scheduler_refuses_speculation():
    cfg = load_config("tiny-a")
    target = Engine(cfg, random_params(cfg, 0), EngineConfig(max_slots=3, max_len=128, chunk_size=32))
    with pytest.raises(ValueError, match="chunk prefill policy"):
        Scheduler(target, spec=SpecDecoder(target, _draft(cfg, 0), k=2))


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=0.8),
        SamplingParams(temperature=1.0, top_k=5),
        SamplingParams(temperature=0.7, top_p=0.6),
    ],
    ids=["temperature", "top-k", "top-p"],
)
def test_target_probs_is_the_distribution_the_device_sampler_draws(params):
    """8,000 device draws (one per position key) against target_probs: chi-square p > 0.001 over the
    tokens with mass, and no draw outside its support."""
    rng = np.random.default_rng(0)
    V, n = 300, 8000
    logits = rng.normal(0, 2, V).astype(np.float32)
    p = target_probs(logits[None], params)[0]
    state = SamplingState.greedy(n)
    for f in ("temperature", "top_k", "top_p"):
        setattr(state, f, jnp.full((n,), getattr(params, f), getattr(state, f).dtype))
    draws = np.asarray(
        sample(jnp.broadcast_to(jnp.asarray(logits), (n, V)), jnp.arange(n, dtype=jnp.int32), state)
    )
    counts = np.bincount(draws, minlength=V)
    assert counts[p == 0].sum() == 0
    support = p > 0
    expected = p[support] * n
    assert chisquare(counts[support], expected).pvalue > 1e-3


def test_target_probs_bans_eos_on_the_first_rows_only():
    logits = np.zeros((3, 10), np.float32)
    logits[:, 1] = 5.0  # EOS id 1 is the argmax
    p = target_probs(logits, SamplingParams(), eos_banned_rows=2, eos_ids=(1,))
    assert p[0, 1] == 0 and p[1, 1] == 0 and p[2, 1] == 1.0
