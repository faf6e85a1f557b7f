"""Trace replay: pacing on virtual time (exact, no wall clock), then a real replay against the
scripted server in both transports (counts and structure only; no timing asserted)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from harness.env import host_env
from harness.load import report
from harness.load.client import RequestRecord, RequestSpec
from harness.load.replay import Clock, Replay, dispatch, run_trace, trace_block, trace_workload
from harness.load.runner import LoadConfig
from harness.load.trace import parse_trace
from tests.harness.load.scripted_server import MODEL, Script, ThreadServer
from tests.harness.load.virtual_loop import run_virtual


def loop_clock() -> Clock:
    loop = asyncio.get_running_loop()
    return Clock(loop.time)


def test_dispatch_sends_each_item_at_its_time_whatever_the_earlier_ones_take() -> None:
    async def main() -> list[tuple[str, float]]:
        clock, starts = loop_clock(), []

        async def fire(item: str, at: float) -> None:
            starts.append((item, clock.now()))
            await asyncio.sleep(2.0)  # a slow reply never delays the next send

        await dispatch([(0.5, "a"), (0.5, "b"), (1.0, "c"), (3.25, "d")], clock, fire)
        starts.append(("end", clock.now()))
        return starts

    assert run_virtual(main()) == [("a", 0.5), ("b", 0.5), ("c", 1.0), ("d", 3.25), ("end", 5.25)]


def test_a_late_dispatcher_catches_up_on_absolute_deadlines() -> None:
    async def main() -> list[float]:
        loop, sent = asyncio.get_running_loop(), []
        clock = Clock(lambda: loop.time() + 0.3)  # the replay started 0.3 s "late"

        async def fire(item: int, at: float) -> None:
            sent.append(clock.now() - at)

        await dispatch([(0.1, 0), (0.2, 1), (1.0, 2)], clock, fire)
        return sent

    late = run_virtual(main())
    assert late[:2] == pytest.approx([0.2, 0.1]) and late[2] == pytest.approx(0.0)  # back on schedule


def fake_sender(clock: Clock, latency_s: float, fail: set[str] = frozenset()):  # type: ignore[assignment]
    async def send(spec: RequestSpec, at: float) -> RequestRecord:
        rec = RequestRecord(spec.request_id, spec.endpoint, task_id=spec.task_id, turn=spec.turn,
                            input_len=spec.input_len, scheduled_s=at, send_s=clock.now())  # fmt: skip
        await asyncio.sleep(latency_s)
        rec.ok = spec.request_id not in fail
        rec.error_kind = None if rec.ok else "connection"
        rec.output_ids = [60, 61]
        rec.end_s = clock.now()
        return rec

    return send


SESSIONS = parse_trace([json.dumps(s) for s in (
    {"session_id": "a", "start_ms": 2000, "turns": [{"input_length": 5, "output_length": 2},
                                                   {"tool_result_length": 3, "output_length": 2, "think_ms": 800},
                                                   {"input_length": 1, "output_length": 2, "think_ms": 250}]},
    {"session_id": "b", "start_ms": 0, "turns": [{"input_length": 4, "output_length": 2}]},
)])  # fmt: skip


def test_session_turns_wait_for_the_reply_then_think() -> None:
    async def main() -> list[RequestRecord]:
        clock = loop_clock()
        replay = Replay(fake_sender(clock, 1.5))
        await replay.run(SESSIONS, trace_workload(SESSIONS, "tokens", "m", 0), clock)
        return replay.records

    recs = {r.request_id: r for r in run_virtual(main())}
    # turn 0 at start_ms; turn k = reply end (send + 1.5 s) + think_ms
    assert {k: r.send_s for k, r in recs.items()} == pytest.approx(
        {"s1-0": 0.0, "s0-0": 2.0, "s0-1": 2.0 + 1.5 + 0.8, "s0-2": 2.0 + 1.5 + 0.8 + 1.5 + 0.25}
    )
    assert all(r.send_s == pytest.approx(r.scheduled_s) for r in recs.values())
    assert recs["s0-1"].input_len == 5 + 2 + 3 and recs["s0-2"].input_len == 10 + 2 + 1  # history resent


MOON = parse_trace([json.dumps({"timestamp": t, "input_length": 600, "output_length": 2, "hash_ids": [1, 2]})
                    for t in (0, 100, 200, 1000, 1100)])  # fmt: skip


def test_mooncake_replay_peak_in_flight_and_stop_when_the_server_is_gone() -> None:
    async def main(fail: set[str], alive: bool) -> Replay:
        clock = loop_clock()

        async def is_alive() -> bool:
            return alive

        replay = Replay(fake_sender(clock, 0.5, fail), is_alive=is_alive)
        await replay.run(MOON, trace_workload(MOON, "tokens", "m", 0), clock)
        return replay

    ok = run_virtual(main(set(), True))
    assert [r.scheduled_s for r in sorted(ok.records, key=lambda r: r.send_s)] == [0.0, 0.1, 0.2, 1.0, 1.1]
    assert ok.peak == 3 and ok.partial_reason is None  # 0, 0.1, 0.2 overlap for 0.5 s each
    gone = run_virtual(main({"r1"}, False))  # r1 fails at 0.6 s: r3 (1.0 s) and r4 are never sent
    assert sorted(r.request_id for r in gone.records) == ["r0", "r1", "r2"]
    assert gone.partial_reason is not None and "stopped answering" in gone.partial_reason


def test_trace_block_fidelity_and_implied_reuse() -> None:
    recs = [RequestRecord(f"r{i}", "/v1/completions", scheduled_s=i * 0.1, send_s=i * 0.1 + late, ok=True,
                          prompt_tokens=600, cached_tokens=c, input_len=600)
            for i, (late, c) in enumerate([(0.001, 0), (0.002, 512), (0.004, 512), (0.003, 592), (0.010, 0)])]  # fmt: skip
    block = trace_block(MOON, recs)
    lat = block["schedule_lateness_ms"]
    assert lat["p50"] == pytest.approx(3.0) and lat["max"] == pytest.approx(10.0)
    assert block["implied_prompt_tokens"] == 3000 and block["implied_prefix_reusable_tokens"] == 4 * 600
    assert block["implied_prefix_fraction"] == pytest.approx(0.8)
    assert block["server_cached_fraction"] == pytest.approx((512 + 512 + 592) / 3000)
    assert (block["answered"], block["requests"]) == (5, 5)


@pytest.mark.parametrize("api", ["tokens", "chat"])
def test_replay_against_the_scripted_server(tmp_path: Path, api: str) -> None:
    trace = parse_trace([json.dumps({"timestamp": t, "input_length": 40, "output_length": 4, "hash_ids": [7]})
                         for t in (0, 30, 60, 90)], block_size=32)  # fmt: skip
    with ThreadServer(Script(ttft_s=0.02, gap_s=0.005)) as srv:
        cfg = LoadConfig(base_url=srv.url, workload=trace_workload(trace, api, MODEL, 0), concurrencies=[4],
                         timeout_s=10.0, metrics_period_s=0.05)  # fmt: skip
        result = run_trace(cfg, trace)
    assert result.partial_reason is None and len(result.levels) == 1
    assert all(r.ok for r in result.levels[0].records) and result.trace is not None
    assert result.trace["answered"] == 4 and result.trace["implied_prefix_reusable_tokens"] == 3 * 32
    assert result.trace["server_cached_tokens"] is not None  # the scripted server reports cached_tokens
    # the scripted server has no /metrics: recorded once as unavailable, the replay went on
    assert result.server_metrics_block is not None and result.server_metrics_block["status"] == "unavailable"
    summary = report.write_run(result, tmp_path, {"run_id": "t", "argv": ["x"], "model_name": MODEL,
                                                  "env": host_env({})})  # fmt: skip
    assert summary["run"]["trace"]["format"] == "mooncake" and summary["run"]["workload"]["kind"] == "trace"
    assert summary["levels"][0]["completed"] == 4 and "task_slo_attainment" not in summary["levels"][0]
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == 1 and json.loads(lines[0])["available"] is False
    assert (tmp_path / "plots" / "timeline.png").is_file()


def test_session_replay_against_the_scripted_server(tmp_path: Path) -> None:
    with ThreadServer(Script(ttft_s=0.02, gap_s=0.005)) as srv:
        cfg = LoadConfig(base_url=srv.url, workload=trace_workload(SESSIONS, "tokens", MODEL, 0),
                         concurrencies=[2], timeout_s=10.0, metrics_period_s=0)  # fmt: skip
        fast = parse_trace([json.dumps(s | {"start_ms": s["start_ms"] / 20}) for s in (
            {"session_id": "a", "start_ms": 40, "turns": [{"input_length": 5, "output_length": 2},
                                                          {"tool_result_length": 3, "output_length": 2}]},
            {"session_id": "b", "start_ms": 0, "turns": [{"input_length": 4, "output_length": 2}]})])  # fmt: skip
        result = run_trace(cfg, fast)
    summary = report.build_summary(result, {"run_id": "t", "argv": ["x"], "model_name": MODEL})
    lv = summary["levels"][0]
    assert lv["completed"] == 3 and lv["tasks"] == 2 and lv["tasks_completed"] == 2  # per-session turn counts
    assert summary["run"]["server_metrics"]["status"] == "off"
    assert summary["run"]["trace"]["sessions"] == 2
