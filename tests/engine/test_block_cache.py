"""Block-level prefix sharing: the BlockCache alone, and the Scheduler over the hand-checkable paged
fake (tests/engine/fake_paged_engine.py), whose next token is computed from what the block tables
read back. Exactness is always against `reference()`: the request computed alone, by hand."""

from __future__ import annotations

import pytest

from g4bench.engine.block_cache import BlockCache
from g4bench.engine.scheduler import GenerationParams, Scheduler
from tests.engine.fake_paged_engine import FakePagedEngine
from tests.engine.test_scheduler import DEADLINE_S, Collect, prompt_of, wait_until
from tests.server.fake_engine import reference


@pytest.fixture
def make():
    started = []

    def _make(**kw):
        engine = FakePagedEngine(**kw)
        sched = Scheduler(engine).start()
        started.append(sched)
        assert sched.wait_ready(DEADLINE_S)
        return engine, sched

    yield _make
    for s in started:
        s.stop()


def run(sched, prompt, max_tokens=6, **kw):
    s = Collect()
    sched.submit(prompt, GenerationParams(max_tokens=max_tokens, **kw), s)
    return s.wait()


def assert_all_released(sched):
    """Every request done: no block is referenced; each is free or cached by the index."""
    wait_until(lambda: sched.num_active == 0)
    table = sched.table
    for pool in (table.full, table.win):
        if pool is not None:
            assert not any(pool.refs), "a block is still referenced"
            assert len(pool.free) + len(pool.owner) == pool.size


# ---------------------------------------------------------------------------- sharing across slots
@pytest.mark.parametrize("window", [None, 8])
def test_shared_system_prompt_reused_from_another_slot(make, window):
    engine, sched = make(max_slots=2, window=window)
    system = prompt_of(1, 41)  # 10 whole blocks of 4 and one token
    a = system + prompt_of(2, 7)
    b = system + prompt_of(3, 5)
    ra = run(sched, a)
    rb = run(sched, b)
    assert ra.cached_tokens == 0 and ra.output_ids == reference(a, 6)
    assert rb.cached_tokens == 40 and rb.computed_tokens == len(b) - 40
    assert rb.output_ids == reference(b, 6)
    assert engine.violations == []
    assert_all_released(sched)


@pytest.mark.parametrize("window", [None, 8])
def test_concurrent_admission_computes_the_prefix_once(make, window):
    """Four agents submitted together: the first computes the system prompt, the other three find
    it when their prefill starts (after the first's), whatever slot they run in."""
    engine, sched = make(max_slots=4, window=window, chunk_size=8)
    system = prompt_of(4, 48)
    prompts = [system + prompt_of(10 + i, 6 + i) for i in range(4)]
    sinks = [Collect() for _ in prompts]
    for p, s in zip(prompts, sinks, strict=True):
        sched.submit(p, GenerationParams(max_tokens=8), s)
    results = [s.wait() for s in sinks]
    for p, r in zip(prompts, results, strict=True):
        assert r.output_ids == reference(p, 8)
    assert sorted(r.cached_tokens for r in results) == [0, 48, 48, 48]
    assert engine.violations == []
    assert_all_released(sched)


def test_more_conversations_than_slots_stay_resident(make):
    """Six agents over two slots, three turns each: every later turn reuses its whole history but
    the partial last block, although its slot served other agents in between."""
    engine, sched = make(max_slots=2, window=8, cached_windows=4)
    history = {i: prompt_of(20 + i, 9 + i) for i in range(6)}
    for turn in range(3):
        for i in range(6):
            prompt = history[i]
            r = run(sched, prompt, max_tokens=5)
            assert r.output_ids == reference(prompt, 5)
            if turn:
                assert r.cached_tokens >= len(prompt) - 4 - 3 - 1, (turn, i, r.cached_tokens)
            history[i] = prompt + r.output_ids + prompt_of(40 + turn * 6 + i, 3)
    assert engine.violations == []
    assert_all_released(sched)


