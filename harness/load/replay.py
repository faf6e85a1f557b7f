"""Replay a trace (trace.py) against a server on the trace's own schedule: `serve-load --trace FILE`.

Data flow::

    Trace ── mooncake: one RequestSpec per row, sent at its timestamp (open loop, uncapped: a
             │           request never waits for another, so the schedule is the trace's)
             └ sessions: one coroutine per session; turn 0 at start_ms, turn k think_ms after
                         turn k − 1's reply ended, each turn resending the history with the real reply
    → RequestRecords (scheduled_s = the trace's time for that send) → one LevelResult
    → report.py (serve-load's folder) + `trace_block`: schedule fidelity and implied cache reuse

Pacing runs on a `Clock` (`now()` in seconds; waits are `asyncio.sleep` to an absolute deadline, so
a late send does not delay the next). The real run's clock is perf_counter from the replay's start;
tests run the same code on an event loop with virtual time. Schedule fidelity is send − scheduled
per request: the send is stamped where the client hands the request to httpx (client.py), which
has no connection limit here, so no request waits for a pooled connection.

The cache the trace implies (mooncake): prompt tokens in blocks an earlier request also had, and in
the longest shared leading run of blocks (what a prefix cache can reuse at best), set beside what
the server reported as `cached_tokens`. Sessions: turn k ≥ 1 could reuse turn k − 1's prompt and
reply; turn 0 the shared system-prompt blocks an earlier session sent. Under `--api chat` the
implied counts are in our synthetic ids (one character each) and the server's in its own tokens, so
compare the fractions, not the counts.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from harness.load.client import RequestRecord, RequestSpec, stream_request
from harness.load.runner import (
    LevelResult,
    LoadConfig,
    RunResult,
    auth_headers,
    keep_metrics,
    make_client,
    resolve_api,
    scraper_for,
)
from harness.load.server import ManagedServer, alive
from harness.load.trace import BlockTokens, Session, Trace, TraceRequest, as_text, implied_block_reuse
from harness.load.workloads import WorkloadConfig


class Clock:
    """Seconds since the replay's start (`now`), and waiting for an absolute time on it."""

    def __init__(self, now: Callable[[], float]) -> None:
        self.now = now

    async def until(self, t: float) -> None:
        d = t - self.now()
        if d > 0:
            await asyncio.sleep(d)


Send = Callable[[RequestSpec, float], Awaitable[RequestRecord]]  # (spec, scheduled_s) → record


def _body(wl: WorkloadConfig, output_len: int) -> dict[str, Any]:
    body: dict[str, Any] = {"model": wl.model, "max_tokens": output_len, "temperature": 0.0}
    if wl.ignore_eos:
        body.update(ignore_eos=True, min_tokens=output_len)
    return body


def request_spec(req: TraceRequest, wl: WorkloadConfig, blocks: BlockTokens) -> RequestSpec:
    """A Mooncake row as one request (token ids, or their text as one user message under chat)."""
    ids = blocks.request_prompt(req)
    body = _body(wl, req.output_length)
    if wl.api == "tokens":
        body.update(prompt=ids, return_token_ids=True)
        return RequestSpec("/v1/completions", body, f"r{req.index}", input_len=len(ids), prompt_ids=ids)
    body["messages"] = [{"role": "user", "content": as_text(ids)}]
    return RequestSpec("/v1/chat/completions", body, f"r{req.index}", input_len=len(ids))


class SessionTask:
    """One session's conversation: `spec(k)` builds turn k from the history, `observe` adds the reply."""

    def __init__(self, s: Session, wl: WorkloadConfig, blocks: BlockTokens) -> None:
        self.s, self.wl, self.blocks = s, wl, blocks
        prefix = blocks.prompt(s.prefix_hash_ids, len(s.prefix_hash_ids) * blocks.block_size, (0, 0))
        self.prefix_len = len(prefix)
        first = blocks.session_tokens(s.index, 0, 0, s.turns[0].input_length)
        self.ids: list[int] = prefix + first
        self.messages: list[dict[str, str]] = [{"role": "system", "content": as_text(prefix)}] if prefix else []
        self.messages.append({"role": "user", "content": as_text(first)})

    def spec(self, k: int) -> RequestSpec:
        turn = self.s.turns[k]
        if k > 0:  # the previous turn's tool result, then the new user tokens
            new = self.blocks.session_tokens(self.s.index, k, 1, turn.tool_result_length)
            new += self.blocks.session_tokens(self.s.index, k, 0, turn.input_length)
            self.ids += new
            self.messages.append({"role": "user", "content": as_text(new)})
        body = _body(self.wl, turn.output_length)
        common: dict[str, Any] = dict(request_id=f"s{self.s.index}-{k}", agent_id=self.s.index,
                                      task_id=self.s.index, turn=k)  # fmt: skip
        if self.wl.api == "tokens":
            body.update(prompt=list(self.ids), return_token_ids=True)
            return RequestSpec("/v1/completions", body, input_len=len(self.ids), prompt_ids=list(self.ids), **common)
        body["messages"] = [dict(m) for m in self.messages]
        return RequestSpec("/v1/chat/completions", body, input_len=sum(len(m["content"]) for m in self.messages),
                           **common)  # fmt: skip

    def observe(self, rec: RequestRecord) -> str | None:
        if self.wl.api == "tokens":
            if rec.output_ids is None:
                return "server returned no token_ids (needs `return_token_ids`); use --api chat"
            self.ids += rec.output_ids
        else:
            self.messages.append({"role": "assistant", "content": rec.text})
        return None


