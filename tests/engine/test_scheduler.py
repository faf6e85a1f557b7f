"""Scheduler logic against the hand-checkable fake engine (tests/server/fake_engine.py).

The fake's next token is a function of the slot's whole token list, so every exactness assertion
here compares against `reference()` (the request computed alone, by hand-checkable arithmetic).
Arrivals are staggered without sleeping: a request is submitted from inside another request's
token callback once that one has produced k tokens.
"""

from __future__ import annotations

import threading
import time

import pytest

from g4bench.engine.prefix_cache import SlotTable, common_prefix
from g4bench.engine.sampling import SamplingParams
from g4bench.engine.scheduler import GenerationParams, QueueFull, Scheduler, SchedulerDead
from tests.server.fake_engine import EOS, FakeEngine, reference

DEADLINE_S = 60.0  # a hang guard (lazy compiles on a loaded 2-core host), not a speed check


class Collect:
    """A sink that records tokens; `stop_at` makes it report a stop string at that token count."""

    def __init__(self, on_count=None, stop_at: int | None = None) -> None:
        self.tokens: list[int] = []
        self.result = None
        self.done = threading.Event()
        self.on_count = on_count or {}
        self.stop_at = stop_at

    def on_token(self, token: int) -> bool:
        self.tokens.append(token)
        action = self.on_count.pop(len(self.tokens), None)
        if action is not None:
            action()
        return self.stop_at is not None and len(self.tokens) >= self.stop_at

    def on_finish(self, result) -> None:
        self.result = result
        self.done.set()

    def wait(self):
        assert self.done.wait(DEADLINE_S), "request did not finish in time"
        return self.result


def wait_until(pred, timeout: float = DEADLINE_S) -> None:
    end = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < end, "condition not reached before the deadline"
        time.sleep(0.001)


def prompt_of(seed: int, n: int) -> list[int]:
    return [3 + (seed * 37 + i * 11) % 200 for i in range(n)]


@pytest.fixture
def make():
    started = []

    def _make(**kw):
        engine = FakeEngine(**kw)
        sched = Scheduler(engine).start()
        started.append(sched)
        assert sched.wait_ready(DEADLINE_S)
        return engine, sched

    yield _make
    for s in started:
        s.stop()


def test_common_prefix():
    assert common_prefix([1, 2, 3], [1, 2, 4]) == 2
    assert common_prefix([1, 2], [1, 2, 3]) == 2
    assert common_prefix([], [1]) == 0


def test_single_request_chunked_prefill_matches_reference(make):
    engine, sched = make(chunk_size=16)
    prompt = prompt_of(1, 40)
    sink = Collect()
    sched.submit(prompt, GenerationParams(max_tokens=12), sink)
    res = sink.wait()
    assert res.output_ids == reference(prompt, 12) == sink.tokens
    assert res.finish_reason == "length" and res.cached_tokens == 0 and res.prompt_tokens == 40
    assert [c[2:] for c in engine.calls if c[0] == "prefill"] == [(0, 16), (16, 16), (32, 8)]
    assert res.ttft_s is not None and res.queue_s is not None and len(res.token_times_s) == 12
    assert engine.violations == []


@pytest.mark.parametrize("n", [2, 4, 8])
def test_concurrent_staggered_requests_match_alone(make, n):
    engine, sched = make(max_slots=4, chunk_size=8, eos_mod=0)
    prompts = [prompt_of(i, 5 + 7 * i) for i in range(n)]
    lengths = [6 + 3 * i for i in range(n)]
    sinks = [Collect() for _ in range(n)]

    def submit(i):
        sched.submit(prompts[i], GenerationParams(max_tokens=lengths[i]), sinks[i])

    # Request i+1 arrives when request i has produced 2 tokens (mid-decode), from the engine thread.
    for i in range(n - 1):
        sinks[i].on_count[2] = lambda i=i: submit(i + 1)
    submit(0)
    for i in range(n):
        assert sinks[i].wait().output_ids == reference(prompts[i], lengths[i]), f"request {i}"
    assert max(c[1] for c in engine.calls if c[0] == "decode") > 1  # really batched
    assert engine.violations == []
    wait_until(lambda: sched.num_active == 0)
    assert not sched.table.busy()


