"""Fleet sizing: the most concurrent agents one chip serves at the SLO attainment target, per knob
setting, then chips and dollars for N agents.

Data flow, for each knob setting (KV dtype × ring/full sliding KV × max slots)::

    memory ceiling  = admission arithmetic (harness/capacity/admission.py): ⌊(limit − overhead) ÷ row(C)⌋
                      row(C) = cache bytes of one agent at the workload's largest context C,
                      overhead = a capacity run's compiled non-KV bytes when given, else the weights
    SLO ceiling     = binary search over n ∈ [1, memory ceiling]: simulate n agents (one task each,
                      closed loop, a server of min(n, max slots) slots) and keep the largest n whose
                      task SLO attainment (fixed workload: request attainment) ≥ the target
    agents per chip = the SLO ceiling; binding constraint = "memory" when the search hit the memory
                      ceiling, else the first objective whose attainment fell below the target at
                      n + 1 (TTFT, TPOT, E2E, task)
    chips(N)        = ⌈N ÷ agents per chip⌉
    $/M output tok  = $/hour ÷ (output tok/s at agents per chip × 3600) × 10⁶
    $/agent-hour    = $/hour ÷ agents per chip

Attainment is assumed to fall as agents are added (it does in every simulated curve here: more
agents share one decode batch and one prefill queue); each probed point is kept for the frontier
plot (agents per chip vs TPOT p50 / p99 per setting).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from harness.load.runner import LoadConfig
from harness.load.slo import SLO
from harness.load.workloads import WorkloadConfig
from harness.sim.simulate import ServerShape

SEARCH_CAP = 1024  # agents per chip probed at most (a chip far past this is not an agent-serving question)


@dataclass(frozen=True)
class Knobs:
    kv_dtype: str
    sliding_kv: str
    max_slots: int | None  # None: as many slots as agents

    @property
    def label(self) -> str:
        slots = "slots=agents" if self.max_slots is None else f"slots≤{self.max_slots}"
        return f"kv-{self.kv_dtype}/{self.sliding_kv}/{slots}"


@dataclass
class Probe:
    agents: int
    attainment: float
    summary: dict[str, Any]  # the simulated level's summary (serve-load schema)


@dataclass
class Sizing:
    knobs: Knobs
    memory_ceiling: int
    overhead_source: str
    agents_per_chip: int
    binding: str
    probes: list[Probe] = field(default_factory=list)

    @property
    def at_ceiling(self) -> Probe | None:
        return next((p for p in self.probes if p.agents == self.agents_per_chip), None)


def memory_ceiling(model: str, knobs: Knobs, ctx: int, limit: int, overhead: int) -> int:
    """Agents whose KV at context `ctx` fits beside `overhead` bytes (admission.admission_cell)."""
    from harness.capacity.admission import admission_cell, row_bytes

    row = row_bytes(model, knobs.kv_dtype, knobs.sliding_kv, ctx)
    return int(admission_cell(overhead, row, 1, limit)["max_agents"])


def _attainment(level: dict[str, Any], agent: bool) -> float:
    v = level.get("task_slo_attainment" if agent else "slo_attainment")
    return float(v) if v is not None else 0.0


def _failing(level: dict[str, Any], target: float, agent: bool) -> str:
    """What binds at this level: the objective the most turns (or tasks) miss, and the attainment."""
    by = level["attainment_by_objective"]
    worst = min(by, key=lambda k: by[k])
    basis = "task" if agent else "request"
    return (
        f"SLO: {worst} ({(1 - by[worst]) * 100:.1f}% miss it; {basis} attainment "
        f"{_attainment(level, agent):.3f} < {target:g} at the next agent count)"
    )


def probe_summary(records: list[Any], duration_s: float, slo: SLO, turns: int) -> dict[str, Any]:
    """The level figures the search needs, in serve-load's field names (report.level_summary also
    bootstraps every percentile's CI, which costs more than the simulation at 64 agents)."""
    import numpy as np

    from harness.load import metrics

    ok = [r for r in records if r.ok]

    def pct(values: list[float | None], q: float) -> float | None:
        v = [x for x in values if x is not None]
        return float(np.percentile(v, q)) if v else None

    ttft = [metrics.ttft_ms(r) for r in ok]
    tpot = [metrics.tpot_ms(r) for r in ok]
    e2el = [metrics.e2el_ms(r) for r in ok]
    tasks = metrics.task_table(records, turns, slo)

    def share(values: list[float | None], bound: float | None) -> float:
        if bound is None or not records:
            return 1.0
        return sum(v is not None and v <= bound for v in values) / len(records)

    by = {"TTFT": share(ttft, slo.ttft_ms), "TPOT": share([v or 0.0 for v in tpot], slo.tpot_ms),
          "E2E": share(e2el, slo.e2el_ms)}  # fmt: skip
    if slo.task_e2e_ms is not None and tasks:
        done = [t["completion_ms"] for t in tasks]
        by["task E2E"] = sum(d is not None and d <= slo.task_e2e_ms for d in done) / len(tasks)
    return {
        "median_ttft_ms": pct(ttft, 50), "p99_ttft_ms": pct(ttft, 99), "median_tpot_ms": pct(tpot, 50),
        "p99_tpot_ms": pct(tpot, 99), "median_e2el_ms": pct(e2el, 50),
        "output_throughput": sum(r.output_tokens for r in ok) / duration_s if duration_s > 0 else None,
        "slo_attainment": sum(metrics.is_good(r, slo) for r in records) / len(records) if records else None,
        "task_slo_attainment": sum(t["good"] for t in tasks) / len(tasks) if tasks else None,
        "attainment_by_objective": by,
    }  # fmt: skip


