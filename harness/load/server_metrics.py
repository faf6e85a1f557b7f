"""The server's own view during a serve-load run: scrape GET /metrics at a fixed period.

Data flow: `MetricsScraper` runs beside the load on the same event loop; every `period_s` (absolute
deadlines, so the period does not drift) it fetches /metrics, `parse_metrics` reads the Prometheus
text (prometheus-client's parser) into one `Snapshot` of the names below, and `derive` turns two
consecutive snapshots into a row of metrics.jsonl: time (s from the run's start), requests running
and waiting, KV usage, the prefix-cache hit rate over the interval, and the batch size.

| field          | g4bench serve                                   | vLLM                                                      |
|----------------|-------------------------------------------------|-----------------------------------------------------------|
| running        | g4bench_active_slots                            | vllm:num_requests_running                                 |
| waiting        | g4bench_waiting_requests                        | vllm:num_requests_waiting                                 |
| kv_usage (0–1) | g4bench_kv_blocks{state=used} ÷ all states      | vllm:kv_cache_usage_perc, or vllm:gpu_cache_usage_perc    |
| prefix hits    | g4bench_prompt_tokens_total{kind=reused}        | vllm:prefix_cache_hits_total (or vllm:gpu_prefix_cache_…) |
| prefix queries | g4bench_prompt_tokens_total{kind=reused+computed} | vllm:prefix_cache_queries_total (or …gpu_prefix_cache_…) |
| batch size     | Δ g4bench_batch_occupancy sum ÷ Δ count (mean decoding slots per step) | running (vLLM exports no per-step batch) |
| speculation    | Δ g4bench_spec_{verify_rows,draft_tokens,accepted_tokens}_total over a level (`speculation_block`) | — |

vLLM's `*_perc` gauges are fractions (0–1) despite the name. Series with several label sets (vLLM's
`model_name`, `engine`) are summed. Our prompt-token counters move when a request finishes, so our
interval hit rate trails the prefill that earned it by that request's decode time.

A server without /metrics (an HTTP error, no answer, or text that names none of these series) is
recorded once as unavailable and the run goes on; a scrape that fails later is counted, not fatal.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

RUNNING = ("g4bench_active_slots", "vllm:num_requests_running")
WAITING = ("g4bench_waiting_requests", "vllm:num_requests_waiting")
KV_USAGE = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")
HITS = ("vllm:prefix_cache_hits_total", "vllm:gpu_prefix_cache_hits_total")
QUERIES = ("vllm:prefix_cache_queries_total", "vllm:gpu_prefix_cache_queries_total")


@dataclass
class Snapshot:
    source: str  # "g4bench" | "vllm" | "other"
    running: float | None = None
    waiting: float | None = None
    kv_usage: float | None = None
    prefix_hits: float | None = None
    prefix_queries: float | None = None
    batch_sum: float | None = None  # ours: Σ decoding slots over decode steps
    batch_steps: float | None = None  # ours: decode steps
    spec_rows: float | None = None  # ours with --spec-k: request rows verified
    spec_drafted: float | None = None  # … draft tokens verified
    spec_accepted: float | None = None  # … draft tokens kept

    @property
    def known(self) -> bool:
        return any(v is not None for v in (self.running, self.waiting, self.kv_usage, self.prefix_queries))


def _samples(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out.setdefault(s.name, []).append((dict(s.labels), float(s.value)))
    return out


def parse_metrics(text: str) -> Snapshot:
    """One snapshot from Prometheus exposition text (raises ValueError on malformed text)."""
    by = _samples(text)

    def total(names: tuple[str, ...], where: Callable[[dict[str, str]], bool] = lambda _: True) -> float | None:
        for name in names:
            if name in by:
                return sum(v for labels, v in by[name] if where(labels))
        return None

    ours = any(n.startswith("g4bench_") for n in by)
    snap = Snapshot("g4bench" if ours else "vllm" if any(n.startswith("vllm:") for n in by) else "other")
    snap.running, snap.waiting = total(RUNNING), total(WAITING)
    if ours:
        blocks = by.get("g4bench_kv_blocks", [])
        used = sum(v for lb, v in blocks if lb.get("state") == "used")
        pool = sum(v for _, v in blocks)
        snap.kv_usage = used / pool if pool else None
        snap.prefix_hits = total(("g4bench_prompt_tokens_total",), lambda lb: lb.get("kind") == "reused")
        snap.prefix_queries = total(("g4bench_prompt_tokens_total",))
        snap.batch_sum = total(("g4bench_batch_occupancy_sum",))
        snap.batch_steps = total(("g4bench_batch_occupancy_count",))
        snap.spec_rows = total(("g4bench_spec_verify_rows_total",))
        snap.spec_drafted = total(("g4bench_spec_draft_tokens_total",))
        snap.spec_accepted = total(("g4bench_spec_accepted_tokens_total",))
    else:
        snap.kv_usage, snap.prefix_hits, snap.prefix_queries = total(KV_USAGE), total(HITS), total(QUERIES)
    return snap


def derive(t_s: float, cur: Snapshot, prev: Snapshot | None) -> dict[str, Any]:
    """One metrics.jsonl row: the snapshot's levels and the rates over the interval since `prev`."""

    def delta(a: float | None, b: float | None) -> float | None:
        return a - b if a is not None and b is not None else None

    row: dict[str, Any] = {"t_s": t_s, "source": cur.source, "running": cur.running, "waiting": cur.waiting,
                           "kv_usage": cur.kv_usage, "prefix_hits": cur.prefix_hits,
                           "prefix_queries": cur.prefix_queries}  # fmt: skip
    hits = delta(cur.prefix_hits, prev.prefix_hits) if prev else None
    queries = delta(cur.prefix_queries, prev.prefix_queries) if prev else None
    row["prefix_hit_rate"] = hits / queries if hits is not None and queries else None
    steps = delta(cur.batch_steps, prev.batch_steps) if prev else None
    slots = delta(cur.batch_sum, prev.batch_sum) if prev else None
    if cur.batch_steps is not None:
        row["batch_size"] = slots / steps if slots is not None and steps else None
        row["batch_size_basis"] = "mean decoding slots per step over the interval"
    else:
        row["batch_size"] = cur.running
        row["batch_size_basis"] = "requests running (the server exports no per-step batch)"
    return row


