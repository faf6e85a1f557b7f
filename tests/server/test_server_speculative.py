"""The server with speculative decoding (serve --draft-model --spec-k) over HTTP, on tiny-a.

Greedy completions (streamed and not) equal a plain server's, a JSON-schema request (a grammar:
decoded beside the speculative rows, without drafts) still parses, and /metrics exports the
acceptance counters the rounds produced. The launch spec refuses what cannot be served.
"""

from __future__ import annotations

import json

import jax.numpy as jnp
import pytest
from fastapi.testclient import TestClient

from g4bench.engine.engine import Engine
from g4bench.engine.engine_config import EngineConfig
from g4bench.engine.scheduler import Scheduler
from g4bench.engine.spec_batch import SpecDecoder
from g4bench.model.config import load_config
from g4bench.server.app import create_app
from g4bench.server.launch import LaunchSpec
from g4bench.server.metrics import SPEC_SERIES
from g4bench.server.synthetic_tokenizer import SyntheticTokenizer
from tests.engine.test_engine import random_params
from tests.server.conftest import DEADLINE_S

ECFG = EngineConfig(
    max_slots=2, max_len=128, chunk_size=32, min_kv_bucket=64, kv_dtype="f32", prefill_policy="chunk"
)


def _engine(seed: int, **kw) -> Engine:
    cfg = load_config("tiny-a")
    ecfg = EngineConfig(**{**ECFG.__dict__, **kw})
    return Engine(cfg, random_params(cfg, seed), ecfg, compute_dtype=jnp.float32)


def _serve(spec: SpecDecoder | None, target: Engine, bodies: list[dict]) -> tuple[list[dict], str]:
    sched = Scheduler(target, spec=spec, warmup=False).start()
    try:
        with TestClient(create_app(sched, SyntheticTokenizer(512), "tiny-a")) as c:
            assert sched.wait_ready(DEADLINE_S)
            out = []
            for body in bodies:
                r = c.post(body.pop("_path", "/v1/completions"), json=body)
                assert r.status_code == 200, r.text
                out.append(r.json())
            with c.stream("POST", "/v1/completions", json={**bodies[0], "stream": True}) as r:
                lines = [ln[6:] for ln in r.iter_lines() if ln.startswith("data: ")]
            streamed = [i for x in lines[:-1] for i in json.loads(x)["choices"][0].get("token_ids", [])]
            out.append({"streamed_ids": streamed})
            return out, c.get("/metrics").text
    finally:
        sched.stop()


def test_speculative_server_matches_a_plain_server_and_exports_acceptance():
    bodies = [
        {"model": "tiny-a", "prompt": "Hello there, tiny model!", "max_tokens": 30, "temperature": 0,
         "ignore_eos": True, "return_token_ids": True},
        {"model": "tiny-a", "prompt": "Another prompt, longer than the first one by a bit.", "max_tokens": 20,
         "temperature": 0, "ignore_eos": True, "return_token_ids": True},
        {"_path": "/v1/chat/completions", "model": "tiny-a", "messages": [{"role": "user", "content": "hi"}],
         "max_tokens": 60, "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {
             "type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}}}},
    ]  # fmt: skip
    plain, _ = _serve(None, _engine(0), [dict(b) for b in bodies])
    target = _engine(0)
    spec, metrics = _serve(SpecDecoder(target, _engine(0, kv_layout="contiguous", sliding_kv="full",
                                                       prefill_policy=None), k=3), target, [dict(b) for b in bodies])  # fmt: skip
    for a, b in zip(plain[:2], spec[:2], strict=True):
        assert a["choices"][0]["token_ids"] == b["choices"][0]["token_ids"]
    assert spec[3]["streamed_ids"] == plain[0]["choices"][0]["token_ids"]
    json.loads(spec[2]["choices"][0]["message"]["content"])  # the grammar request parses
    values = {
        ln.split()[0]: float(ln.split()[1]) for ln in metrics.splitlines() if ln.startswith("g4bench_spec_")
    }
    for name in SPEC_SERIES:
        assert name in values, (name, sorted(values))
    # a drafter with the target's weights keeps every draft
    assert values["g4bench_spec_accepted_tokens_total"] == values["g4bench_spec_draft_tokens_total"] > 0
    assert values["g4bench_spec_k"] == 3


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"spec_k": 3}, "needs both --draft-model and --spec-k"),
        ({"draft_model": "tiny-a"}, "needs both --draft-model and --spec-k"),
        ({"draft_model": "tiny-a", "spec_k": 3, "prefill_policy": "mixed"}, "chunk prefill policy"),
        (
            {"draft_model": "tiny-a", "spec_k": 3, "kv_layout": "contiguous"},
            "paged KV layout or --sliding-kv full",
        ),
        ({"draft_model": "tiny-a", "spec_k": 256}, "below the chunk size"),
    ],
)
def test_launch_spec_refuses_what_speculation_cannot_serve(kw, message):
    with pytest.raises(ValueError, match=message):
        LaunchSpec(model="tiny-a", **kw)


def test_an_assistant_drafter_is_refused_with_the_reason():
    from g4bench.server.launch import speculation

    spec = LaunchSpec(model="tiny-a", draft_model="tiny-a-assistant", spec_k=3, max_slots=1, max_len=64)
    with pytest.raises(ValueError, match="assistant drafter"):
        speculation(spec, target=None)
