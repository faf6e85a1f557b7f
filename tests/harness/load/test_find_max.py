"""`--find-max`: the bisection against scripted measurers, and the driver over a fake load runner."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from harness.load import find_max
from harness.load.client import RequestRecord
from harness.load.find_max import FindMax, Settings, settings_from, write_search
from harness.load.runner import LevelResult, LoadConfig, RunResult
from harness.load.search import bisect_max, midpoint
from harness.load.slo import SLO
from harness.load.workloads import WorkloadConfig


def step(limit: float):
    """Attainment 1 up to `limit`, then 0; records every level asked for."""
    asked: list[float] = []

    def measure(level: float) -> float:
        asked.append(level)
        return 1.0 if level <= limit else 0.0

    return measure, asked


@pytest.mark.parametrize(("limit", "best", "probes"), [
    (5, 5, [1, 8, 4, 6, 5]),
    (4, 4, [1, 8, 4, 6, 5]),
    (1, 1, [1, 8, 4, 2]),
    (8, 8, [1, 8]),   # the bound holds: the search says so instead of pretending to have found the edge
    (0, None, [1]),   # nothing meets it
])  # fmt: skip
def test_integer_bisection(limit: int, best: int | None, probes: list[int]) -> None:
    measure, asked = step(limit)
    res = bisect_max(measure, 0.9, 1, 8, integer=True)
    assert res.best == best and asked == probes
    assert [p.passed for p in res.probes] == [lv <= limit for lv in probes]


def test_rate_bisection_is_geometric_and_stops_at_the_tolerance() -> None:
    measure, asked = step(3.3)
    res = bisect_max(measure, 0.9, 0.5, 8.0, integer=False, rel_tol=0.1)
    assert asked[:3] == [0.5, 8.0, 2.0] and res.best is not None
    assert res.best <= 3.3 < min(p.level for p in res.probes if not p.passed)
    assert min(p.level for p in res.probes if not p.passed) / res.best <= 1.1
    assert midpoint(2.0, 2.1, False, 0.1) is None and midpoint(4, 5, True, 0.1) is None


def test_probe_budget_and_a_level_with_nothing_completed() -> None:
    measure, asked = step(5)
    res = bisect_max(measure, 0.9, 1, 64, integer=True, max_probes=3)
    assert len(asked) == 3 and res.best == 1 and "probe budget" in res.reason  # 1, 64, 32
    none = bisect_max(lambda lv: None, 0.9, 1, 4, integer=True)
    assert none.best is None and none.probes[0].attainment is None
    with pytest.raises(ValueError):
        bisect_max(measure, 0.9, 0, 4, integer=True)


def test_settings_from_flags() -> None:
    s = settings_from("agents", None, [2, 4, 8], 0.1, 6, None)
    assert (s.lo, s.hi, s.cap) == (2, 8, 8)
    assert (settings_from("agents", None, [6], 0.1, 6, None).lo, settings_from("agents", "3,5", [8], 0.1, 6, 2).hi) == (1, 5)
    for bad in (("rate", None), ("agents", "1.5,4"), ("agents", "4,2"), ("depth", None), ("rate", "x")):
        with pytest.raises(ValueError):
            settings_from(bad[0], bad[1], [8], 0.1, 6, None)


def fake_run_load(ttft_ms_per_agent: float, seen: list[LoadConfig]):
    """run_load stand-in: every task one request whose TTFT grows with the level's load."""

    def run(cfg: LoadConfig, server=None, on_level_start=None, on_record=None, origin=None) -> RunResult:
        seen.append(cfg)
        load = cfg.concurrencies[0] if math.isinf(cfg.rate) else cfg.rate
        ttft = ttft_ms_per_agent * load / 1e3
        n = cfg.num_tasks or 1
        recs = [RequestRecord(f"t{cfg.task_id_offset + i}", "/v1/completions", ok=True, done=True,
                              chunk_times=[ttft, ttft + 0.01], chunk_tokens=[1, 1], completion_tokens=2,
                              prompt_tokens=10, task_id=cfg.task_id_offset + i) for i in range(n)]  # fmt: skip
        res = RunResult(cfg, notes=["transport: tokens"])
        res.levels.append(LevelResult(cfg.concurrencies[0], recs, 1.0))
        return res

    return run


