"""Interleaved rounds (harness/revalidate/rounds.py) and the host-load meter (harness/hostload.py)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness.hostload import HostLoadMeter
from harness.revalidate.rounds import group_by_name, pending, plan_visits, read_visits, run_visits


def test_every_round_visits_every_name_in_a_fresh_order():
    names = [f"c{i}" for i in range(8)]
    plan = plan_visits(names, rounds=4, seed=5)
    assert len(plan) == 32
    orders = [[v.name for v in plan if v.round == r] for r in range(4)]
    assert all(sorted(o) == names for o in orders)
    assert len({tuple(o) for o in orders}) == 4  # a fresh random order each round
    assert plan == plan_visits(names, rounds=4, seed=5)  # reproducible
    assert [v.slot for v in plan[:8]] == list(range(8))


def test_visits_are_logged_at_once_and_resume_measures_only_failed_ones(tmp_path):
    plan = plan_visits(["a", "b"], rounds=2)
    calls = []

    def measure(v):
        calls.append((v.round, v.name))
        return {"failure": {"kind": "crash"}} if (v.round, v.name) == (1, "b") else {"x": v.round}

    run_visits(plan, tmp_path, measure)
    assert len(read_visits(tmp_path)) == 4 and len(calls) == 4
    assert [(v.round, v.name) for v in pending(plan, read_visits(tmp_path))] == [(1, "b")]
    calls.clear()
    run_visits(plan, tmp_path, lambda v: {"x": v.round})
    assert calls == [] and pending(plan, read_visits(tmp_path)) == []
    grouped = group_by_name(read_visits(tmp_path), rounds=2)
    assert grouped["b"] == [{"x": 0}, {"x": 1}]  # the retry replaced the failed attempt


def test_meter_sees_a_competing_busy_loop():
    """A bounded busy loop in another process shows up as ~1 core of other load."""
    hog = subprocess.Popen(
        [sys.executable, "-c", "import time\nt=time.time()\nwhile time.time()-t<3: pass"],
    )
    try:
        time.sleep(0.3)  # let it start spinning
        meter = HostLoadMeter()
        meter.start()
        time.sleep(1.0)  # this process idles: all busy time is someone else's
        load = meter.stop()
    finally:
        hog.wait(timeout=10)
    assert load.other_cores > 0.5 and load.contaminated


@pytest.mark.skipif(not Path("/proc/self/smaps_rollup").exists(), reason="Linux /proc only")
def test_memory_pages_reads_this_process() -> None:
    from harness.timing import memory_pages

    pages = memory_pages()
    assert pages is not None
    assert pages["rss_bytes"] > 1 << 20  # a Python process holds well over 1 MiB
    assert 0 <= pages["anon_huge_bytes"] <= pages["rss_bytes"]
