"""End-to-end exactness with the real engine on the tiny model (configs/models/tiny-a.json).

Synthetic weights as `init_params` makes them echo the last prompt token (the embedding dominates
the residual stream), which would hide prefix bugs; the post-norm gains and linear weights are
scaled up here so greedy continuations depend on the whole context (checked below).

"Alone" means: one request at a time through a fresh scheduler (empty slot table: no reuse) on the
same engine, so both runs use the same compiled programs; "cold" is the same for a prefix-reused
turn. Greedy tokens must match exactly (CPU f32; no near-tie has shown up with these prompts).
"""

from __future__ import annotations

import json
import threading

import numpy as np
import pytest
from fastapi.testclient import TestClient

engine_mod = pytest.importorskip("g4bench.engine.engine")

from g4bench.engine.scheduler import GenerationParams, Scheduler  # noqa: E402
from g4bench.server.app import create_app  # noqa: E402
from g4bench.server.synthetic_tokenizer import SyntheticTokenizer  # noqa: E402
from tests.server.conftest import DEADLINE_S  # noqa: E402

MAX_LEN, CHUNK = 128, 16


def context_sensitive_params(cfg):
    import jax

    from g4bench.model.params import WeightFormat, init_params

    params = init_params(cfg, WeightFormat(layers="f32"), seed=0)

    def scale(path, x):
        name = str(getattr(path[-1], "key", path[-1]))
        if name.startswith("post_"):
            return x * 8.0
        if name == "w" and x.dtype == jax.numpy.float32:
            return x * 5.0
        return x

    return jax.tree_util.tree_map_with_path(scale, params)


@pytest.fixture(scope="module")
def params_and_cfg():
    from g4bench.model.config import load_config

    cfg = load_config("tiny-a")
    return cfg, context_sensitive_params(cfg)


def make_engine(params_and_cfg, sliding_kv: str):
    cfg, params = params_and_cfg
    ecfg = engine_mod.EngineConfig(
        max_slots=4, max_len=MAX_LEN, chunk_size=CHUNK, min_kv_bucket=MAX_LEN, sliding_kv=sliding_kv,
        kv_layout="contiguous",  # slot-copy prefix reuse; the paged path: tests/engine/test_paged_sharing.py
    )  # fmt: skip
    return engine_mod.Engine(cfg, params, ecfg)


@pytest.fixture(scope="module")
def full_engine(params_and_cfg):
    return make_engine(params_and_cfg, "full")


@pytest.fixture(scope="module")
def ring_engine(params_and_cfg):
    return make_engine(params_and_cfg, "ring")


class Collect:
    def __init__(self) -> None:
        self.tokens: list[int] = []
        self.on_count: dict[int, object] = {}
        self.result = None
        self.done = threading.Event()

    def on_token(self, token: int) -> bool:
        self.tokens.append(token)
        action = self.on_count.pop(len(self.tokens), None)
        if action is not None:
            action()
        return False

    def on_finish(self, result) -> None:
        self.result = result
        self.done.set()

    def wait(self):
        assert self.done.wait(DEADLINE_S * 4), "request did not finish"
        return self.result


def run_alone(engine, prompt, max_tokens):
    """One request in a fresh scheduler: no resident prefixes, nothing else in the batch."""
    sched = Scheduler(engine, warmup=False).start()
    try:
        s = Collect()
        sched.submit(prompt, GenerationParams(max_tokens=max_tokens, ignore_eos=True), s)
        res = s.wait()
        assert res.cached_tokens == 0
        return res.output_ids
    finally:
        sched.stop()


def prompt_of(seed: int, n: int) -> list[int]:
    return [int(x) for x in np.random.default_rng(seed).integers(3, 500, n)]


def test_outputs_depend_on_context(full_engine):
    a = run_alone(full_engine, prompt_of(1, 20), 8)
    b = run_alone(full_engine, prompt_of(2, 20)[:-1] + prompt_of(1, 20)[-1:], 8)  # same last token
    assert a != b and len(set(a)) > 2


@pytest.mark.parametrize("n", [2, 4, 8])
def test_concurrent_staggered_greedy_equals_alone(full_engine, n):
    prompts = [prompt_of(10 + i, 5 + 9 * i % 60) for i in range(n)]
    lengths = [6 + 5 * i % 20 for i in range(n)]
    alone = [run_alone(full_engine, p, m) for p, m in zip(prompts, lengths, strict=True)]
    sched = Scheduler(full_engine, warmup=False)
    batch_sizes: list[int] = []
    sched.observers.append(type("Obs", (), {"on_step": lambda self, a, s: batch_sizes.append(a)})())
    sched.start()
    try:
        sinks = [Collect() for _ in range(n)]

        def submit(i):
            sched.submit(prompts[i], GenerationParams(max_tokens=lengths[i], ignore_eos=True), sinks[i])

        for i in range(n - 1):  # request i+1 arrives when request i has 2 tokens
            sinks[i].on_count[2] = lambda i=i: submit(i + 1)
        submit(0)
        got = [s.wait().output_ids for s in sinks]
    finally:
        sched.stop()
    assert got == alone
    assert max(batch_sizes) > 1  # really batched


