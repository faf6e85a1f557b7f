"""Metric arithmetic on hand-made records: exact values, no server."""

from __future__ import annotations

import math

import numpy as np
import pytest

from harness.load import checks, metrics
from harness.load.client import RequestRecord, _StreamState
from harness.load.slo import SLO, load_slo
from harness.load.workloads import WorkloadConfig, arrival_times, make_tasks


def rec(rid: str, times: list[float], tokens: list[int], usage: int | None = None, **kw) -> RequestRecord:
    r = RequestRecord(rid, "/v1/completions", chunk_times=times, chunk_tokens=tokens, ok=True, **kw)
    r.completion_tokens = usage if usage is not None else sum(tokens)
    r.end_s = r.send_s + times[-1]
    return r


def test_request_metrics_exact() -> None:
    r = rec("a", [0.1, 0.12, 0.14, 0.16], [1, 2, 1, 1])  # 5 tokens in 4 chunks
    assert metrics.ttft_ms(r) == pytest.approx(100.0)
    assert metrics.e2el_ms(r) == pytest.approx(160.0)
    assert metrics.tpot_ms(r) == pytest.approx(60.0 / 4)  # (E2E - TTFT)/(N - 1), N from usage
    assert metrics.itls_ms(r) == pytest.approx([20.0, 20.0, 20.0])  # one sample per chunk
    one = rec("b", [0.05], [1])
    assert metrics.tpot_ms(one) is None


def test_summary_goodput_attainment_and_failures() -> None:
    good = [rec(f"g{i}", [0.1, 0.2], [1, 1]) for i in range(6)]
    slow = [rec(f"s{i}", [0.5, 0.6], [1, 1]) for i in range(3)]
    failed = RequestRecord("f", "/v1/completions", ok=False, error="boom", error_kind="connection")
    s = metrics.summarize_requests(good + slow + [failed], duration_s=2.0, slo=SLO(ttft_ms=200.0))
    assert (s["completed"], s["failed"], s["good_requests"]) == (9, 1, 6)
    assert s["request_goodput"] == pytest.approx(3.0)
    assert s["request_throughput"] == pytest.approx(4.5)
    assert s["slo_attainment"] == pytest.approx(0.6)  # failures count against attainment
    assert s["output_throughput"] == pytest.approx(9.0)
    assert s["median_ttft_ms"] == pytest.approx(100.0)
    assert s["p90_ttft_ms"] == pytest.approx(float(np.percentile([100] * 6 + [500] * 3, 90)))
    assert s["failed_by_kind"] == {"connection": 1}
    assert s["few_samples"]["ttft"] == 9 and s["few_samples"]["client_queue"] == 10
    assert s["median_ttft_ms_ci95_lo"] <= s["median_ttft_ms"] <= s["median_ttft_ms_ci95_hi"]


def test_few_samples_one_line_per_level() -> None:
    line = metrics.few_samples_line({"ttft": 8, "tpot": 8, "itl": 56, "task_completion": 2, "e2el": 100})
    assert line == (
        "few samples: p90/p99 of ttft, tpot (8 requests), task_completion (2 tasks); p99 of itl (56 gaps) "
        "(p90 needs ≥ 10, p99 needs ≥ 100: read them as maxima)"
    )
    assert metrics.few_samples_line({"ttft": 100}) is None
    assert metrics.few_samples_line({"ttft": 99}) == (
        "few samples: p99 of ttft (99 requests) (p90 needs ≥ 10, p99 needs ≥ 100: read them as maxima)"
    )


def test_prefix_reuse_ratios_exact() -> None:
    """Two 3-turn tasks; each turn adds a reply of 2 and a tool result of 4 tokens; the server
    reuses everything but the reply's last token (as ours does)."""
    rs = []
    for task in range(2):
        ids = [10 + task] * 6
        for turn in range(3):
            r = rec(f"t{task}-{turn}", [0.1 * (turn + 1), 0.5], [1, 1], task_id=task, turn=turn)
            r.prompt_ids, r.output_ids = list(ids), [50 + turn, 60 + turn]
            r.prompt_tokens = len(ids)
            r.cached_tokens = 0 if turn == 0 else len(ids) - 4 - 1
            rs.append(r)
            ids = ids + r.output_ids + [70 + turn] * 4
    out = metrics.prefix_reuse(rs, metrics.by_turn(rs))
    # prompts 6, 12, 18 per task; new 6, 4, 4; computed 6, 5, 5
    got = (out["prompt_tokens_total"], out["new_prompt_tokens"], out["prompt_tokens_computed"])
    assert got == (72, 28, 32)
    assert out["prompt_tokens_reused"] == 40
    assert out["computed_over_new_prompt_tokens"] == pytest.approx(32 / 28)
    assert out["ttft_last_turn_over_first"] == pytest.approx(3.0) and out["ttft_last_turn"] == 2
    # Without ids the usage counts give the same new-token count.
    for r in rs:
        r.prompt_ids = r.output_ids = None
    assert metrics.prefix_reuse(rs, [])["new_prompt_tokens"] == 28
    # Read as a shared-prefix run whose first 4 tokens are common: they count once, not per task.
    assert metrics.prefix_reuse(rs, [], shared_prefix=4)["new_prompt_tokens"] == 28 - 4