def size_one(
    knobs: Knobs,
    workload: WorkloadConfig,
    slo: SLO,
    model: str,
    ceiling: int,
    overhead_source: str,
    run_agents: Callable[[int, ServerShape], dict[str, Any]],
    max_len: int,
) -> Sizing:
    """Binary search for the most agents at the attainment target under the memory ceiling."""
    agent = workload.kind != "fixed"
    probes: dict[int, Probe] = {}

    def probe(n: int) -> Probe:
        if n not in probes:
            slots = n if knobs.max_slots is None else min(n, knobs.max_slots)
            shape = ServerShape(model=model, max_slots=slots, max_len=max_len, kv_dtype=knobs.kv_dtype,
                                sliding_kv=knobs.sliding_kv, max_waiting=max(64, n))  # fmt: skip
            level = run_agents(n, shape)
            probes[n] = Probe(n, _attainment(level, agent), level)
        return probes[n]

    hi_cap = min(ceiling, SEARCH_CAP)
    if hi_cap < 1:
        return Sizing(knobs, ceiling, overhead_source, 0, "memory: one agent's KV does not fit", [])
    if probe(1).attainment < slo.attainment_target:
        return Sizing(knobs, ceiling, overhead_source, 0, _failing(probe(1).summary, slo.attainment_target, agent),
                      sorted(probes.values(), key=lambda p: p.agents))  # fmt: skip
    lo, hi = 1, 2
    while hi <= hi_cap and probe(hi).attainment >= slo.attainment_target:
        lo, hi = hi, hi * 2
    hi = min(hi, hi_cap + 1)
    while hi - lo > 1:  # invariant: lo meets the target, hi does not (or is past the memory ceiling)
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if probe(mid).attainment >= slo.attainment_target else (lo, mid)
    if lo >= hi_cap:
        binding = (
            "memory (KV of one more agent does not fit)" if hi_cap == ceiling else f"search cap {SEARCH_CAP}"
        )
    else:
        binding = _failing(probe(lo + 1).summary, slo.attainment_target, agent)
    return Sizing(
        knobs, ceiling, overhead_source, lo, binding, sorted(probes.values(), key=lambda p: p.agents)
    )


def agents_runner(
    workload: WorkloadConfig, slo: SLO, pricer_for: Callable[[ServerShape], Any]
) -> Callable[[int, ServerShape], dict[str, Any]]:
    """run(n, shape) → the probe summary of n simulated agents, one task each, closed loop."""
    from harness.sim.simulate import simulate

    def run(n: int, shape: ServerShape) -> dict[str, Any]:
        cfg = LoadConfig(base_url="simulated", workload=workload, concurrencies=[n], num_tasks=n, slo=slo)
        result, _ = simulate(cfg, shape, pricer_for(shape))
        lv = result.levels[0]
        return probe_summary(lv.records, lv.duration_s, slo, workload.turns_per_task)

    return run


def costs_of(sizing: Sizing, usd_per_hour: float | None, agents_total: int) -> dict[str, Any]:
    """Chips for `agents_total` and the dollar figures at the sized point."""
    n = sizing.agents_per_chip
    top = sizing.at_ceiling
    tok_s = top.summary.get("output_throughput") if top is not None else None
    out: dict[str, Any] = {
        "chips": math.ceil(agents_total / n) if n else None,
        "output_tok_per_s_per_chip": tok_s,
    }
    out["usd_per_m_output_tokens"] = (usd_per_hour / (tok_s * 3600) * 1e6) if usd_per_hour and tok_s else None
    out["usd_per_agent_hour"] = usd_per_hour / n if usd_per_hour and n else None
    return out


def knob_grid(
    kv_dtypes: tuple[str, ...], sliding: tuple[str, ...], slots: tuple[int | None, ...]
) -> list[Knobs]:
    return [Knobs(k, s, m) for k in kv_dtypes for s in sliding for m in slots]