def test_long_prompt_prefill_interleaves_with_decode(make):
    engine, sched = make(max_slots=2, chunk_size=8, max_len=512)
    short, long_prompt = prompt_of(1, 4), prompt_of(2, 80)
    a, b = Collect(), Collect()
    a.on_count[1] = lambda: sched.submit(long_prompt, GenerationParams(max_tokens=3), b)
    sched.submit(short, GenerationParams(max_tokens=40), a)
    assert a.wait().output_ids == reference(short, 40)
    assert b.wait().output_ids == reference(long_prompt, 3)
    # While `a` decodes, no two prefill chunks of `b` run back to back: each stall is one chunk.
    calls = engine.calls
    b_chunks = [i for i, c in enumerate(calls) if c[0] == "prefill" and c[3] and c[1] != calls[0][1]]
    assert len(b_chunks) == 10
    for i, j in zip(b_chunks, b_chunks[1:], strict=False):
        assert any(c[0] == "decode" for c in calls[i + 1 : j])


@pytest.mark.parametrize("sliding", ["full", "ring"])
@pytest.mark.parametrize("eos_mod", [0, 5])
def test_next_turn_reuses_prefix_and_matches_cold(make, sliding, eos_mod):
    engine, sched = make(sliding_kv=sliding, eos_mod=eos_mod, chunk_size=8)
    turn1 = prompt_of(3, 30)
    s1 = Collect()
    sched.submit(turn1, GenerationParams(max_tokens=10), s1)
    out1 = s1.wait().output_ids
    turn2 = turn1 + out1 + prompt_of(4, 9)
    s2 = Collect()
    sched.submit(turn2, GenerationParams(max_tokens=10), s2)
    res = s2.wait()
    assert res.output_ids == reference(turn2, 10, eos_mod=eos_mod)
    # Everything fed to the model in turn 1 is reused: the prompt and all outputs but the last.
    assert res.cached_tokens == len(turn1) + len(out1) - 1
    first_turn2_prefill = [c for c in engine.calls if c[0] == "prefill"][-((9 + 1 + 7) // 8)]
    assert first_turn2_prefill[2] == res.cached_tokens
    assert engine.violations == []


def test_identical_prompt_reuses_all_but_last_token_with_full_kv(make):
    engine, sched = make()
    p = prompt_of(5, 20)
    for _ in range(2):
        s = Collect()
        sched.submit(p, GenerationParams(max_tokens=4), s)
        res = s.wait()
        assert res.output_ids == reference(p, 4)
    assert res.cached_tokens == 19


def test_ring_partial_match_is_cold_and_exact(make):
    engine, sched = make(sliding_kv="ring", max_slots=1)
    system = prompt_of(6, 24)
    s1, s2 = Collect(), Collect()
    sched.submit(system + prompt_of(7, 5), GenerationParams(max_tokens=3), s1)
    s1.wait()
    p2 = system + prompt_of(8, 6)
    sched.submit(p2, GenerationParams(max_tokens=5), s2)
    res = s2.wait()
    assert res.cached_tokens == 0 and res.output_ids == reference(p2, 5)
    assert engine.violations == []


def test_shared_system_prompt_is_copied_and_resident_conversation_kept(make):
    engine, sched = make(max_slots=3)
    system = prompt_of(9, 32)
    conv_a = system + prompt_of(10, 5)
    sa = Collect()
    sched.submit(conv_a, GenerationParams(max_tokens=4), sa)
    out_a = sa.wait().output_ids
    conv_b = system + prompt_of(11, 7)
    sb = Collect()
    sched.submit(conv_b, GenerationParams(max_tokens=4), sb)
    res_b = sb.wait()
    assert res_b.cached_tokens == 32 and res_b.output_ids == reference(conv_b, 4)
    assert any(c[0] == "copy" for c in engine.calls)
    # Conversation A's next turn still finds its whole history resident.
    sa2 = Collect()
    a2 = conv_a + out_a + prompt_of(12, 3)
    sched.submit(a2, GenerationParams(max_tokens=4), sa2)
    res_a2 = sa2.wait()
    assert res_a2.cached_tokens == len(conv_a) + 3 and res_a2.output_ids == reference(a2, 4)
    assert engine.violations == []


def test_prefix_copied_from_busy_slot(make):
    engine, sched = make(max_slots=2, chunk_size=64)
    system = prompt_of(13, 40)
    a, b = Collect(), Collect()
    pb = system + prompt_of(14, 4)
    a.on_count[3] = lambda: sched.submit(pb, GenerationParams(max_tokens=5), b)
    pa = system + prompt_of(15, 4)
    sched.submit(pa, GenerationParams(max_tokens=30), a)
    assert b.wait().cached_tokens == 40
    assert b.result.output_ids == reference(pb, 5)
    assert a.wait().output_ids == reference(pa, 30)
    assert ("copy", 0, 1) in engine.calls and engine.violations == []


def test_lru_eviction_keeps_recent_conversations():
    table = SlotTable(2)
    always = lambda cached, common: True  # noqa: E731
    for rid, toks in enumerate([[5, 6, 7], [8, 9, 10]]):
        plan = table.plan(toks, always)
        table.acquire(plan, rid)
        table.slots[plan.slot].tokens = list(toks)
        table.release(plan.slot)
    table.plan([5, 6, 7, 1], always)  # a lookup does not touch LRU order
    cold = table.plan([42, 43], always)
    assert cold.slot == 0 and cold.reuse == 0  # slot 0 released first
    assert table.plan([8, 9, 10, 11], always).slot == 1


def test_stop_conditions(make):
    engine, sched = make(eos_mod=4)
    p = prompt_of(16, 10)
    ref = reference(p, 50, eos_mod=4)
    assert ref[-1] == EOS and len(ref) < 50
    s = Collect()
    sched.submit(p, GenerationParams(max_tokens=50), s)
    assert s.wait().output_ids == ref and s.result.finish_reason == "stop"
    # ignore_eos: EOS is generated, kept and fed back; the request runs to max_tokens.
    s = Collect()
    sched.submit(p, GenerationParams(max_tokens=len(ref) + 5, ignore_eos=True), s)
    res = s.wait()
    assert res.finish_reason == "length" and len(res.output_ids) == len(ref) + 5
    assert res.output_ids[: len(ref)] == ref
    # A stop string reported by the sink ends the request at that token.
    s = Collect(stop_at=2)
    sched.submit(prompt_of(17, 3), GenerationParams(max_tokens=9, ignore_eos=True), s)
    assert s.wait().finish_reason == "stop" and len(s.result.output_ids) == 2
    assert engine.violations == []


def test_min_tokens_bans_eos_then_lifts_the_ban_once(make):
    engine, sched = make(eos_mod=4, max_slots=2)
    p, q = prompt_of(16, 10), prompt_of(18, 9)
    ref_p, ref_q = reference(p, 50, eos_mod=4), reference(q, 50, eos_mod=4)
    assert ref_p[-1] == EOS and ref_q[-1] == EOS
    k = len(ref_p) + 2  # the greedy EOS would come before k tokens: the ban must change the output
    a, b = Collect(), Collect()
    # b (no min_tokens) joins a's batch: the ban is per slot, b still stops at its own EOS.
    a.on_count[1] = lambda: sched.submit(q, GenerationParams(max_tokens=50), b)
    sched.submit(p, GenerationParams(max_tokens=k + 30, min_tokens=k), a)
    res = a.wait()
    want = reference(p, k + 30, eos_mod=4, min_tokens=k)
    assert res.output_ids == want and EOS not in want[:k]
    assert b.wait().output_ids == ref_q and b.result.finish_reason == "stop"
    lifts = [c for c in engine.calls if c[0] == "suppress"]
    assert lifts == [("suppress", res_slot(sched, p), False)]
    # The first token already comes from a banned prefill: min_tokens=1 changes a first-token EOS.
    first_eos = next(pp for i in range(200) if reference(pp := prompt_of(100 + i, 7), 1, eos_mod=4) == [EOS])
    s = Collect()
    sched.submit(first_eos, GenerationParams(max_tokens=3, min_tokens=1), s)
    assert s.wait().output_ids == reference(first_eos, 3, eos_mod=4, min_tokens=1)
    assert s.result.output_ids[0] != EOS
    assert engine.violations == []


def res_slot(sched, prompt) -> int:
    """The slot whose resident tokens start with `prompt`."""
    return next(i for i, sl in enumerate(sched.table.slots) if sl.tokens[: len(prompt)] == list(prompt))


def test_sampled_requests_are_batch_independent(make):
    engine, sched = make(max_slots=4)
    sp = SamplingParams(temperature=0.8, seed=7)
    prompts = [prompt_of(20 + i, 6 + i) for i in range(3)]
    alone = []
    for p in prompts:
        s = Collect()
        sched.submit(p, GenerationParams(max_tokens=8, sampling=sp), s)
        alone.append(s.wait().output_ids)
    assert alone[0] != reference(prompts[0], 8)  # sampling really changed the rule
    sinks = [Collect() for _ in prompts]
    for p, s in zip(prompts, sinks, strict=True):
        sched.submit(p, GenerationParams(max_tokens=8, sampling=sp), s)
    assert [s.wait().output_ids for s in sinks] == alone


def test_cancel_frees_slot_at_once(make):
    engine, sched = make(max_slots=1, step_delay_s=0.001)
    s = Collect()
    rid = sched.submit(prompt_of(21, 5), GenerationParams(max_tokens=200), s)
    wait_until(lambda: len(s.tokens) >= 3)
    waiting = Collect()
    wid = sched.submit(prompt_of(22, 5), GenerationParams(max_tokens=200), waiting)
    sched.cancel(wid)
    sched.cancel(rid)
    assert s.wait().finish_reason == "cancelled"
    assert waiting.wait().finish_reason == "cancelled"
    wait_until(lambda: sched.num_active == 0 and sched.num_waiting == 0)
    # The server keeps serving, and the cancelled conversation's fed tokens stay reusable.
    s2 = Collect()
    sched.submit(prompt_of(23, 5), GenerationParams(max_tokens=4), s2)
    assert s2.wait().output_ids == reference(prompt_of(23, 5), 4)
    assert engine.violations == []


def test_bounded_queue_and_validation():
    engine = FakeEngine(max_slots=1, max_len=64)
    engine.warmup_gate = threading.Event()
    sched = Scheduler(engine, max_waiting=2).start()
    try:
        assert not sched.ready
        sinks = [Collect() for _ in range(3)]  # max_waiting (2) + the idle slot (1)
        for s in sinks:
            sched.submit([5, 6], GenerationParams(max_tokens=2), s)
        with pytest.raises(QueueFull):
            sched.submit([5, 6], GenerationParams(max_tokens=2), Collect())
        with pytest.raises(ValueError, match="context length"):
            sched.submit([5] * 60, GenerationParams(max_tokens=5), Collect())
        with pytest.raises(ValueError, match="token ids"):
            sched.submit([5, 999], GenerationParams(max_tokens=5), Collect())
        with pytest.raises(ValueError, match="no tokens"):
            sched.submit([], GenerationParams(max_tokens=5), Collect())
        engine.warmup_gate.set()
        assert sched.wait_ready(DEADLINE_S)
        for s in sinks:
            assert s.wait().output_ids == reference([5, 6], 2)
    finally:
        sched.stop()


def test_engine_errors_fail_only_their_requests(make):
    engine, sched = make(max_slots=2, poison_token=250)
    bad, good = Collect(), Collect()
    sched.submit([5, 250, 6], GenerationParams(max_tokens=3), bad)
    sched.submit([5, 6, 7], GenerationParams(max_tokens=3), good)
    assert bad.wait().finish_reason == "error" and "poisoned" in bad.result.error
    assert good.wait().output_ids == reference([5, 6, 7], 3)
    engine.decode_error = RuntimeError("device fell over")
    s = Collect()
    sched.submit([8, 9], GenerationParams(max_tokens=3), s)
    assert s.wait().finish_reason == "error" and "device fell over" in s.result.error
    s = Collect()
    sched.submit([8, 9], GenerationParams(max_tokens=3), s)
    assert s.wait().output_ids == reference([8, 9], 3) and sched.alive


def test_sink_errors_fail_only_their_request(make):
    engine, sched = make()

    class Broken(Collect):
        def on_token(self, token):
            raise RuntimeError("client gone wrong")

    b, g = Broken(), Collect()
    sched.submit([5, 6], GenerationParams(max_tokens=3), b)
    sched.submit([5, 7], GenerationParams(max_tokens=3), g)
    assert b.wait().finish_reason == "error"
    assert g.wait().output_ids == reference([5, 7], 3) and sched.alive


def test_loop_death_is_loud_and_visible(make, caplog):
    engine, sched = make()
    first = Collect()
    sched.submit([5, 6], GenerationParams(max_tokens=3), first)
    first.wait()

    def boom(cached, common):
        raise AssertionError("scheduler bug")

    engine.can_resume = boom  # the next placement finds a resident prefix and calls it
    s = Collect()
    sched.submit([5, 6, 7], GenerationParams(max_tokens=3), s)
    assert s.wait().finish_reason == "error"
    wait_until(lambda: not sched.alive)
    assert not sched.ready and isinstance(sched.error, AssertionError)
    assert "engine loop died" in caplog.text
    with pytest.raises(SchedulerDead):
        sched.submit([5, 6], GenerationParams(max_tokens=3), Collect())