def test_decode_window_counts_only_all_streams_decoding() -> None:
    from harness.load.decode_ratio import decode_window

    # Stream a: tokens at 1.0 (first) then every 0.1 s to 2.0; stream b: first at 1.45, then to 2.5.
    a = rec("a", [1.0 + 0.1 * i for i in range(11)], [1] * 11)
    b = rec("b", [1.45 + 0.1 * i for i in range(11)], [1] * 11)
    out = decode_window([a, b], conc=2)
    # Window (1.45, 2.0]: a's tokens at 1.5..2.0 (6) and b's at 1.55..1.95 (5); b's first is prefill.
    assert out["decode_windows"] == 1 and out["decode_window_s"] == pytest.approx(0.55)
    assert out["decode_window_tokens"] == 11
    assert out["decode_tok_per_s_all_streams"] == pytest.approx(11 / 0.55)
    assert decode_window([a], conc=2)["decode_tok_per_s_all_streams"] is None


def test_tasks_turns_fit_and_capacity() -> None:
    rs = []
    for task in range(2):
        for turn in range(3):
            r = rec(f"t{task}-{turn}", [0.1 + 0.1 * turn, 0.3 + 0.1 * turn], [1, 1], task_id=task, turn=turn)
            r.send_s = turn * 1.0
            r.end_s = r.send_s + r.chunk_times[-1]
            r.prompt_tokens, r.cached_tokens = 100 * (turn + 1), 0 if turn == 0 else 100 * turn - 10 * task
            rs.append(r)
    slo = SLO(ttft_ms=301.0, task_e2e_ms=2501.0)
    tasks = metrics.task_table(rs, 3, slo)
    assert [t["completion_ms"] for t in tasks] == pytest.approx([2500.0, 2500.0])
    assert all(t["good"] for t in tasks)
    assert not any(t["good"] for t in metrics.task_table(rs, 3, SLO(ttft_ms=301.0, task_e2e_ms=2499.0)))
    assert not any(t["good"] for t in metrics.task_table(rs, 3, SLO(ttft_ms=299.0)))
    assert metrics.summarize_tasks(tasks, 5.0)["task_goodput"] == pytest.approx(0.4)
    rows = metrics.by_turn(rs)
    assert [r["median_ttft_ms"] for r in rows] == pytest.approx([100.0, 200.0, 300.0])
    # TTFT = 100 ms + 1 ms per uncached token for task 0 (uncached 100 each turn) is flat in x, so use both
    fit = metrics.ttft_vs_uncached(rs)
    assert fit["n"] == 6 and fit["ms_per_uncached_token"] is not None
    assert metrics.max_concurrency_at_attainment([(2, 1.0), (4, 0.95), (8, 0.5)]) == 4
    assert metrics.max_concurrency_at_attainment([(2, 0.5), (4, 0.95)]) is None


def test_ttft_fit_exact_line() -> None:
    rs = []
    for i, u in enumerate([10, 50, 90, 130]):
        r = rec(f"r{i}", [(5.0 + 0.5 * u) / 1e3, 0.5], [1, 1])
        r.prompt_tokens, r.cached_tokens = u + 200, 200
        rs.append(r)
    fit = metrics.ttft_vs_uncached(rs)
    assert fit["ms_per_uncached_token"] == pytest.approx(0.5)
    assert fit["intercept_ms"] == pytest.approx(5.0)
    assert fit["r2"] == pytest.approx(1.0)


