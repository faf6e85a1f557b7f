"""Simulate a serve-load run: the real Scheduler, an engine stand-in on a virtual clock, virtual clients.

    result = simulate(load_cfg, ServerShape(model="small", max_slots=8, max_len=512), pricer)
    summary = harness.load.report.build_summary(result, meta)      # serve-load's own schema

Data flow, per concurrency level (a fresh simulated server each, as the measured levels never share
a prefix either: their task ids differ):

    VirtualClock ─┬─ VirtualEngine(cfg, EngineConfig as `g4bench serve` builds it, pricer)
                  └─ Scheduler(engine, warmup=False, clock=clock)      the real one, not started
    clients: the same Tasks as serve-load (harness/load/workloads.make_tasks, same ids and seed),
             closed loop (c workers, next turn / task the moment a reply ends; a shared-prefix level
             with a lead agent starts the other c − 1 when its first turn ends) or open loop
             (arrival_times, at most c tasks in flight)
    loop:    deliver client sends due by `now` → Scheduler.submit (a send at `now` itself waits for
             the next engine call to end unless the engine is idle: see below)
             if the scheduler holds work: Scheduler.step()  (each engine call advances the clock)
             else jump the clock to the next client send
    each finished request → a RequestRecord as harness/load/client.py writes one (one token per
    chunk, chunk times = the scheduler's token times, usage from the scheduler's counts)
    → LevelResult → RunResult, which report.py summarizes exactly as a measured run

No sleeping and no threads: `Scheduler.step()` is the engine thread's loop body. A reply's next turn
(or a closed-loop worker's next task) is sent at the instant the scheduler reports the reply done,
which is when a client with zero network latency would send it. A send that falls inside an engine
call reaches the scheduler when that call ends (as in the server, whose loop admits between calls);
the record's times still count from the send.

A send never reaches the scheduler at the very boundary it was sent at while the engine is busy: the
server's engine thread goes from one call straight to the next (it delivers the finished step's tokens
and calls the engine again within about a millisecond), while a reply has to reach the client and the
client's next request has to come back through HTTP and `Scheduler.submit` first. Measured on the
2-core CPU host (small model, fixed workload, c=4): a decode ends, the next engine call starts
0.8-1.1 ms later, the client reads the end of the stream 2-4 ms later and its next request is
submitted ~6 ms after the decode ended, so it waits for the call already running. So a send at time
t is delivered at the first step boundary strictly after t, or at t itself when the engine is idle
(the server's loop is asleep and `submit` wakes it). The few milliseconds of client and HTTP time
are not modelled otherwise. Priced with the engine-call times measured in that same run (c=1, 4, 8,
16 requests each), the simulator gave median TTFT 135 / 539 / 577 ms against 140 / 548 / 614 ms
measured; admitting a send at the boundary it was sent at gave 135 / 368 / 357 ms.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from g4bench.engine.logprobs import TokenLogprob
from g4bench.engine.scheduler import GenerationParams, RequestResult, Scheduler
from g4bench.engine.virtual_engine import VirtualClock, VirtualEngine
from harness.load.client import RequestRecord, RequestSpec
from harness.load.runner import LevelResult, LoadConfig, RunResult, level_tasks
from harness.load.workloads import Task, arrival_times, make_tasks


@dataclass(frozen=True)
class ServerShape:
    """What the simulated server is started with (the subset of LaunchSpec the engine sees)."""

    model: str = "small"
    max_slots: int = 8
    max_len: int = 8192
    kv_dtype: str = "bf16"
    sliding_kv: str = "ring"
    chunk_size: int = 256
    kv_layout: str = "paged"
    cached_windows: int = 4
    max_waiting: int = 64
    max_batched_tokens: int = 512
    prefill_policy: str | None = None  # None: mixed when paged, as serve

    def engine_config(self) -> Any:
        from g4bench.engine.engine_config import EngineConfig

        return EngineConfig(max_slots=self.max_slots, max_len=self.max_len, kv_dtype=self.kv_dtype,
                            sliding_kv=self.sliding_kv, chunk_size=self.chunk_size, kv_layout=self.kv_layout,
                            cached_windows=self.cached_windows, max_batched_tokens=self.max_batched_tokens,
                            prefill_policy=self.prefill_policy)  # fmt: skip


def generation_params(body: dict[str, Any]) -> GenerationParams:
    """What a request body asks the scheduler for (the simulated workloads' fields)."""
    return GenerationParams(max_tokens=int(body["max_tokens"]), min_tokens=int(body.get("min_tokens", 0)),
                            ignore_eos=bool(body.get("ignore_eos", False)))  # fmt: skip


def request_record(
    spec: RequestSpec, res: RequestResult, *, scheduled_s: float, send_s: float, submitted_s: float
) -> RequestRecord:
    """A simulated request as harness/load/client.py records a measured one: one token per chunk,
    chunk times the scheduler's token times counted from the client's send (`submitted_s` is when
    the scheduler saw it), usage from the scheduler's counts."""
    n = len(res.output_ids)
    late = submitted_s - send_s  # the scheduler's times count from its submission
    ok = res.finish_reason in ("stop", "length")
    return RequestRecord(
        request_id=spec.request_id, endpoint=spec.endpoint, agent_id=spec.agent_id, task_id=spec.task_id,
        turn=spec.turn, input_len=spec.input_len, max_tokens=int(spec.body["max_tokens"]),
        scheduled_s=scheduled_s, send_s=send_s, ok=ok, error=res.error,
        error_kind=None if ok else "http", status_code=200 if ok else 500,
        chunk_times=[t + late for t in res.token_times_s], chunk_tokens=[1] * n, chunk_tokens_source="token_ids",
        end_s=submitted_s + res.token_times_s[-1] if res.token_times_s else None, done=ok,
        finish_reason=res.finish_reason, prompt_tokens=res.prompt_tokens, completion_tokens=n,
        cached_tokens=res.cached_tokens, output_ids=list(res.output_ids), prompt_ids=spec.prompt_ids,
    )  # fmt: skip


class SimulationError(RuntimeError):
    """The simulated server cannot make progress (a request that can never be placed)."""


@dataclass
class _Sink:
    """One request in flight: collects nothing (the scheduler keeps the times) and reports back."""

    level: _Level
    task: Task
    spec: RequestSpec
    send_s: float  # when the client sent it
    scheduled_s: float
    submitted_s: float  # when the scheduler saw it (after the engine call in progress at send_s)

    def on_token(self, token: int, logprob: TokenLogprob | None = None) -> bool:
        return False  # the simulated client takes token times from RequestResult, never stops early

    def on_finish(self, result: RequestResult) -> None:
        self.level.finished(self, result)


@dataclass
class _Level:
    cfg: LoadConfig
    conc: int
    scheduler: Scheduler
    clock: VirtualClock
    records: list[RequestRecord] = field(default_factory=list)
    events: list[tuple[float, int, str, Any]] = field(default_factory=list)  # (time, seq, kind, arg)
    waiting_tasks: deque[tuple[Task, float]] = field(default_factory=deque)  # open loop: (task, arrival)
    in_flight: int = 0
    held: int = 0  # closed-loop workers that start once the lead agent's first turn has ended
    started: int = 0
    seq: Any = field(default_factory=itertools.count)

    def new_task(self) -> Task | None:
        limit = level_tasks(self.cfg, self.conc)
        if limit is not None and self.started >= limit:
            return None
        if limit is None and math.isinf(self.cfg.rate) and self.clock.now >= (self.cfg.duration_s or 0.0):
            return None
        task = make_tasks(self.cfg.workload, 1, first_id=self.conc * 1_000_000 + self.cfg.task_id_offset + self.started)[0]
        self.started += 1
        return task

    def send(self, task: Task, scheduled_s: float, send_s: float) -> None:
        spec = task.next_spec()
        assert spec is not None and spec.prompt_ids is not None  # token transport, a turn left
        sink = _Sink(self, task, spec, send_s, scheduled_s, self.clock.now)
        self.scheduler.submit(list(spec.prompt_ids), generation_params(spec.body), sink)

    def start_task(self, task: Task, scheduled_s: float, send_s: float) -> None:
        self.in_flight += 1
        self.send(task, scheduled_s, send_s)

    def finished(self, sink: _Sink, res: RequestResult) -> None:
        rec = request_record(sink.spec, res, scheduled_s=sink.scheduled_s, send_s=sink.send_s,
                             submitted_s=sink.submitted_s)  # fmt: skip
        self.records.append(rec)
        for _ in range(self.held):  # the lead's first turn ended: the other workers start
            self.push(self.clock.now, "free", None)
        self.held = 0
        if rec.ok and sink.task.observe(rec) is None and sink.task.turn < self.cfg.workload.turns_per_task:
            self.push(self.clock.now, "turn", sink.task)  # the next turn, sent as the reply ends
            return
        self.in_flight -= 1
        self.push(self.clock.now, "free", None)

    def push(self, t: float, kind: str, arg: Any) -> None:
        heapq.heappush(self.events, (t, next(self.seq), kind, arg))

    def handle(self, t: float, kind: str, arg: Any) -> None:
        """Client event at time `t`: "turn" (a task's next turn), "free" (a closed-loop worker or an
        open-loop slot is free), "arrive"."""
        if kind == "turn":
            self.send(arg, t, t)
            return
        if kind == "arrive":
            task = self.new_task() if level_tasks(self.cfg, self.conc) is not None else self._open_task()
            if task is not None:
                self.waiting_tasks.append((task, arg))
        elif math.isinf(self.cfg.rate) and (task := self.new_task()) is not None:
            self.waiting_tasks.append((task, t))
        while self.waiting_tasks and self.in_flight < self.conc:
            task, at = self.waiting_tasks.popleft()
            self.start_task(task, at, t)

    def _open_task(self) -> Task:
        task = make_tasks(self.cfg.workload, 1, first_id=self.conc * 1_000_000 + self.cfg.task_id_offset + self.started)[0]
        self.started += 1
        return task


def arrived(send_s: float, now: float, busy: bool) -> bool:
    """Whether a client send at `send_s` has reached the scheduler at `now`: before `now`, or at `now`
    itself only when the engine is idle (a busy engine thread is already in its next call)."""
    return send_s < now or (not busy and send_s <= now)


def server_turn(sched: Scheduler, engine: VirtualEngine, clock: VirtualClock, next_send: float | None,
                stuck: str) -> bool | None:  # fmt: skip
    """One turn of the simulated server's loop, once the sends due by now are delivered: a scheduler
    step when it holds work (→ whether an engine call ran; when none could, the clock jumps to the
    next send, the only thing that can change that), else the clock jumps to the next send (the idle
    loop sleeps until a submit wakes it: → False); None when there is neither work nor a send.
    SimulationError (`stuck`, its {n} the requests held) when work can never run and no send is left."""
    if sched.num_active or sched.num_waiting:
        before = len(engine.calls)
        sched.step()
        if len(engine.calls) > before:
            return True
        if next_send is None:
            raise SimulationError(stuck.format(n=sched.num_waiting + sched.num_active))
        clock.advance_to(next_send)
        return False
    if next_send is None:
        return None
    clock.advance_to(next_send)
    return False


def simulate_level(
    cfg: LoadConfig, conc: int, shape: ServerShape, pricer: Any, model_cfg: Any
) -> tuple[LevelResult, VirtualEngine]:
    """One concurrency level on a fresh simulated server; see the module docstring."""
    clock = VirtualClock()
    engine = VirtualEngine(model_cfg, shape.engine_config(), pricer, clock)
    sched = Scheduler(engine, max_waiting=shape.max_waiting, warmup=False, clock=clock)
    level = _Level(cfg, conc, sched, clock)
    if math.isinf(cfg.rate):
        level.held = conc - 1 if cfg.workload.lead_opens else 0
        for _ in range(conc - level.held):
            level.push(0.0, "free", None)
    else:
        limit = level_tasks(cfg, conc)
        n = limit if limit is not None else math.ceil(cfg.rate * (cfg.duration_s or 0.0))
        for t in arrival_times(n, cfg.rate, cfg.burstiness, seed=cfg.workload.seed):
            level.push(float(t), "arrive", float(t))
    busy = False  # the last step ran an engine call: with work left, the engine thread goes straight on
    while True:
        # a send at the boundary the engine just reached arrives during its next call (module docstring)
        while level.events and arrived(level.events[0][0], clock.now, busy):
            t, _, kind, arg = heapq.heappop(level.events)
            level.handle(t, kind, arg)
        ran = server_turn(sched, engine, clock, level.events[0][0] if level.events else None,
                          f"c={conc}: {{n}} requests can never be placed (KV pool too small for max_len "
                          f"{shape.max_len}?)")  # fmt: skip
        if ran is None:
            break
        busy = ran
    return LevelResult(conc, level.records, clock.now), engine


def simulate(cfg: LoadConfig, shape: ServerShape, pricer: Any) -> tuple[RunResult, list[VirtualEngine]]:
    """Every concurrency level of `cfg` (token transport only: the simulator has no tokenizer)."""
    from g4bench.model.config import load_config

    if cfg.workload.api != "tokens":
        raise ValueError(f"the simulator sends token-id prompts; workload api is {cfg.workload.api!r}")
    model_cfg = load_config(shape.model)
    result = RunResult(cfg, notes=["simulated: real Scheduler, VirtualEngine priced by a step-time profile"])
    engines = []
    for conc in cfg.concurrencies:
        level, engine = simulate_level(cfg, conc, shape, pricer, model_cfg)
        result.levels.append(level)
        engines.append(engine)
    return result, engines
