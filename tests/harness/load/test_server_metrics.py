"""/metrics parsing for our names and vLLM's, interval rates, and a server without /metrics."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from harness.load.server_metrics import MetricsScraper, derive, parse_metrics
from tests.engine.test_block_cache import make  # noqa: F401 - the paged scheduler fixture

VLLM = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="google/gemma-4-E2B-it"} 3.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="google/gemma-4-E2B-it"} 2.0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="google/gemma-4-E2B-it"} 0.25
# TYPE vllm:prefix_cache_queries counter
vllm:prefix_cache_queries_total{engine="0",model_name="google/gemma-4-E2B-it"} 1000.0
# TYPE vllm:prefix_cache_hits counter
vllm:prefix_cache_hits_total{engine="0",model_name="google/gemma-4-E2B-it"} 400.0
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{le="0.1",model_name="m"} 4.0
vllm:time_to_first_token_seconds_bucket{le="+Inf",model_name="m"} 5.0
vllm:time_to_first_token_seconds_count{model_name="m"} 5.0
vllm:time_to_first_token_seconds_sum{model_name="m"} 0.7
"""

VLLM_V0 = """\
vllm:num_requests_running{model_name="m"} 1.0
vllm:num_requests_waiting{model_name="m"} 0.0
vllm:gpu_cache_usage_perc{model_name="m"} 0.5
vllm:gpu_prefix_cache_queries_total{model_name="m"} 10.0
vllm:gpu_prefix_cache_hits_total{model_name="m"} 5.0
"""


def test_vllm_names_v1_and_v0() -> None:
    s = parse_metrics(VLLM)
    assert (s.source, s.running, s.waiting, s.kv_usage) == ("vllm", 3.0, 2.0, 0.25)
    assert (s.prefix_hits, s.prefix_queries, s.batch_steps) == (400.0, 1000.0, None)
    old = parse_metrics(VLLM_V0)
    assert (old.kv_usage, old.prefix_hits, old.prefix_queries) == (0.5, 5.0, 10.0)
    later = parse_metrics(VLLM.replace("1000.0", "1500.0").replace("400.0", "800.0"))
    row = derive(2.0, later, s)
    assert row["prefix_hit_rate"] == pytest.approx(400 / 500)  # over the interval, not since start
    assert row["batch_size"] == 3.0 and "running" in row["batch_size_basis"]
    assert derive(1.0, s, None)["prefix_hit_rate"] is None


def test_our_names_from_the_real_server_metrics(make) -> None:  # noqa: F811 - the block-cache fixture
    from g4bench.server.metrics import ServerMetrics
    from tests.engine.test_block_cache import assert_all_released, run
    from tests.engine.test_scheduler import prompt_of

    _, sched = make(max_slots=2, window=8)
    metrics = ServerMetrics(sched, "fake")
    sched.observers.append(metrics)  # as the app wires it
    before = parse_metrics(metrics.render().decode())
    system = prompt_of(5, 40)
    run(sched, system + [9, 9])
    run(sched, system + [8, 8, 8])
    assert_all_released(sched)
    after = parse_metrics(metrics.render().decode())
    assert after.source == "g4bench" and (after.running, after.waiting) == (0.0, 0.0)
    assert after.kv_usage == 0.0  # every block is free or only cached once requests end
    assert after.prefix_queries == 42 + 43 and after.prefix_hits == 40  # prompt tokens, reused vs all
    row = derive(1.0, after, before)
    assert row["prefix_hit_rate"] == pytest.approx(40 / 85)
    assert after.batch_steps is not None and after.batch_steps > 0
    assert row["batch_size"] == pytest.approx(after.batch_sum / after.batch_steps)


def test_unknown_or_malformed_text() -> None:
    assert not parse_metrics("# nothing here\nprocess_cpu_seconds_total 3.0\n").known
    with pytest.raises(ValueError):
        parse_metrics("this is { not prometheus\n")


def scrape(handler, period_s: float = 0.01, rounds: int = 3) -> MetricsScraper:
    async def main() -> MetricsScraper:
        transport = httpx.MockTransport(handler)
        async with httpx.AsyncClient(transport=transport) as client:
            t = iter(range(100))
            scraper = MetricsScraper(client, "http://server", period_s, lambda: float(next(t)))
            for _ in range(rounds):
                if not await scraper.scrape_once():
                    break
            return scraper

    return asyncio.run(main())


def test_a_server_without_metrics_is_recorded_once_as_unavailable() -> None:
    s = scrape(lambda req: httpx.Response(404, text="not found"))
    assert s.status == "unavailable" and s.reason == "/metrics answered HTTP 404" and s.rows == []
    other = scrape(lambda req: httpx.Response(200, text="up 1\n"))
    assert other.status == "unavailable" and "none of the g4bench_* or vllm:*" in (other.reason or "")


def test_scraper_rows_and_later_failures_counted() -> None:
    answers = iter([httpx.Response(200, text=VLLM), httpx.Response(500), httpx.Response(200, text=VLLM)])
    s = scrape(lambda req: next(answers))
    assert s.status == "ok" and len(s.rows) == 2 and s.errors == 1
    assert [r["t_s"] for r in s.rows] == [0.0, 2.0] and s.block()["source"] == "vllm"


def test_a_level_reads_speculation_from_the_counters_change() -> None:
    from harness.load.server_metrics import speculation_block

    def text(rows: int, drafted: int, accepted: int) -> str:
        return (
            "# TYPE g4bench_active_slots gauge\ng4bench_active_slots 1.0\n"
            f"# TYPE g4bench_spec_verify_rows counter\ng4bench_spec_verify_rows_total {rows}\n"
            f"# TYPE g4bench_spec_draft_tokens counter\ng4bench_spec_draft_tokens_total {drafted}\n"
            f"# TYPE g4bench_spec_accepted_tokens counter\ng4bench_spec_accepted_tokens_total {accepted}\n"
        )

    block = speculation_block(parse_metrics(text(10, 30, 20)), parse_metrics(text(50, 150, 80)))
    assert block is not None
    assert block["verify_rows"] == 40 and block["draft_tokens"] == 120 and block["accepted_tokens"] == 60
    assert block["acceptance_rate"] == pytest.approx(0.5)
    assert block["mean_acceptance_length"] == pytest.approx(2.5)  # 1 + 60 / 40
    plain = parse_metrics("# TYPE g4bench_active_slots gauge\ng4bench_active_slots 1.0\n")
    assert speculation_block(plain, plain) is None  # a server without speculation
    assert speculation_block(None, parse_metrics(text(1, 3, 3))) is None  # a failed scrape