def test_prefix_check_catches_non_prefix_and_labels_cache() -> None:
    a0 = rec("a0", [0.1], [2], task_id=0, turn=0, prompt_ids=[1, 2, 3], output_ids=[7, 8])
    a1 = rec("a1", [0.1], [2], task_id=0, turn=1, prompt_ids=[1, 2, 3, 7, 8, 9], output_ids=[5, 5])
    a2 = rec("a2", [0.1], [1], task_id=0, turn=2, prompt_ids=[1, 2, 3, 7, 9, 9, 5, 5, 4], output_ids=[1])
    a0.prompt_tokens, a1.prompt_tokens, a2.prompt_tokens = 3, 6, 9
    a1.cached_tokens, a2.cached_tokens = 5, 2
    block, states = checks.run_checks([a0, a1, a2])
    px = block["prefix"]
    assert (px["pairs"], px["exact"], px["not_prefix"]) == (2, 2, 1)
    assert "a2: diverges from turn 1 at token 4" in px["examples"][0]
    assert states == {"a1": "warm", "a2": "partial"}
    assert checks.check_warnings(block)


def test_output_token_check() -> None:
    exact = rec("x", [0.1, 0.2], [1, 1], usage=3)
    exact.chunk_tokens_source = "token_ids"
    assumed = rec("y", [0.1, 0.2], [1, 1], usage=4)
    ot = checks.check_output_tokens([exact, assumed])
    assert (ot["mismatches"], ot["multi_token_streams"]) == (1, 1)
    assert ot["chunks_per_token"] == pytest.approx(4 / 7)


def test_stream_state_skips_role_and_usage_chunks() -> None:
    r = RequestRecord("c", "/v1/chat/completions")
    st = _StreamState(r, t_send=10.0, t0=9.0)
    st.event('{"choices":[{"delta":{"role":"assistant","content":""}}]}', 10.01)
    st.event('{"choices":[{"delta":{"content":"hi"},"token_ids":[5,6]}]}', 10.1)
    st.event('{"choices":[{"delta":{"content":"!"},"token_ids":[7]}]}', 10.15)
    st.event('{"choices":[{"delta":{},"finish_reason":"length","token_ids":[]}]}', 10.16)
    st.event(
        '{"choices":[],"usage":{"prompt_tokens":4,"completion_tokens":3,"prompt_tokens_details":{"cached_tokens":2}}}',
        10.2,
    )
    st.event("[DONE]", 10.21)
    st.finish()
    assert r.chunk_times == pytest.approx([0.1, 0.15])
    assert r.chunk_tokens == [2, 1] and r.chunk_tokens_source == "token_ids"
    assert (r.text, r.output_ids, r.finish_reason) == ("hi!", [5, 6, 7], "length")
    assert (r.prompt_tokens, r.completion_tokens, r.cached_tokens, r.done) == (4, 3, 2, True)
    assert r.end_s == pytest.approx(1.15)


def test_workload_growth_and_arrivals() -> None:
    cfg = WorkloadConfig(
        kind="agent", api="tokens", input_len=10, output_len=3, turns=3, tool_result_tokens=5
    )
    task = make_tasks(cfg, 1)[0]
    s0 = task.next_spec()
    assert len(s0.body["prompt"]) == 10 and s0.body["ignore_eos"]
    r = RequestRecord("x", s0.endpoint, ok=True, output_ids=[9, 9, 9])
    assert task.observe(r) is None
    s1 = task.next_spec()
    assert s1.body["prompt"][:13] == s0.body["prompt"] + [9, 9, 9] and len(s1.body["prompt"]) == 18
    assert cfg.prompt_len(1) == 18 and cfg.max_context == 10 + 2 * 8 + 3
    t = arrival_times(20000, rate=4.0, burstiness=0.5, seed=1)
    gaps = np.diff(t)
    assert gaps.mean() == pytest.approx(0.25, rel=0.05)
    assert gaps.std() / gaps.mean() == pytest.approx(math.sqrt(1 / 0.5), rel=0.05)  # gamma CV = 1/sqrt(B)
    assert (arrival_times(3, math.inf) == 0).all()


def test_slo_file(tmp_path) -> None:
    slo = load_slo("configs/slo/agent.toml")
    assert slo.ttft_ms and slo.task_e2e_ms and slo.attainment_target == 0.9
    bad = tmp_path / "bad.toml"
    bad.write_text("[turn]\nttft = 3\n")
    with pytest.raises(ValueError, match="turn.ttft"):
        load_slo(bad)
