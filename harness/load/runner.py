"""Orchestration: server → probe → one load level per concurrency → checks, metrics, report.

`run_load(cfg)` is the library entry behind `g4bench serve-load`:
1. Server: with `cfg.url` check /v1/models (`ServerError` on anything wrong); without it start our
   `g4bench serve` on a free loopback port (server.py) and stop it in a `finally`.
2. Probe: one short request (excluded from results) warms the server up and, for `api="auto"`, picks
   the transport: token-id prompts when the server returns `token_ids`, else chat messages.
3. Levels: for each concurrency c, closed loop (c workers, each runs its next task as soon as the
   last one ends; no client queue by construction) or open loop (`rate`: tasks arrive by a gamma
   process and wait for one of c slots; that wait is the client queue time). A task's turns go back
   to back. Every request yields a record; a failed turn fails its task (later turns are not sent).
4. Liveness: after any connection-level failure the runner asks whether the server is still up; if
   not, it stops sending, keeps what it has and marks the run `partial` with the reason. Ctrl-C does
   the same ("interrupted") before re-raising.
5. Server metrics: beside the levels, server_metrics.py scrapes /metrics every `metrics_period_s`
   (ours or vLLM's names); the rows and their status land in the `RunResult` (metrics.jsonl). With
   scraping on, one snapshot before and after each level gives that level's speculative decoding
   (a --spec-k server's g4bench_spec_* counters: `LevelResult.speculation`).
6. report.py writes the run folder from the `RunResult`.

replay.py (`--trace`) and find_max.py (`--find-max`) reuse these pieces: the client, the transport
probe and the scraper, with their own schedule of requests or levels.

`--workload tools` runs tool_workload.py's `ToolTask`s (forced tool calls over chat, tool results
appended as `tool` messages); each level keeps one `ToolCallStats`, whose parse / validation rates
land in `LevelResult.tool_calls`.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import httpx

from harness.load.client import RequestRecord, RequestSpec, stream_request
from harness.load.server import ManagedServer, alive
from harness.load.server_metrics import MetricsScraper, fetch_snapshot, speculation_block
from harness.load.slo import SLO
from harness.load.tool_workload import ToolCallStats, ToolTask, ToolWorkloadConfig
from harness.load.workloads import Api, Task, WorkloadConfig, arrival_times, make_tasks


@dataclass
class LoadConfig:
    base_url: str
    workload: WorkloadConfig
    concurrencies: list[int]
    num_tasks: int | None = None  # tasks per level (fixed: requests); None → duration or tasks_per_conc
    duration_s: float | None = None  # per level: no new task starts after this
    tasks_per_conc: int = 1  # used when neither num_tasks nor duration_s is given
    rate: float = math.inf  # tasks per second (open loop when finite)
    burstiness: float = 1.0
    timeout_s: float = 600.0
    slo: SLO = field(default_factory=SLO)
    api_key: str | None = None
    task_id_offset: int = 0  # added to every task id (levels of one concurrency never share prompts)
    metrics_period_s: float = 1.0  # scrape /metrics this often (server_metrics.py); ≤ 0: off
    task_turns: dict[int, int] | None = None  # session traces: turns of each task id (else the workload's)


@dataclass
class LevelResult:
    concurrency: int
    records: list[RequestRecord]
    duration_s: float
    partial_reason: str | None = None
    tool_calls: dict | None = None  # tools workload: ToolCallStats.summary()
    start_s: float = 0.0  # when the level began, s from the run's start (its records count from here)
    rate: float | None = None  # open loop: this level's arrival rate, when it differs from cfg.rate
    speculation: dict | None = None  # a --spec-k server: server_metrics.speculation_block over the level


@dataclass
class RunResult:
    cfg: LoadConfig
    levels: list[LevelResult] = field(default_factory=list)
    partial_reason: str | None = None
    notes: list[str] = field(default_factory=list)
    interrupted: bool = False
    server_metrics: list[dict[str, Any]] = field(default_factory=list)  # metrics.jsonl rows
    server_metrics_block: dict[str, Any] | None = None  # MetricsScraper.block()
    trace: dict[str, Any] | None = None  # trace replays: replay.trace_block()


def level_tasks(cfg: LoadConfig, conc: int) -> int | None:
    """Tasks one level runs (None: as many as fit in `duration_s`)."""
    if cfg.num_tasks is not None:
        return cfg.num_tasks
    if cfg.duration_s is not None:
        return None
    return cfg.tasks_per_conc * conc


async def probe_api(client: httpx.AsyncClient, cfg: LoadConfig, headers: dict[str, str] | None) -> Api:
    """Send one short request; return "tokens" if the server streams back token ids, else "chat"."""
    body = {
        "model": cfg.workload.model,
        "prompt": [40, 41, 42, 43],
        "max_tokens": 2,
        "return_token_ids": True,
    }
    spec = RequestSpec("/v1/completions", body, request_id="probe")
    rec = await stream_request(client, cfg.base_url, spec, t0=time.perf_counter(), scheduled_s=0.0,
                               timeout_s=cfg.timeout_s, headers=headers)  # fmt: skip
    return "tokens" if rec.ok and rec.output_ids is not None else "chat"


class _Level:
    """One concurrency level in flight: hands out tasks, collects records, watches the server."""

    def __init__(self, cfg: LoadConfig, conc: int, client: httpx.AsyncClient, server: ManagedServer | None,
                 on_record: Callable[[RequestRecord], None], records: list[RequestRecord]) -> None:  # fmt: skip
        self.cfg, self.conc, self.client, self.server = cfg, conc, client, server
        self.on_record, self.records = on_record, records
        self.headers = {"Authorization": f"Bearer {cfg.api_key}"} if cfg.api_key else None
        self.stop = asyncio.Event()
        self.partial_reason: str | None = None
        self.next_id = 0
        # Task ids (the seeds of their prompts) are distinct per concurrency level, so a level never
        # finds the previous level's conversations resident in the server's prefix cache.
        self.id_base = conc * 1_000_000 + cfg.task_id_offset
        self.limit = level_tasks(cfg, conc)
        self.t0 = time.perf_counter()
        self.tool_stats = ToolCallStats() if cfg.workload.kind == "tools" else None

    def make_task(self) -> Task | ToolTask:
        wl, task_id = self.cfg.workload, self.id_base + self.next_id
        self.next_id += 1
        if self.tool_stats is None:
            return make_tasks(wl, 1, first_id=task_id)[0]
        tcfg = ToolWorkloadConfig(model=wl.model, input_len=wl.input_len, turns=wl.turns,
                                  tool_result_tokens=wl.tool_result_tokens, max_tokens=wl.output_len,
                                  seed=wl.seed)  # fmt: skip
        return ToolTask(tcfg, task_id, self.tool_stats)

    def new_task(self) -> Task | ToolTask | None:
        c = self.cfg
        if self.stop.is_set():
            return None
        if self.limit is not None and self.next_id >= self.limit:
            return None
        if self.limit is None and time.perf_counter() - self.t0 >= (c.duration_s or 0.0):
            return None
        return self.make_task()

    async def run_task(
        self, task: Task | ToolTask, scheduled_s: float, after_first: Callable[[], None] | None = None
    ) -> None:
        """The task's turns back to back; `after_first` is called once the first turn has ended
        (whatever its outcome), and also when the task sends nothing."""
        try:
            await self._turns(task, scheduled_s, after_first)
        finally:
            if after_first is not None:
                after_first()

    async def _turns(self, task: Task | ToolTask, scheduled_s: float, after_first: Callable[[], None] | None) -> None:
        while not self.stop.is_set() and (spec := task.next_spec()) is not None:
            rec = await stream_request(self.client, self.cfg.base_url, spec, t0=self.t0,
                                       scheduled_s=scheduled_s, timeout_s=self.cfg.timeout_s,
                                       headers=self.headers)  # fmt: skip
            self.records.append(rec)
            self.on_record(rec)
            if after_first is not None:
                after_first()
                after_first = None
            if not rec.ok:
                if rec.error_kind == "connection" and not await alive(
                    self.client, self.cfg.base_url, self.server
                ):
                    self.partial_reason = f"server stopped answering during the run ({rec.error})"
                    self.stop.set()
                return
            if (err := task.observe(rec)) is not None:
                rec.ok, rec.error, rec.error_kind = False, err, "protocol"
                return
            scheduled_s = time.perf_counter() - self.t0

    async def closed_loop(self) -> None:
        """c workers, each starting its next task when the last ends. With a lead agent, worker 0's
        first turn runs alone and the other workers start when it has ended (the shared system
        prompt is then in the server's cache, as in a fleet that is already running)."""
        warm = asyncio.Event()
        if not self.cfg.workload.lead_opens:
            warm.set()

        async def worker(i: int) -> None:
            if i > 0:
                await warm.wait()
            lead = i == 0 and not warm.is_set()
            while (task := self.new_task()) is not None:
                await self.run_task(task, time.perf_counter() - self.t0, warm.set if lead else None)
                lead = False
            warm.set()

        await asyncio.gather(*(worker(i) for i in range(self.conc)))

    async def open_loop(self) -> None:
        c = self.cfg
        n = self.limit if self.limit is not None else math.ceil(c.rate * (c.duration_s or 0.0))
        times = arrival_times(n, c.rate, c.burstiness, seed=c.workload.seed)
        sem = asyncio.Semaphore(self.conc)

        async def arrival(at: float) -> None:
            await asyncio.sleep(max(0.0, at - (time.perf_counter() - self.t0)))
            task = self.new_task() if self.limit is not None else self._open_task()
            if task is None:
                return
            async with sem:
                await self.run_task(task, at)

        await asyncio.gather(*(arrival(float(t)) for t in times))

    def _open_task(self) -> Task | ToolTask | None:
        # duration-bounded open loop: the arrival count already bounds it, so ignore the clock
        task = self.make_task()
        return None if self.stop.is_set() else task


async def _run_level(cfg: LoadConfig, conc: int, client: httpx.AsyncClient, server: ManagedServer | None,
                     on_record: Callable[[RequestRecord], None], records: list[RequestRecord]) -> LevelResult:  # fmt: skip
    level = _Level(cfg, conc, client, server, on_record, records)
    try:
        if math.isfinite(cfg.rate):
            await level.open_loop()
        else:
            await level.closed_loop()
    finally:
        duration = time.perf_counter() - level.t0
    tools = level.tool_stats.summary() if level.tool_stats is not None else None
    return LevelResult(conc, records, duration, level.partial_reason, tools)


def make_client(cfg: LoadConfig, max_connections: int) -> httpx.AsyncClient:
    limits = httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections)
    return httpx.AsyncClient(limits=limits, timeout=httpx.Timeout(cfg.timeout_s, connect=10.0))


