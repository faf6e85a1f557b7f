"""The engine stand-in against the real engine: same requests through the real Scheduler (stepped by
hand, no thread) must produce the same sequence of engine calls, argument for argument, on both KV
layouts; and the stand-in's clock must advance by exactly the priced shapes."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from g4bench.engine.engine import Engine
from g4bench.engine.engine_config import EngineConfig
from g4bench.engine.scheduler import GenerationParams, Scheduler
from g4bench.engine.virtual_engine import EngineCall, VirtualClock, VirtualEngine
from g4bench.model.config import load_config
from g4bench.model.params import WeightFormat, init_params

ECFG = dict(max_slots=2, max_len=96, kv_dtype="f32", sliding_kv="ring", chunk_size=32, min_kv_bucket=32,
            block_size=4)  # fmt: skip


class Recorder:
    """Wraps an engine; logs every public call the scheduler makes, with its arguments."""

    def __init__(self, inner) -> None:
        self.inner, self.log = inner, []

    def __getattr__(self, name):
        attr = getattr(self.inner, name)
        if name not in ("prefill", "decode", "step", "copy_slot", "set_block_table", "set_suppress_eos"):
            return attr

        def call(*args):
            self.log.append((name, *(tuple(np.asarray(a).tolist()) if isinstance(a, np.ndarray | list) else a
                                     for a in args)))  # fmt: skip
            return attr(*args)

        return call


class Sink:
    def __init__(self) -> None:
        self.result = None

    def on_token(self, token: int) -> bool:
        return False

    def on_finish(self, result) -> None:
        self.result = result


def drive(engine, clock=None) -> list:
    """Two conversations sharing a prefix plus a long prompt; the second turn resends the first."""
    sched = Scheduler(engine, warmup=False, **({"clock": clock} if clock else {}))
    base = [5 + i % 50 for i in range(40)]
    sinks = []
    for prompt, n in ((base, 5), (base[:20] + [7] * 50, 3), ([9] * 70, 4)):
        sinks.append(Sink())
        sched.submit(prompt, GenerationParams(max_tokens=n, ignore_eos=True), sinks[-1])
    for _ in range(500):
        if not (sched.num_active or sched.num_waiting):
            break
        sched.step()
    assert all(s.result is not None and s.result.finish_reason == "length" for s in sinks)
    return [(s.result.prompt_tokens, s.result.cached_tokens, len(s.result.output_ids)) for s in sinks]


@pytest.fixture(scope="module")
def cfg():
    return load_config("tiny-a")


@pytest.fixture(scope="module")
def params(cfg):
    return init_params(cfg, WeightFormat(layers="f32", ple="f32", embed="f32"), 0)


@pytest.mark.parametrize(
    ("layout", "policy", "programs"),
    [("paged", "mixed", {"step", "decode"}), ("paged", "chunk", {"prefill", "decode"}),
     ("contiguous", "chunk", {"prefill", "decode"})],
)  # fmt: skip
def test_same_engine_calls_as_the_real_engine(cfg, params, layout, policy, programs):
    ecfg = EngineConfig(**ECFG, kv_layout=layout, prefill_policy=policy, max_batched_tokens=64)
    real = Recorder(Engine(cfg, params, ecfg, compute_dtype=jnp.float32))
    virtual = Recorder(VirtualEngine(cfg, ecfg, lambda call: 0.001, VirtualClock()))
    results = drive(real)
    assert results == drive(virtual)
    if layout == "paged":  # the second prompt reuses the first's 20 shared tokens under both policies
        assert results[1][1] == 20
    kinds = {entry[0] for entry in real.log}
    assert programs <= kinds and not ({"step", "prefill"} - programs) & kinds

    # sampled token values differ (random weights vs a fixed id) and never steer the schedule
    # (ignore_eos): compare decode and mixed calls by positions, active rows and pieces
    def shape(log):
        return [e if e[0] not in ("decode", "step") else (e[0], *e[2:]) for e in log]

    assert shape(real.log) == shape(virtual.log)


@pytest.mark.parametrize("policy", ["chunk", "mixed"])
def test_clock_advances_by_priced_shapes(cfg, policy):
    ecfg = EngineConfig(**ECFG, prefill_policy=policy, max_batched_tokens=64)
    clock = VirtualClock()
    price = {"prefill": 0.010, "decode": 0.002, "mixed": 0.001}

    def priced(call: EngineCall) -> float:
        return price[call.program] * (call.batched_tokens if call.program != "decode" else 1)

    engine = VirtualEngine(cfg, ecfg, priced, clock)
    drive(engine, clock)
    assert clock.now == pytest.approx(sum(priced(c) for c in engine.calls))
    # every call is at a compiled bucket shape, decode over all slots
    assert {c.tokens for c in engine.calls if c.program == "prefill"} <= set(ecfg.chunk_buckets)
    assert {c.kv_len for c in engine.calls} <= set(ecfg.kv_buckets)
    assert all(c.rows == ecfg.max_slots for c in engine.calls if c.program == "decode")
    if policy == "chunk":
        assert EngineCall("prefill", 1, 32, 32) in engine.calls  # the 70-token prompt's first full chunk
    else:
        mixed = [c for c in engine.calls if c.program == "mixed"]
        assert mixed and {c.rows for c in mixed} <= set(ecfg.row_buckets)
        assert all(c.decode_rows == ecfg.max_slots and c.tokens == 32 for c in mixed)
        # the second prompt shares 5 blocks with the first, so it waits one call for them to be
        # written; the next call (budget 64 tokens = 2 rows) carries both prompts' pieces
        assert (mixed[0].rows, mixed[0].active, mixed[1].rows) == (1, 0, 2)


def test_clock_cannot_run_backwards():
    clock = VirtualClock()
    clock.advance(1.5)
    clock.advance_to(1.0)
    assert clock() == 1.5
    with pytest.raises(ValueError):
        clock.advance(-0.1)
