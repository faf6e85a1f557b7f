"""The scheduler's mixed turn, on the virtual engine and a fake clock (no device, no timing).

A burst of 8 prompts of 200 tokens arrives while 2 streams decode, with calls priced as a fixed
cost plus a cost per computed token position: under the mixed policy every call carries both decode
rows and fills the token budget with pieces, so the burst's last first token comes sooner and the
streams never wait more than one budgeted call; under the chunk policy each prompt waits for every
earlier prompt's chunk and a decode call between.
"""

from __future__ import annotations

import numpy as np
import pytest

from g4bench.engine.engine_config import EngineConfig
from g4bench.engine.mixed import SAMPLED_PER_STEP
from g4bench.engine.scheduler import GenerationParams, Scheduler
from g4bench.engine.virtual_engine import EngineCall, VirtualClock, VirtualEngine
from g4bench.model.config import load_config

FIXED_S, PER_TOKEN_S = 0.030, 0.0003


def price(call: EngineCall) -> float:
    tokens = call.rows if call.program == "decode" else call.batched_tokens
    return FIXED_S + PER_TOKEN_S * tokens


class Times:
    def __init__(self, clock: VirtualClock) -> None:
        self.clock, self.times, self.result = clock, [], None

    def on_token(self, token: int) -> bool:
        self.times.append(self.clock())
        return False

    def on_finish(self, result) -> None:
        self.result = result


def burst(policy: str, budget: int = 512):
    cfg = load_config("tiny-a")
    clock = VirtualClock()
    ecfg = EngineConfig(
        max_slots=16, max_len=1024, chunk_size=256, prefill_policy=policy, max_batched_tokens=budget
    )
    engine = VirtualEngine(cfg, ecfg, price, clock)
    sched = Scheduler(engine, warmup=False, clock=clock)
    rng = np.random.default_rng(0)
    streams = [Times(clock) for _ in range(2)]
    for s in streams:
        sched.submit(rng.integers(3, 500, 16).tolist(), GenerationParams(200, ignore_eos=True), s)
    for _ in range(20):  # the streams decode alone for a while
        sched.step()
    sent = clock()
    prompts = [Times(clock) for _ in range(8)]
    for p in prompts:
        sched.submit(rng.integers(3, 500, 200).tolist(), GenerationParams(4, ignore_eos=True), p)
    while any(p.result is None for p in prompts):
        sched.step()
    last = max(p.times[0] for p in prompts) - sent
    gaps = [np.diff(s.times) for s in streams]
    during = max(float(g[(np.array(s.times[1:]) > sent)].max()) for g, s in zip(gaps, streams, strict=True))
    before = float(np.median(np.concatenate([g[:10] for g in gaps])))
    return engine.calls, last, during, before


def test_the_burst_prefills_together_under_the_mixed_policy():
    calls, last, during, before = burst("mixed")
    mixed = [c for c in calls if c.program == "mixed"][1:]  # the first one prefilled the streams
    assert mixed and all(c.batched_tokens <= 512 + 16 for c in mixed)  # budget + the decode rows
    assert all(c.active >= 2 for c in mixed)  # the streams ride along in every call
    assert not [c for c in calls if c.program == "prefill"]
    # 1600 prompt tokens at ≤ 480 a call (512 − 16 decode rows, in 32-token rows): 4 calls
    assert len(mixed) == 4
    _, chunk_last, chunk_during, _ = burst("chunk")
    assert last < 0.8 * chunk_last
    # a stream waits at most one budgeted call: its largest gap is one mixed call's price
    assert during <= max(price(c) for c in mixed) + 1e-9
    assert before == pytest.approx(price(EngineCall("decode", 16, 1, 512)))
    del chunk_during


def test_at_most_the_sampled_rows_finish_in_one_call():
    """Sixteen short prompts at once: at most SAMPLED_PER_STEP first tokens per call."""
    cfg = load_config("tiny-a")
    clock = VirtualClock()
    ecfg = EngineConfig(max_slots=16, max_len=512, chunk_size=256, max_batched_tokens=1024)
    engine = VirtualEngine(cfg, ecfg, price, clock)
    sched = Scheduler(engine, warmup=False, clock=clock)
    sinks = [Times(clock) for _ in range(16)]
    for i, s in enumerate(sinks):
        sched.submit([3 + i] + [7] * 19, GenerationParams(1, ignore_eos=True), s)
    while any(s.result is None for s in sinks):
        sched.step()
    firsts = sorted({s.times[0] for s in sinks})
    per_call = [sum(s.times[0] == t for s in sinks) for t in firsts]
    assert max(per_call) == SAMPLED_PER_STEP and sum(per_call) == 16
    assert all(r.result.finish_reason == "length" for r in sinks)
