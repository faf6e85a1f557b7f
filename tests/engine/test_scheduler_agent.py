"""The scheduler's grammar and logprobs path on the real engine (tiny model, paged KV).

- Unconstrained batches use the fused decode step (no split, no mask work): they pay nothing.
- A constrained request beside unconstrained ones: its output follows its grammar, theirs equal
  what they produce alone (the mask rows of other slots allow everything).
- logprobs reported for every token equal log_softmax of the logits the engine computed for that
  step (recorded here) to 1e-5, top ids sorted, and greedy picks the top id.
"""

from __future__ import annotations

import json
import threading

import numpy as np
import pytest

engine_mod = pytest.importorskip("g4bench.engine.engine")

from g4bench.engine.grammar import compile_grammar, piece_vocab  # noqa: E402
from g4bench.engine.sampling import SamplingParams  # noqa: E402
from g4bench.engine.scheduler import GenerationParams, Scheduler  # noqa: E402
from g4bench.server.synthetic_tokenizer import SyntheticTokenizer  # noqa: E402


class Recording(engine_mod.Engine):
    """The engine, counting its decode calls and keeping a host copy of every step's logits."""

    def __init__(self, *a, **kw) -> None:
        super().__init__(*a, **kw)
        self.fused = self.split = 0
        self.logits: list[np.ndarray] = []

    def decode(self, tokens, positions, active):
        self.fused += 1
        return super().decode(tokens, positions, active)

    def decode_logits(self, tokens, positions, active):
        self.split += 1
        logits = super().decode_logits(tokens, positions, active)
        self.logits.append(np.asarray(logits))
        return logits

    def step(self, tokens, positions, active, pieces, *, decode_logits=False):
        out = super().step(tokens, positions, active, pieces, decode_logits=decode_logits)
        if decode_logits:
            self.split += 1
            self.logits.append(np.asarray(out[0]))
        elif np.asarray(active).any():
            self.fused += 1
        self.logits += [np.asarray(self.piece_logits(p.slot)) for p in pieces if p.sampling is not None]
        return out

    def prefill(self, slot, tokens, start, sampling=None):
        out = super().prefill(slot, tokens, start, sampling)
        if sampling is not None:
            self.logits.append(np.asarray(self.last_logits)[None])
        return out


@pytest.fixture(scope="module", params=["mixed", "chunk"])
def engine(request):
    """Both prefill policies: the mixed step carries decode rows (fused or split) and pieces."""
    from g4bench.model.config import load_config
    from g4bench.model.params import WeightFormat, init_params

    cfg = load_config("tiny-a")
    ecfg = engine_mod.EngineConfig(max_slots=4, max_len=256, chunk_size=32, min_kv_bucket=256,
                                   prefill_policy=request.param)  # fmt: skip
    return Recording(cfg, init_params(cfg, WeightFormat(layers="f32"), seed=0), ecfg)


class Sink:
    def __init__(self) -> None:
        self.ids: list[int] = []
        self.rows: list = []
        self.done = threading.Event()

    def on_token(self, token, logprob=None) -> bool:
        self.ids.append(token)
        self.rows.append(logprob)
        return False

    def on_finish(self, result) -> None:
        self.result = result
        self.done.set()


def run(engine, jobs):
    sched = Scheduler(engine, warmup=False).start()
    sinks = []
    try:
        for prompt, params in jobs:
            sinks.append(Sink())
            sched.submit(prompt, params, sinks[-1])
        for s in sinks:
            assert s.done.wait(120)
    finally:
        sched.stop()
    return sinks


TOK = SyntheticTokenizer(512)
SCHEMA = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 99},
                                           "s": {"type": "string", "maxLength": 6}},
          "required": ["n", "s"], "additionalProperties": False}  # fmt: skip


def test_unconstrained_batches_use_the_fused_step(engine):
    engine.fused = engine.split = 0
    run(
        engine,
        [(TOK.encode(f"prompt {i}", add_bos=True), GenerationParams(8, ignore_eos=True)) for i in range(3)],
    )
    assert engine.fused >= 7 and engine.split == 0


def test_constrained_beside_free_requests(engine):
    vocab = piece_vocab([TOK.piece(i).encode() for i in range(512)], 1, 2, [0, 1, 2])
    grammar = compile_grammar({"type": "json_schema", "json_schema": {"schema": SCHEMA, "strict": True}})
    free = [(TOK.encode(f"free {i}", add_bos=True), GenerationParams(20, ignore_eos=True)) for i in range(2)]
    alone = [s.ids for s in run(engine, free)]
    engine.split = 0
    hot = GenerationParams(60, SamplingParams(temperature=1.0, seed=5), constraint=vocab.matcher(grammar))
    sinks = run(engine, [*free, (TOK.encode("json please", add_bos=True), hot)])
    assert engine.split > 0
    assert [s.ids for s in sinks[:2]] == alone
    out = json.loads(TOK.decode(sinks[2].ids))
    assert set(out) == {"n", "s"} and 0 <= out["n"] <= 99 and len(out["s"]) <= 6
    assert sinks[2].result.finish_reason == "stop"


def test_logprobs_equal_log_softmax_of_the_engine_logits(engine):
    engine.logits = []
    params = GenerationParams(10, logprobs=4, ignore_eos=True)  # greedy
    (sink,) = run(engine, [(TOK.encode("logprobs", add_bos=True), params)])
    assert len(engine.logits) == len(sink.rows) == 10
    for logits, row in zip(engine.logits, sink.rows, strict=True):
        x = logits[0]  # one request, in slot 0 of a fresh scheduler (prefill logits are [1, V])
        ref = x - np.log(np.exp(x - x.max()).sum()) - x.max()
        assert abs(row.logprob - ref[row.token]) <= 1e-5
        ids = [t for t, _ in row.top]
        assert ids == list(np.argsort(-x)[:4]) and ids[0] == row.token  # sorted; greedy = top
        assert all(abs(lp - ref[t]) <= 1e-5 for t, lp in row.top)