async def fetch_snapshot(
    client: httpx.AsyncClient, base_url: str, headers: dict[str, str] | None
) -> Snapshot | None:
    """One /metrics snapshot, or None when the server does not answer with readable metrics."""
    try:
        r = await client.get(base_url + "/metrics", headers=headers, timeout=5.0)
        return parse_metrics(r.text) if r.status_code == 200 else None
    except (httpx.HTTPError, ValueError):
        return None


def speculation_block(before: Snapshot | None, after: Snapshot | None) -> dict[str, Any] | None:
    """A level's speculative decoding from the counters' change over it (None: the server exports
    none): rows verified, drafts, kept drafts, the acceptance rate (kept ÷ drafted) and the mean
    acceptance length (tokens a request gains per verify call: 1 + kept ÷ rows; vLLM's meaning)."""
    if before is None or after is None or after.spec_rows is None or before.spec_rows is None:
        return None
    rows = after.spec_rows - before.spec_rows
    drafted = (after.spec_drafted or 0.0) - (before.spec_drafted or 0.0)
    accepted = (after.spec_accepted or 0.0) - (before.spec_accepted or 0.0)
    return {"verify_rows": rows, "draft_tokens": drafted, "accepted_tokens": accepted,
            "acceptance_rate": accepted / drafted if drafted else None,
            "mean_acceptance_length": 1 + accepted / rows if rows else None}  # fmt: skip


@dataclass
class MetricsScraper:
    """Scrape `base_url`/metrics every `period_s` while the load runs (`async with`); `now()` is the
    run's clock (s from its start). `period_s` ≤ 0 turns scraping off."""

    client: httpx.AsyncClient
    base_url: str
    period_s: float
    now: Callable[[], float]
    headers: dict[str, str] | None = None
    rows: list[dict[str, Any]] = field(default_factory=list)
    status: str = "off"  # "off" | "ok" | "unavailable"
    reason: str | None = None
    errors: int = 0
    _prev: Snapshot | None = None
    _task: asyncio.Task | None = None

    async def __aenter__(self) -> MetricsScraper:
        if self.period_s > 0:
            self.status = "pending"
            self._task = asyncio.create_task(self._loop())
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            if self.status == "pending":
                self.status, self.reason = "unavailable", "the run ended before the first scrape answered"

    async def _loop(self) -> None:
        start = time.perf_counter()
        k = 0
        while await self.scrape_once():
            k += 1
            await asyncio.sleep(max(0.0, start + k * self.period_s - time.perf_counter()))

    def _unavailable(self, reason: str) -> bool:
        self.status, self.reason = "unavailable", reason
        return False

    async def scrape_once(self) -> bool:
        """Fetch and record one row; False once /metrics is known to be unavailable (stop scraping)."""
        t = self.now()
        try:
            r = await self.client.get(self.base_url + "/metrics", headers=self.headers,
                                      timeout=max(2.0, self.period_s))  # fmt: skip
        except httpx.HTTPError as e:
            if self.status != "ok":
                return self._unavailable(f"no answer from /metrics ({type(e).__name__})")
            self.errors += 1
            return True
        if r.status_code != 200:
            if self.status != "ok":
                return self._unavailable(f"/metrics answered HTTP {r.status_code}")
            self.errors += 1
            return True
        try:
            snap = parse_metrics(r.text)
        except ValueError as e:
            if self.status != "ok":
                return self._unavailable(f"/metrics is not Prometheus text ({e})")
            self.errors += 1
            return True
        if not snap.known:
            return self._unavailable("/metrics names none of the g4bench_* or vllm:* series read here")
        self.status = "ok"
        self.rows.append(derive(t, snap, self._prev))
        self._prev = snap
        return True

    def block(self) -> dict[str, Any]:
        """The summary's `server_metrics` entry."""
        return {"status": self.status, "reason": self.reason, "period_s": self.period_s, "samples": len(self.rows),
                "scrape_errors": self.errors, "source": self.rows[0]["source"] if self.rows else None}  # fmt: skip