async def dispatch(items: Sequence[tuple[float, Any]], clock: Clock, fire: Callable[[Any, float], Coroutine[Any, Any, Any]],
                   stop: asyncio.Event | None = None) -> None:  # fmt: skip
    """Start `fire(item, at)` at each `at` (s, ascending) without waiting for earlier ones to end."""
    tasks: list[asyncio.Task[Any]] = []
    for at, item in items:
        await clock.until(at)
        if stop is not None and stop.is_set():
            break
        tasks.append(asyncio.create_task(fire(item, at)))
    await asyncio.gather(*tasks)


async def run_session(task: SessionTask, clock: Clock, send: Send, stop: asyncio.Event | None = None) -> None:
    """Turn 0 at start_ms; turn k think_ms after turn k − 1's reply ended; a failed turn ends it."""
    at = ended = task.s.start_ms / 1e3
    for k, turn in enumerate(task.s.turns):
        if k:
            at = ended + turn.think_ms / 1e3
        spec = task.spec(k)  # built during the think time, as a client would
        await clock.until(at)
        if stop is not None and stop.is_set():
            return
        rec = await send(spec, at)
        ended = clock.now()
        if not rec.ok:
            return
        if (err := task.observe(rec)) is not None:
            rec.ok, rec.error, rec.error_kind = False, err, "protocol"
            return


@dataclass
class Replay:
    """One replay in flight: the sender (records, peak in flight, liveness), over any `send_spec`."""

    send_spec: Send
    on_record: Callable[[RequestRecord], None] = lambda r: None
    is_alive: Callable[[], Awaitable[bool]] | None = None
    records: list[RequestRecord] = field(default_factory=list)
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    in_flight: int = 0
    peak: int = 0
    partial_reason: str | None = None

    async def send(self, spec: RequestSpec, at: float) -> RequestRecord:
        self.in_flight += 1
        self.peak = max(self.peak, self.in_flight)
        try:
            rec = await self.send_spec(spec, at)
        finally:
            self.in_flight -= 1
        self.records.append(rec)
        self.on_record(rec)
        if not rec.ok and rec.error_kind == "connection" and self.is_alive is not None and not await self.is_alive():
            self.partial_reason = f"server stopped answering during the replay ({rec.error})"
            self.stop.set()
        return rec

    async def run(self, trace: Trace, wl: WorkloadConfig, clock: Clock, seed: int = 0) -> None:
        blocks = BlockTokens(trace.block_size, seed)
        if trace.format == "mooncake":
            items = [(r.timestamp_ms / 1e3, request_spec(r, wl, blocks)) for r in trace.requests]
            await dispatch(items, clock, self.send, self.stop)
        else:
            tasks = [SessionTask(s, wl, blocks) for s in trace.sessions]
            await asyncio.gather(*(run_session(t, clock, self.send, self.stop) for t in tasks))


def trace_workload(trace: Trace, api: str, model: str, seed: int) -> WorkloadConfig:
    """The WorkloadConfig a trace replay reports under (kind "trace" or "sessions")."""
    if trace.format == "mooncake":
        rs = trace.requests
        return WorkloadConfig(kind="trace", api=api, model=model, turns=1, seed=seed,  # type: ignore[arg-type]
                              input_len=round(float(np.mean([r.input_length for r in rs]))),
                              output_len=round(float(np.mean([r.output_length for r in rs]))))  # fmt: skip
    turns = [t for s in trace.sessions for t in s.turns]
    return WorkloadConfig(kind="sessions", api=api, model=model, seed=seed,  # type: ignore[arg-type]
                          turns=max(len(s.turns) for s in trace.sessions),
                          input_len=round(float(np.mean([s.turns[0].input_length for s in trace.sessions]))),
                          output_len=round(float(np.mean([t.output_length for t in turns]))),
                          tool_result_tokens=round(float(np.mean([t.tool_result_length for t in turns]))))  # fmt: skip