def test_eviction_under_block_pressure_stays_exact(make):
    """A pool of 20 blocks (80 tokens) over 10 distinct 30-token conversations: old conversations are
    evicted (LRU), the most recent is still resident, and every answer stays exact."""
    engine, sched = make(max_slots=2, max_len=64, blocks=20, window=8)
    prompts = [prompt_of(60 + i, 30) for i in range(10)]
    for p in prompts:
        assert run(sched, p).output_ids == reference(p, 6)
    assert run(sched, prompts[-1] + [7]).cached_tokens == 28  # the latest conversation survived
    r = run(sched, prompts[0] + [7])
    assert r.cached_tokens == 0 and r.output_ids == reference(prompts[0] + [7], 6)  # evicted
    assert engine.violations == []
    assert_all_released(sched)


def test_metrics_show_hit_rate_and_pool_occupancy(make):
    from g4bench.server.metrics import ServerMetrics

    engine, sched = make(max_slots=2, window=8)
    metrics = ServerMetrics(sched, "fake")
    system = prompt_of(5, 40)
    run(sched, system + [9, 9])
    run(sched, system + [8, 8, 8])
    assert_all_released(sched)
    text = metrics.render().decode()
    assert f"g4bench_prefix_cache_hit_rate {40 / 85}" in text
    stats = sched.table.stats()
    # 47 fed tokens: 11 whole blocks; the second request shares 10 and adds 2 (48 fed tokens)
    assert stats["full_blocks_used"] == 0 and stats["full_blocks_cached"] == 11 + 2
    assert f'g4bench_kv_blocks{{group="full",state="cached"}} {stats["full_blocks_cached"]:.1f}' in text
    assert 'g4bench_kv_blocks{group="window",state="free"}' in text


# ---------------------------------------------------------------------------- the index itself
def make_cache(window=None, full_blocks=33, window_blocks=0, bs=4):
    tables = {}
    cache = BlockCache(
        2,
        block_size=bs,
        table_len=16,
        full_blocks=full_blocks,
        window_blocks=window_blocks,
        window=window,
        set_table=lambda slot, group, ids: tables.__setitem__((slot, group), list(ids)),
    )
    return cache, tables


def fill(cache, tokens, max_tokens=1):
    """Run one request's prefill through the cache's protocol (no engine); returns the reuse."""
    slot = cache.claim(0)
    reuse = cache.begin(slot, tokens, max_tokens)
    for start in range(reuse, len(tokens), 8):
        n = min(8, len(tokens) - start)
        cache.prepare(slot, start, n)
        cache.extend(slot, tokens[start : start + n])
    return slot, reuse


def test_match_is_token_exact_and_leaves_one_token():
    cache, _ = make_cache()
    slot, _ = fill(cache, list(range(10, 30)))
    cache.release(slot)
    assert len(cache.match(list(range(10, 30)))) == 4  # 20 tokens: 5 blocks, the last token computed
    changed = list(range(10, 30))
    changed[9] = 99  # inside block 2
    assert len(cache.match(changed)) == 2
    assert len(cache.match(list(range(10, 18)) + [5, 6, 7, 8, 9])) == 2
    assert cache.match([10, 11, 12]) == []


def test_window_blocks_bound_the_hit_and_the_sequence():
    """W = 8, bs = 4: a running sequence holds at most the window blocks of a chunk; a hit needs the
    window blocks before its end, and shrinks when they were evicted."""
    cache, tables = make_cache(window=8, window_blocks=1 + 2 * (5 + 2))
    seq = list(range(40, 80))  # 40 tokens
    slot = cache.claim(0)
    assert cache.begin(slot, seq, 1) == 0
    for start in range(0, 40, 8):
        cache.prepare(slot, start, 8)
        assert len(cache.slots[slot].window) <= 5  # (W + chunk − 2) // bs + 2 = 5
        cache.extend(slot, seq[start : start + 8])
    assert sorted(cache.slots[slot].window) == [8, 9]  # positions 33.. are within W of position 40
    cache.release(slot)
    assert len(cache.match(seq + [1])) == 10
    window = cache.match(seq + [1])[8].window
    cache.win.lru.pop(window)  # evict block 8's window as the LRU would
    cache._evict_window(window)
    cache.win.free.append(window)
    # a hit of 10 or 9 blocks needs block 8's window; 8 blocks need those of blocks 6 and 7
    assert len(cache.match(seq + [1])) == 8
    assert all(b == 0 for b in tables[(slot, "window")][:8])