def base_cfg() -> LoadConfig:
    wl = WorkloadConfig(kind="fixed", api="tokens", model="m", input_len=10, output_len=2)
    return LoadConfig(base_url="http://x", workload=wl, concurrencies=[8], slo=SLO(ttft_ms=450.0))


def test_find_max_agents_records_every_probe_beside_the_prediction(monkeypatch, tmp_path: Path) -> None:
    seen: list[LoadConfig] = []
    monkeypatch.setattr(find_max, "run_load", fake_run_load(100.0, seen))  # TTFT 100 ms per agent

    def predict(cfg: LoadConfig) -> dict:
        n = cfg.concurrencies[0]
        return {"slo_attainment": 1.0 if n <= 6 else 0.0, "median_ttft_ms": 75.0 * n}

    fm = FindMax(base_cfg(), Settings("agents", 1, 8), predict=predict, prediction_basis="fake")
    result = fm.run()
    block = fm.block
    assert block["measured"]["best"] == 4 and block["predicted"]["best"] == 6
    assert [r["level"] for r in block["probes"]] == [1, 8, 4, 6, 5]
    assert [c.concurrencies for c in seen] == [[1], [8], [4], [6], [5]] and [c.num_tasks for c in seen] == [1, 8, 4, 6, 5]
    assert block["probes"][2]["attainment"] == 1.0 and block["probes"][2]["predicted_attainment"] == 1.0
    assert block["probes"][2]["median_ttft_ms"] == pytest.approx(400.0)  # measured: 100 ms × 4 agents
    assert block["probes"][2]["predicted_median_ttft_ms"] == 300.0
    assert [lv.concurrency for lv in result.levels] == [1, 4, 5, 6, 8]  # every measured level, in order
    paths = write_search(block, tmp_path)
    rows = [json.loads(line) for line in (tmp_path / "probes.jsonl").read_text().splitlines()]
    assert [r["order"] for r in rows] == [0, 1, 2, 3, 4] and all(p.is_file() for p in paths)


def test_find_max_rate_probes_never_share_task_ids(monkeypatch) -> None:
    seen: list[LoadConfig] = []
    monkeypatch.setattr(find_max, "run_load", fake_run_load(100.0, seen))
    fm = FindMax(base_cfg(), Settings("rate", 1.0, 8.0, rel_tol=0.2, tasks=6, cap=3))
    result = fm.run()
    assert fm.block["measured"]["best"] is not None and 3.7 <= fm.block["measured"]["best"] <= 4.5
    assert all(c.concurrencies == [3] and c.num_tasks == 6 for c in seen)
    ids = [r.task_id for lv in result.levels for r in lv.records]
    assert len(ids) == len(set(ids))
    assert [lv.rate for lv in result.levels] == sorted(c.rate for c in seen)  # each level keeps its rate
    assert fm.block["predicted"] is None


def test_a_partial_probe_stops_the_search(monkeypatch) -> None:
    def run(cfg, *a, **kw) -> RunResult:
        res = RunResult(cfg, partial_reason="server stopped answering during the run (x)")
        res.levels.append(LevelResult(cfg.concurrencies[0], [], 0.5, res.partial_reason))
        return res

    monkeypatch.setattr(find_max, "run_load", run)
    fm = FindMax(base_cfg(), Settings("agents", 1, 8))
    result = fm.run()
    assert result.partial_reason is not None and fm.block["measured"]["best"] is None
    assert "stopped" in fm.block["measured"]["reason"] and len(result.levels) == 1
