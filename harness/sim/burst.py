"""The burst-prefill check on the simulated server: the measured check's shape and figures, priced by a target's profile.

    result = run_sim_burst(SimBurstSettings(budgets=(256, 512)), resolve_target("tpu-v6e"), out)

The same script as harness/load/burst.py, on the real `Scheduler` driving a `VirtualEngine`
(g4bench/engine/virtual_engine.py) whose calls the target's step-time pricer prices
(harness/sim/pricing.py). Per token budget and policy, one fresh simulated server and one round (the
virtual engine is deterministic):

    lone prompts on the idle server, one after another  →  `streams` decoding streams
    →  their lead (`lead_tokens` each)  →  the same single prompts beside them, one at a time
    →  the burst (`burst` prompts sent at one instant)  →  the streams to their end
    →  RoundRecords  →  harness.load.burst.round_figures (the measured check's definitions)

Clients are as in harness/sim/simulate.py: a send reaches the scheduler at the next engine-call
boundary (at once when the engine is idle), and each request becomes the `RequestRecord` a measured
client writes. The lead is counted in stream tokens, not seconds (3 s of decode is 60 steps on the
CPU and hundreds on an accelerator): the streams' median gap is a steady decode step either way.

What it leaves out: HTTP, the client, and the server's host work between engine calls. On the CPU
its figures are the engine's share of the measured ones on the host the profile was fitted on
(docs/findings.md §7 compares the two); on an accelerator they are a prediction from a profile, with the pricer's basis per program (which fit
priced the mixed and prefill calls) recorded beside them, not a measurement.
"""

from __future__ import annotations

import heapq
import itertools
import json
import random
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Annotated, Any

import typer

from g4bench.engine.logprobs import TokenLogprob
from g4bench.engine.scheduler import RequestResult, Scheduler
from g4bench.engine.virtual_engine import VirtualClock, VirtualEngine
from harness.args import ModelOption, ProfileOption, TargetOption, int_list, str_list
from harness.load.burst import RoundRecords, fresh_ids, prompt_spec, round_figures
from harness.load.client import RequestRecord, RequestSpec
from harness.sim.simulate import (
    ServerShape,
    SimulationError,
    arrived,
    generation_params,
    request_record,
    server_turn,
)


@dataclass(frozen=True)
class SimBurstSettings:
    """The measured check's shape (harness/load/burst.BurstSettings), over several token budgets."""

    model: str = "small"
    policies: tuple[str, ...] = ("mixed",)
    budgets: tuple[int, ...] = (512,)
    max_slots: int = 16
    max_len: int = 2048
    burst: int = 8
    prompt_len: int = 200
    streams: int = 2
    stream_tokens: int = 600
    lead_tokens: int = 32
    lone: int = 3
    seed: int = 0


@dataclass
class _Sink:
    """One request in flight: counts its tokens, and records it when it ends."""

    driver: _Driver
    spec: RequestSpec
    send_s: float
    submitted_s: float
    tokens: int = 0

    def on_token(self, token: int, logprob: TokenLogprob | None = None) -> bool:
        self.tokens += 1
        return False

    def on_finish(self, result: RequestResult) -> None:
        rec = request_record(self.spec, result, scheduled_s=self.send_s, send_s=self.send_s,
                             submitted_s=self.submitted_s)  # fmt: skip
        self.driver.records[self.spec.request_id] = rec


@dataclass
class _Driver:
    """The simulated clients and the server's engine thread: sends wait for the next call boundary."""

    scheduler: Scheduler
    engine: VirtualEngine
    clock: VirtualClock
    records: dict[str, RequestRecord] = field(default_factory=dict)
    sinks: dict[str, _Sink] = field(default_factory=dict)
    pending: list[tuple[float, int, RequestSpec]] = field(default_factory=list)
    timeline: list[tuple[float, Any, float]] = field(default_factory=list)  # (start s, EngineCall, seconds)
    busy: bool = False
    seq: Any = field(default_factory=itertools.count)

    def send(self, spec: RequestSpec) -> str:
        heapq.heappush(self.pending, (self.clock.now, next(self.seq), spec))
        return spec.request_id

    def request(self, spec: RequestSpec) -> RequestRecord:
        """Send `spec` and run until its reply has ended."""
        rid = self.send(spec)
        self.run(lambda: rid in self.records)
        return self.records[rid]

    def run(self, done: Callable[[], bool]) -> None:
        """Step the server until `done()`; SimulationError when nothing can make it true."""
        while not done():
            while self.pending and arrived(self.pending[0][0], self.clock.now, self.busy):
                send_s, _, spec = heapq.heappop(self.pending)
                sink = _Sink(self, spec, send_s, self.clock.now)
                self.sinks[spec.request_id] = sink
                self.scheduler.submit(list(spec.prompt_ids or ()), generation_params(spec.body), sink)
            before, start = len(self.engine.calls), self.clock.now
            ran = server_turn(self.scheduler, self.engine, self.clock,
                              self.pending[0][0] if self.pending else None, "{n} requests can never run")  # fmt: skip
            if ran is None:
                raise SimulationError("the script waits for requests the server does not hold")
            for call in self.engine.calls[before:]:  # one loop turn may run more than one call
                seconds = self.engine.price(call)
                self.timeline.append((start, call, seconds))
                start += seconds
            self.busy = ran