def run_trace(
    cfg: LoadConfig,
    trace: Trace,
    server: ManagedServer | None = None,
    on_record: Callable[[RequestRecord], None] | None = None,
) -> RunResult:
    """Replay `trace` against `cfg.base_url` (cfg.workload from `trace_workload`); one level whose
    `concurrency` is the most requests that were in flight at once. Ctrl-C as in run_load."""
    if trace.format == "sessions":
        cfg.task_turns = {s.index: len(s.turns) for s in trace.sessions}
    result = RunResult(cfg, notes=list(trace.notes))
    origin = time.perf_counter()
    state: dict[str, Any] = {}

    async def main() -> None:
        async with make_client(cfg, max(64, trace.num_requests + 4)) as client:
            await resolve_api(client, cfg, result)
            headers, t0 = auth_headers(cfg), time.perf_counter()

            async def send_spec(spec: RequestSpec, at: float) -> RequestRecord:
                return await stream_request(client, cfg.base_url, spec, t0=t0, scheduled_s=at,
                                            timeout_s=cfg.timeout_s, headers=headers)  # fmt: skip

            replay = Replay(send_spec, on_record or (lambda r: None), lambda: alive(client, cfg.base_url, server))
            state["replay"], state["t0"] = replay, t0
            async with scraper_for(client, cfg, origin) as scraper:
                try:
                    await replay.run(trace, cfg.workload, Clock(lambda: time.perf_counter() - t0), cfg.workload.seed)
                finally:
                    keep_metrics(result, scraper)

    try:
        asyncio.run(main())
    except KeyboardInterrupt:
        result.partial_reason, result.interrupted = "interrupted (Ctrl-C)", True
    replay: Replay | None = state.get("replay")
    if replay is not None:
        reason = result.partial_reason or replay.partial_reason
        result.partial_reason = reason
        level = LevelResult(max(1, replay.peak), list(replay.records), time.perf_counter() - state["t0"], reason,
                            start_s=state["t0"] - origin)  # fmt: skip
        result.levels.append(level)
        result.trace = trace_block(trace, level.records)
    return result


def _pcts(values: Sequence[float]) -> dict[str, float | None]:
    x = np.asarray(values, dtype=float)
    if not len(x):
        return {"p50": None, "p99": None, "max": None}
    return {"p50": float(np.percentile(x, 50)), "p99": float(np.percentile(x, 99)), "max": float(x.max())}


def implied_reuse(trace: Trace, records: Sequence[RequestRecord]) -> dict[str, int]:
    """Prompt tokens the trace lets a cache reuse (module docstring), summed over the sent requests."""
    sent = {r.request_id for r in records}
    if trace.format == "mooncake":
        rows = implied_block_reuse([(r.hash_ids, r.input_length) for r in trace.requests], trace.block_size)
        kept = [row for r, row in zip(trace.requests, rows, strict=True) if f"r{r.index}" in sent]
        return {k: sum(row[k] for row in kept) for k in ("prompt", "repeated", "prefix")}
    by_id = {r.request_id: r for r in records}
    firsts = sorted(trace.sessions, key=lambda s: s.start_ms)
    prefix_rows = implied_block_reuse([(s.prefix_hash_ids, len(s.prefix_hash_ids) * trace.block_size) for s in firsts],
                                      trace.block_size)  # fmt: skip
    reuse0 = {s.index: row["prefix"] for s, row in zip(firsts, prefix_rows, strict=True)}
    prompt = prefix = 0
    for s in trace.sessions:
        for k in range(len(s.turns)):
            rec = by_id.get(f"s{s.index}-{k}")
            if rec is None or rec.input_len is None:
                continue
            prompt += rec.input_len
            if k == 0:
                prefix += reuse0[s.index]
            elif (prev := by_id.get(f"s{s.index}-{k - 1}")) is not None and prev.input_len is not None:
                reply = len(prev.output_ids) if prev.output_ids is not None else len(prev.text)
                prefix += prev.input_len + reply
    return {"prompt": prompt, "repeated": prefix, "prefix": prefix}


def trace_block(trace: Trace, records: Sequence[RequestRecord]) -> dict[str, Any]:
    """The summary's `trace` entry: what was replayed, how faithfully, and the cache it implies."""
    lateness = [(r.send_s - r.scheduled_s) * 1e3 for r in records]
    implied = implied_reuse(trace, records)
    known = [r for r in records if r.ok and r.prompt_tokens is not None and r.cached_tokens is not None]
    server_prompt = sum(r.prompt_tokens or 0 for r in known)
    server_cached = sum(r.cached_tokens or 0 for r in known)
    prompt = implied["prompt"]
    return {
        "path": trace.path, "format": trace.format, "block_size": trace.block_size,
        "requests": trace.num_requests, "sessions": len(trace.sessions) or None, "sent": len(records),
        "max_context": trace.max_context,
        "answered": sum(r.ok for r in records), "span_s": trace.span_s,
        "schedule_lateness_ms": _pcts(lateness),
        "schedule_definition": "send − trace time per request (sessions: reply end + think_ms)",
        "implied_prompt_tokens": prompt,
        "implied_repeated_block_tokens": implied["repeated"],
        "implied_prefix_reusable_tokens": implied["prefix"],
        "implied_repeated_fraction": implied["repeated"] / prompt if prompt else None,
        "implied_prefix_fraction": implied["prefix"] / prompt if prompt else None,
        "server_cached_requests": len(known),
        "server_prompt_tokens": server_prompt if known else None,
        "server_cached_tokens": server_cached if known else None,
        "server_cached_fraction": server_cached / server_prompt if known and server_prompt else None,
        "token_units": "synthetic ids (one character each under --api chat); the server counts its own tokens",
    }  # fmt: skip
