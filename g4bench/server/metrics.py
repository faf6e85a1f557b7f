"""Prometheus metrics for one app, in the app's own `CollectorRegistry` (two apps in one process,
as in tests, never collide).

Data flow: the scheduler calls `on_step` after every decode step, `on_spec` after every speculative
round (servers with --spec-k: the g4bench_spec_* counters) and `on_finish` for every request
(both in the engine thread; prometheus-client is thread-safe); the app calls `count_request` once per
HTTP request with its outcome; gauges for active slots, waiting requests and readiness read the
scheduler when /metrics is scraped.
"""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from g4bench.engine.block_cache import BlockCache
from g4bench.engine.scheduler import RequestResult, Scheduler

LATENCY_BUCKETS_S = (0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 60.0)
# what a server with --spec-k exports, as scraped (counters carry prometheus-client's _total)
SPEC_SERIES = ("g4bench_spec_verify_rows_total", "g4bench_spec_draft_tokens_total",
               "g4bench_spec_accepted_tokens_total", "g4bench_spec_k")  # fmt: skip
TPOT_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.1, 0.2, 0.5, 1.0, 2.5)


class ServerMetrics:
    """All g4bench_* series of one server."""

    content_type = CONTENT_TYPE_LATEST

    def __init__(self, scheduler: Scheduler, model_name: str) -> None:
        r = self.registry = CollectorRegistry()
        self.requests = Counter(
            "g4bench_requests", "HTTP requests by endpoint and outcome", ["endpoint", "status"], registry=r
        )
        self.prompt_tokens = Counter(
            "g4bench_prompt_tokens",
            "Prompt tokens, computed by prefill or reused from a slot",
            ["kind"],
            registry=r,
        )
        self.generated_tokens = Counter("g4bench_generation_tokens", "Tokens generated", registry=r)
        self.decode_steps = Counter("g4bench_decode_steps", "Batched decode steps run", registry=r)
        self.ttft = Histogram(
            "g4bench_time_to_first_token_seconds",
            "Submission to first token",
            buckets=LATENCY_BUCKETS_S,
            registry=r,
        )
        self.tpot = Histogram(
            "g4bench_time_per_output_token_seconds",
            "Mean gap between output tokens after the first, per request",
            buckets=TPOT_BUCKETS_S,
            registry=r,
        )
        self.queue = Histogram(
            "g4bench_queue_time_seconds",
            "Submission to admission into a slot",
            buckets=LATENCY_BUCKETS_S,
            registry=r,
        )
        slots = scheduler.max_slots
        self.occupancy = Histogram(
            "g4bench_batch_occupancy",
            "Slots decoding per decode step",
            buckets=tuple(float(i) for i in range(1, slots + 1)),
            registry=r,
        )
        Gauge("g4bench_max_slots", "Slots the engine holds", registry=r).set(slots)
        Gauge("g4bench_active_slots", "Slots owned by a running request", registry=r).set_function(
            lambda: scheduler.num_active
        )
        Gauge("g4bench_waiting_requests", "Requests waiting for a slot", registry=r).set_function(
            lambda: scheduler.num_waiting
        )
        Gauge("g4bench_ready", "1 once warm-up is done and the engine loop runs", registry=r).set_function(
            lambda: float(scheduler.ready)
        )
        if getattr(scheduler, "paged", False):
            _block_cache_gauges(scheduler, r)
        self.spec: dict[str, Counter] = {}
        spec = getattr(scheduler, "spec", None)
        if spec is not None:
            # vLLM's spec_decode_num_drafts / num_draft_tokens / num_accepted_tokens; mean acceptance
            # length = 1 + accepted ÷ rows (tokens a request gains per verify call)
            self.spec = {
                "rows": Counter("g4bench_spec_verify_rows", "Request rows verified (one per request per round)", registry=r),
                "drafted": Counter("g4bench_spec_draft_tokens", "Draft tokens verified", registry=r),
                "accepted": Counter("g4bench_spec_accepted_tokens", "Draft tokens the target kept", registry=r),
            }
            Gauge("g4bench_spec_k", "Drafts per verify row", registry=r).set(spec.k)
        info = Gauge("g4bench_model_info", "Served model", ["model"], registry=r)
        info.labels(model=model_name).set(1)
        for kind in ("computed", "reused"):
            self.prompt_tokens.labels(kind=kind)

    # SchedulerObserver (engine thread)
    def on_step(self, active: int, slots: int) -> None:
        self.decode_steps.inc()
        self.occupancy.observe(active)

    def on_spec(self, drafted: int, accepted: int, rows: int) -> None:
        self.spec["rows"].inc(rows)
        self.spec["drafted"].inc(drafted)
        self.spec["accepted"].inc(accepted)

    def on_finish(self, result: RequestResult) -> None:
        self.prompt_tokens.labels(kind="computed").inc(result.computed_tokens)
        self.prompt_tokens.labels(kind="reused").inc(result.cached_tokens)
        self.generated_tokens.inc(len(result.output_ids))
        if result.queue_s is not None:
            self.queue.observe(result.queue_s)
        if result.ttft_s is not None:
            self.ttft.observe(result.ttft_s)
        times = result.token_times_s
        if len(times) > 1:
            self.tpot.observe((times[-1] - times[0]) / (len(times) - 1))

    # app (event loop)
    def count_request(self, endpoint: str, status: str) -> None:
        self.requests.labels(endpoint=endpoint, status=status).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)


def _block_cache_gauges(scheduler: Scheduler, registry: CollectorRegistry) -> None:
    """Paged engines: prefix-cache hit rate and block pool occupancy, read at scrape time. The
    scheduler's thread updates the counts; a scrape reads plain ints (a slightly stale view at worst)."""
    cache = scheduler.table
    assert isinstance(cache, BlockCache)  # called for paged schedulers only
    Gauge(
        "g4bench_prefix_cache_hit_rate",
        "Prompt tokens reused from cached blocks / prompt tokens",
        registry=registry,
    ).set_function(lambda: cache.stats()["hit_rate"])
    blocks = Gauge(
        "g4bench_kv_blocks",
        "KV pool blocks by group and state (used: referenced by a running request; cached: held by the index only)",
        ["group", "state"],
        registry=registry,
    )

    def reader(key: str) -> Callable[[], float]:
        return lambda: cache.stats()[key]

    for group in ("full", "window") if cache.win is not None else ("full",):
        for state in ("used", "cached", "free"):
            blocks.labels(group=group, state=state).set_function(reader(f"{group}_blocks_{state}"))