@pytest.mark.parametrize("sliding", ["full", "ring"])
def test_prefix_reused_turn_equals_cold(full_engine, ring_engine, sliding):
    engine = full_engine if sliding == "full" else ring_engine
    turn1 = prompt_of(30, 40)
    sched = Scheduler(engine, warmup=False).start()
    try:
        s1 = Collect()
        sched.submit(turn1, GenerationParams(max_tokens=10, ignore_eos=True), s1)
        out1 = s1.wait().output_ids
        turn2 = turn1 + out1 + prompt_of(31, 20)
        s2 = Collect()
        sched.submit(turn2, GenerationParams(max_tokens=12, ignore_eos=True), s2)
        res = s2.wait()
    finally:
        sched.stop()
    assert res.cached_tokens == len(turn1) + len(out1) - 1  # only the new suffix was computed
    assert res.output_ids == run_alone(engine, turn2, 12)


def test_shared_prefix_copied_from_busy_slot_equals_cold(full_engine):
    system = prompt_of(40, 48)
    pa, pb = system + prompt_of(41, 6), system + prompt_of(42, 9)
    sched = Scheduler(full_engine, warmup=False).start()
    try:
        a, b = Collect(), Collect()
        a.on_count[2] = lambda: sched.submit(pb, GenerationParams(max_tokens=10, ignore_eos=True), b)
        sched.submit(pa, GenerationParams(max_tokens=20, ignore_eos=True), a)
        res_b, res_a = b.wait(), a.wait()
    finally:
        sched.stop()
    assert res_b.cached_tokens == len(system)
    assert res_b.output_ids == run_alone(full_engine, pb, 10)
    assert res_a.output_ids == run_alone(full_engine, pa, 20)


def test_http_stream_equals_non_stream_and_alone(full_engine):
    tok = SyntheticTokenizer(512)
    sched = Scheduler(full_engine).start()  # with warm-up: /health must flip to 200
    try:
        app = create_app(sched, tok, "tiny-a")
        with TestClient(app) as c:
            assert sched.wait_ready(DEADLINE_S * 4) and c.get("/health").status_code == 200
            body = {
                "model": "tiny-a",
                "prompt": "Hello there, tiny model!",
                "max_tokens": 24,
                "temperature": 0,
            }
            body |= {"ignore_eos": True, "return_token_ids": True}
            whole = c.post("/v1/completions", json=body).json()
            with c.stream("POST", "/v1/completions", json={**body, "stream": True}) as r:
                lines = [ln[6:] for ln in r.iter_lines() if ln.startswith("data: ")]
            chunks = [json.loads(x) for x in lines[:-1]]
            assert lines[-1] == "[DONE]"
            text = "".join(ch["choices"][0]["text"] for ch in chunks)
            assert text == whole["choices"][0]["text"]
            streamed_ids = [i for ch in chunks for i in ch["choices"][0].get("token_ids", [])]
            assert streamed_ids == whole["choices"][0]["token_ids"]
            assert chunks[0]["prompt_token_ids"] == whole["prompt_token_ids"]
    finally:
        sched.stop()
    assert whole["choices"][0]["token_ids"] == run_alone(full_engine, tok.encode(body["prompt"]), 24)


def test_min_tokens_bans_a_greedy_eos_on_the_real_engine(params_and_cfg, full_engine):
    """Make the 3rd greedy token the EOS id (a config whose eos id is that argmax): without
    min_tokens the request stops there; with min_tokens=6 none of the first 6 tokens is EOS, the
    tokens before the ban bites are unchanged, and the ban is lifted once 6 tokens exist."""
    import dataclasses

    cfg, params = params_and_cfg
    prompt = prompt_of(50, 24)
    out = run_alone(full_engine, prompt, 8)
    eos = out[2]
    assert eos not in out[:2]
    engine = engine_mod.Engine(dataclasses.replace(cfg, eos_token_ids=(eos,)), params, full_engine.ecfg)
    sched = Scheduler(engine, warmup=False).start()
    try:
        plain, banned = Collect(), Collect()
        sched.submit(prompt, GenerationParams(max_tokens=8), plain)
        assert plain.wait().output_ids == out[:3] and plain.result.finish_reason == "stop"
        sched.submit(prompt, GenerationParams(max_tokens=10, min_tokens=6), banned)
        res = banned.wait()
    finally:
        sched.stop()
    assert eos not in res.output_ids[:6] and res.output_ids[:2] == out[:2]
    assert len(res.output_ids) >= 7
    slot = next(i for i, s in enumerate(sched.table.slots) if s.tokens[:24] == prompt)
    assert not bool(engine.sampling.suppress_eos[slot])  # lifted after 6 tokens