def simulate_round(
    s: SimBurstSettings, shape: ServerShape, pricer: Any, model_cfg: Any
) -> tuple[RoundRecords, list[tuple[float, Any, float]]]:
    """One round of the check on a fresh simulated server (module docstring) → its records and the
    engine calls as run: (start s, EngineCall, priced seconds)."""
    clock = VirtualClock()
    engine = VirtualEngine(model_cfg, shape.engine_config(), pricer, clock)
    sched = Scheduler(engine, max_waiting=shape.max_waiting, warmup=False, clock=clock)
    d = _Driver(sched, engine, clock)
    rng = random.Random(s.seed)

    def prompt(rid: str) -> RequestSpec:
        return prompt_spec(s.model, fresh_ids(rng, s.prompt_len), 8, rid)

    lone = [d.request(prompt(f"lone{i}")) for i in range(s.lone)]
    streams = [d.send(prompt_spec(s.model, fresh_ids(rng, 16), s.stream_tokens, f"stream{i}"))
               for i in range(s.streams)]  # fmt: skip
    d.run(lambda: all(r in d.sinks and d.sinks[r].tokens >= s.lead_tokens or r in d.records for r in streams))
    loaded_send = clock.now
    loaded = [d.request(prompt(f"loaded{i}")) for i in range(s.lone)]
    burst_send = clock.now
    burst = [d.send(prompt(f"burst{i}")) for i in range(s.burst)]
    d.run(lambda: all(r in d.records for r in burst))
    d.run(lambda: all(r in d.records for r in streams))
    records = RoundRecords(lone, loaded, [d.records[r] for r in burst], [d.records[r] for r in streams],
                           loaded_send, burst_send)  # fmt: skip
    return records, d.timeline


def burst_calls(timeline: list[tuple[float, Any, float]], r: RoundRecords) -> dict[str, Any]:
    """The engine calls that overlap the burst (its send to its last first token): count and priced
    ms per program."""
    end = max(x.send_s + x.chunk_times[0] for x in r.burst)
    out: dict[str, Any] = {}
    for start, call, seconds in timeline:
        if start + seconds <= r.burst_send or start >= end:
            continue
        row = out.setdefault(call.program, {"calls": 0, "ms": 0.0})
        row["calls"] += 1
        row["ms"] += 1e3 * seconds
    return out


def run_sim_burst(
    s: SimBurstSettings, target: Any, out: Path | None = None, log: Any = print
) -> dict[str, Any]:
    """Every budget × policy on a fresh simulated server → {settings, target, budgets: {budget: {policy:
    figures}}}; a failure is recorded and the next one still runs. Written to out/burst-sim.json."""
    from g4bench.model.config import load_config

    model_cfg = load_config(s.model)
    result: dict[str, Any] = {"settings": asdict(s), "target": target.id, "assumptions": target.assumptions,
                              "budgets": {}}  # fmt: skip
    for budget in s.budgets:
        row: dict[str, Any] = {}
        for policy in s.policies:
            shape = ServerShape(model=s.model, max_slots=s.max_slots, max_len=s.max_len, max_batched_tokens=budget,
                                prefill_policy=policy)  # fmt: skip
            try:
                pricer = target.pricer_for(shape)
                records, timeline = simulate_round(s, shape, pricer, model_cfg)
                figures = round_figures(records)
                figures["burst_calls"] = burst_calls(timeline, records)
                figures["basis"] = dict(pricer.basis)
            except Exception as exc:  # noqa: BLE001 -- recorded; the other shapes still run
                figures = {"failure": f"{type(exc).__name__}: {exc}"}
            row[policy] = figures
            log(f"burst sim [{target.id} {s.model}, budget {budget}, {policy}]: {sim_line(figures)}")
        result["budgets"][str(budget)] = row
        if out is not None:
            out.mkdir(parents=True, exist_ok=True)
            (out / "burst-sim.json").write_text(json.dumps(result, indent=2))
    return result


def sim_line(f: dict[str, Any]) -> str:
    if "failure" in f:
        return f"FAILED {f['failure']}"
    calls = ", ".join(f"{v['calls']} {k} ({v['ms']:.1f} ms)" for k, v in f["burst_calls"].items())
    return (f"lone {f['lone_ttft_ms']:.1f} ms, last {f['burst_ttft_ms'][-1]:.1f} ms: last ÷ lone "
            f"{f['last_over_lone']:.2f}×; streams' largest gap {f['stream_max_gap_during_burst_ms']:.1f} ms = "
            f"{f['max_gap_over_median']:.2f}× their median {f['stream_median_gap_ms']:.1f} ms; calls overlapping "
            f"the burst: {calls}")  # fmt: skip


def main(
    target: TargetOption = "local",
    model: ModelOption = None,
    profile: ProfileOption = None,
    budgets: Annotated[
        str, typer.Option("--max-batched-tokens", help="Token budgets, comma-separated.")
    ] = "512",
    policies: Annotated[
        str,
        typer.Option(
            help="Prefill policies, comma-separated (chunk needs a profile that "
            "prices it: not the local one, fitted on mixed)."
        ),
    ] = "mixed",
    stream_tokens: Annotated[int, typer.Option(min=8)] = SimBurstSettings.stream_tokens,
    out: Path | None = None,
) -> None:
    """`python -m harness.sim.burst`: the burst-prefill check simulated on a target's profile."""
    from harness.sim.planner import cli_target

    sizes = int_list(budgets, "--max-batched-tokens")
    assert sizes is not None  # a string never parses to None
    t = cli_target(target, profile, model)
    s = SimBurstSettings(
        model=t.model, policies=str_list(policies) or SimBurstSettings.policies, budgets=sizes,
        stream_tokens=stream_tokens,
    )  # fmt: skip
    result = run_sim_burst(s, t, out)
    if any("failure" in f for row in result["budgets"].values() for f in row.values()):
        raise SystemExit(1)


if __name__ == "__main__":
    typer.run(main)