def auth_headers(cfg: LoadConfig) -> dict[str, str] | None:
    return {"Authorization": f"Bearer {cfg.api_key}"} if cfg.api_key else None


async def resolve_api(client: httpx.AsyncClient, cfg: LoadConfig, result: RunResult) -> None:
    """`api="auto"`: probe once and fix the transport in `cfg.workload` (noted in the result)."""
    if cfg.workload.api != "auto":
        return
    api = await probe_api(client, cfg, auth_headers(cfg))
    result.notes.append(
        f"transport: {api} (probed: server {'returns' if api == 'tokens' else 'does not return'} token_ids)"
    )
    cfg.workload = replace(cfg.workload, api=api)


def scraper_for(client: httpx.AsyncClient, cfg: LoadConfig, origin: float) -> MetricsScraper:
    return MetricsScraper(client, cfg.base_url, cfg.metrics_period_s, lambda: time.perf_counter() - origin,
                          auth_headers(cfg))  # fmt: skip


def keep_metrics(result: RunResult, scraper: MetricsScraper) -> None:
    result.server_metrics.extend(scraper.rows)
    result.server_metrics_block = scraper.block()


def run_load(
    cfg: LoadConfig,
    server: ManagedServer | None = None,
    on_level_start: Callable[[int, int | None], None] | None = None,
    on_record: Callable[[RequestRecord], None] | None = None,
    origin: float | None = None,
) -> RunResult:
    """Run every concurrency level; always returns what was measured (see module docstring).

    Ctrl-C does not propagate: the result comes back with `interrupted=True` so the caller can save
    it and then exit with 130.

    `server` is the self-started child (for liveness); `on_level_start(conc, expected_requests)` and
    `on_record(record)` feed the live progress display. `origin` (a perf_counter reading, default now)
    is time zero of the levels' `start_s` and of the /metrics rows, so several calls share one clock.
    """
    result = RunResult(cfg)
    current: list[RequestRecord] = []
    started: dict[str, Any] = {}
    t_origin = time.perf_counter() if origin is None else origin

    async def main() -> None:
        async with make_client(cfg, max(cfg.concurrencies) + 4) as client:
            await resolve_api(client, cfg, result)
            async with scraper_for(client, cfg, t_origin) as scraper:
                try:
                    await levels(client)
                finally:
                    keep_metrics(result, scraper)

    async def levels(client: httpx.AsyncClient) -> None:
        for conc in cfg.concurrencies:
            n = level_tasks(cfg, conc)
            expected = n * cfg.workload.turns_per_task if n is not None else None
            if on_level_start:
                on_level_start(conc, expected)
            current.clear()
            scrape = cfg.metrics_period_s > 0
            before = await fetch_snapshot(client, cfg.base_url, auth_headers(cfg)) if scrape else None
            started["t"], started["conc"] = time.perf_counter(), conc
            level = await _run_level(cfg, conc, client, server, on_record or (lambda r: None), current)
            after = await fetch_snapshot(client, cfg.base_url, auth_headers(cfg)) if scrape else None
            spec = speculation_block(before, after)
            result.levels.append(replace(level, records=list(current), start_s=started["t"] - t_origin,
                                         speculation=spec))  # fmt: skip
            current.clear()
            if level.partial_reason:
                result.partial_reason = level.partial_reason
                return

    try:
        asyncio.run(main())
    except KeyboardInterrupt:
        result.partial_reason, result.interrupted = "interrupted (Ctrl-C)", True
        if current:
            result.levels.append(LevelResult(started["conc"], list(current), time.perf_counter() - started["t"],
                                             result.partial_reason, start_s=started["t"] - t_origin))  # fmt: skip
    return result
