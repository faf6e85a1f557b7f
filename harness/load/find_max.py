"""`serve-load --find-max agents|rate`: the most agents (closed loop) or the highest task rate (open
loop) at which SLO attainment still meets the target, measured level by level, with the simulator's
answer for the same workload and server beside it.

Data flow::

    FindMax(settings) ── bisect_max (search.py) over levels ──┐
       measure(level): probe_config → run_load (one level, shared clock `origin`) → level_summary
                       → attainment (task attainment for agent workloads, request attainment for
                         fixed ones, as serve-load's capacity line); `predict(cfg)` of the same
                         probe config when a predictor is given
       predicted search: the same bisection on `predict` alone (harness/sim: the real Scheduler on
                         a virtual clock priced by a step-time profile; cheap, so it runs in full)
    → RunResult of every measured level (report.write_run: the serve-load folder) + the `search`
      block (summary.json run.search), probes.jsonl (one line per probe, in probe order) and
      plots/search.png (attainment against level, measured and predicted, target drawn in)

Each probe is a fresh level: agents probes have distinct task ids by construction (the id base is
the concurrency); rate probes share one concurrency cap, so each gets its own `task_id_offset` and
never finds an earlier probe's prompts in the server's prefix cache. The simulated probe uses the
same task ids and seed, so the scheduler sees the same requests.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from harness.load.client import RequestRecord
from harness.load.runner import LevelResult, LoadConfig, RunResult, run_load
from harness.load.search import SearchResult, bisect_max
from harness.load.server import ManagedServer

Mode = Literal["agents", "rate"]
RATE_ID_STRIDE = 10_000  # task ids per rate probe (a probe of more tasks would overlap the next)
KEYS = ("median_ttft_ms", "p99_ttft_ms", "median_tpot_ms", "p99_tpot_ms", "output_throughput")


@dataclass(frozen=True)
class Settings:
    mode: Mode
    lo: float
    hi: float
    rel_tol: float = 0.1
    max_probes: int = 6
    tasks: int | None = None  # per probe; agents default: one task per agent (as plan); rate: 4 × cap
    cap: int = 8  # rate mode: concurrency cap (the server's slots)

    def describe(self) -> str:
        unit = "agents" if self.mode == "agents" else "tasks/s"
        tol = "" if self.mode == "agents" else f", to within {self.rel_tol:.0%}"
        return f"{self.mode} in [{self.lo:g}, {self.hi:g}] {unit}{tol}, at most {self.max_probes} probes"


def basis(cfg: LoadConfig) -> str:
    return "slo_attainment" if cfg.workload.single_request else "task_slo_attainment"


def probe_config(base: LoadConfig, s: Settings, level: float, index: int) -> LoadConfig:
    """One level of the search as a LoadConfig (agents: closed loop; rate: open loop under the cap)."""
    if s.mode == "agents":
        n = int(level)
        return replace(base, concurrencies=[n], num_tasks=s.tasks or n, duration_s=None, rate=math.inf)
    return replace(base, concurrencies=[s.cap], num_tasks=s.tasks or 4 * s.cap, duration_s=None, rate=level,
                   task_id_offset=(index + 1) * RATE_ID_STRIDE)  # fmt: skip


def _attainment(summary: dict[str, Any], key: str) -> float | None:
    v = summary.get(key)
    return float(v) if v is not None else None


@dataclass
class FindMax:
    """One search in flight; `run()` returns the aggregated RunResult and fills `block`."""

    base: LoadConfig
    settings: Settings
    server: ManagedServer | None = None
    predict: Callable[[LoadConfig], dict[str, Any]] | None = None
    prediction_basis: str | None = None  # what the predictor prices with (printed beside it)
    on_level_start: Callable[[int, int | None], None] | None = None
    on_record: Callable[[RequestRecord], None] | None = None
    result: RunResult = field(init=False)
    origin: float = field(init=False, default=0.0)  # perf_counter at the search's start (shared clock)
    rows: list[dict[str, Any]] = field(default_factory=list)
    block: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.result = RunResult(self.base)

    class Stopped(Exception):
        """A probe ended partial (server gone, Ctrl-C): the search stops with what it has."""

    def _metrics_block(self, last: dict[str, Any] | None) -> dict[str, Any] | None:
        """The scrape status over every probe so far (the last probe's status, all probes' counts)."""
        if last is None:
            return None
        prev = self.result.server_metrics_block or {}
        return last | {"samples": len(self.result.server_metrics),
                       "scrape_errors": prev.get("scrape_errors", 0) + last["scrape_errors"],
                       "source": last["source"] or prev.get("source")}  # fmt: skip

    def measure(self, level: float) -> float | None:
        from harness.load.report import level_summary

        s, index = self.settings, len(self.rows)
        cfg = probe_config(self.base, s, level, index)
        run = run_load(cfg, self.server, self.on_level_start, self.on_record, origin=self.origin)
        self.base.workload = cfg.workload  # the transport the first probe picked
        self.result.notes += [n for n in run.notes if n not in self.result.notes]
        self.result.server_metrics += run.server_metrics
        self.result.server_metrics_block = self._metrics_block(run.server_metrics_block)
        levels = [replace(lv, rate=level if s.mode == "rate" else None) for lv in run.levels]
        self.result.levels += levels
        if run.partial_reason or not levels:
            self.result.partial_reason, self.result.interrupted = run.partial_reason, run.interrupted
            raise FindMax.Stopped(run.partial_reason)
        summary = level_summary(levels[0], RunResult(cfg))
        att = _attainment(summary, basis(cfg))
        row: dict[str, Any] = {"order": index, "level": level, "mode": s.mode, "attainment": att,
                               "passed": att is not None and att >= cfg.slo.attainment_target,
                               "completed": summary["completed"], "failed": summary["failed"],
                               **{k: summary.get(k) for k in KEYS}}  # fmt: skip
        if self.predict is not None:
            pred = self.predict(cfg)
            row["predicted_attainment"] = _attainment(pred, basis(cfg))
            row |= {f"predicted_{k}": pred.get(k) for k in KEYS}
        self.rows.append(row)
        return att

    def run(self) -> RunResult:
        s, target = self.settings, self.base.slo.attainment_target
        self.origin = time.perf_counter()
        integer = s.mode == "agents"
        try:
            measured = bisect_max(self.measure, target, s.lo, s.hi, integer=integer, rel_tol=s.rel_tol,
                                  max_probes=s.max_probes)  # fmt: skip
        except FindMax.Stopped as e:
            measured = SearchResult(None, f"stopped: {e}")
        predicted: SearchResult | None = None
        if self.predict is not None:  # after the measured search: it fixed the transport the prompts use
            predict = self.predict

            def simulated(level: float) -> float | None:
                return _attainment(predict(probe_config(self.base, s, level, 0)), basis(self.base))

            predicted = bisect_max(simulated, target, s.lo, s.hi, integer=integer, rel_tol=s.rel_tol,
                                   max_probes=max(s.max_probes, 16))  # fmt: skip
        self.result.levels.sort(key=lambda lv: lv.rate if lv.rate is not None else lv.concurrency)
        self.block = {
            "mode": s.mode, "lo": s.lo, "hi": s.hi, "rel_tol": s.rel_tol, "max_probes": s.max_probes,
            "tasks_per_probe": s.tasks, "cap": s.cap if s.mode == "rate" else None,
            "attainment_target": target, "basis": basis(self.base), "settings": s.describe(),
            "measured": {"best": measured.best, "reason": measured.reason}, "probes": self.rows,
            "predicted": None if predicted is None else predicted.to_json() | {"basis": self.prediction_basis},
        }  # fmt: skip
        return self.result


def write_search(block: dict[str, Any], out: Path) -> list[Path]:
    """probes.jsonl and plots/search.png|svg."""
    with (out / "probes.jsonl").open("w", encoding="utf-8") as fh:
        for row in block["probes"]:
            fh.write(json.dumps(row) + "\n")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 4))
    rows = sorted(block["probes"], key=lambda r: r["level"])
    ax.plot([r["level"] for r in rows], [r["attainment"] for r in rows], "o-", label="measured")
    pred = block.get("predicted")
    if pred is not None:  # the simulator at the measured levels and at its own search's levels
        at = {r["level"]: r.get("predicted_attainment") for r in rows} | {p["level"]: p["attainment"] for p in pred["probes"]}
        pts = sorted((lv, a) for lv, a in at.items() if a is not None)
        ax.plot([p[0] for p in pts], [p[1] for p in pts], "x--", label="predicted (plan: simulator + profile)")
    ax.axhline(block["attainment_target"], color="grey", ls=":", lw=1, label="target")
    unit = "agents (closed loop)" if block["mode"] == "agents" else "task rate (/s, open loop)"
    best = block["measured"]["best"]
    pbest = pred["best"] if pred is not None else None
    ax.set(xlabel=unit, ylabel=block["basis"].replace("_", " "), ylim=(-0.02, 1.02),
           title=f"find-max: measured {best if best is not None else 'none'}"
           + (f", predicted {pbest if pbest is not None else 'none'}" if pred is not None else ""))  # fmt: skip
    ax.legend(fontsize=7)
    paths = [out / "plots" / "search.png", out / "plots" / "search.svg"]
    paths[0].parent.mkdir(parents=True, exist_ok=True)
    for p in paths:
        fig.savefig(p, dpi=120, bbox_inches="tight")
    plt.close(fig)
    return paths


def simulator_predictor(shape: Any, pricer: Any) -> Callable[[LoadConfig], dict[str, Any]]:
    """predict(cfg) → the simulated level's probe summary (harness/sim/fleet.probe_summary)."""
    from harness.sim.fleet import probe_summary
    from harness.sim.simulate import simulate

    def predict(cfg: LoadConfig) -> dict[str, Any]:
        result, _ = simulate(replace(cfg, base_url="simulated"), shape, pricer)
        lv: LevelResult = result.levels[0]
        return probe_summary(lv.records, lv.duration_s, cfg.slo, cfg.workload.turns_per_task)

    return predict


def settings_from(mode: str, bounds: str | None, levels: list[int], rel_tol: float, max_probes: int,
                  tasks: int | None) -> Settings:  # fmt: skip
    """The search settings from serve-load's flags; ValueError says what is wrong."""
    if mode not in ("agents", "rate"):
        raise ValueError(f"--find-max takes agents or rate, got {mode!r}")
    if max_probes < 2 or rel_tol <= 0:
        raise ValueError("--max-probes must be ≥ 2 and --search-tolerance > 0")
    if bounds is None:
        if mode == "rate":
            raise ValueError("--find-max rate needs --search-bounds LO,HI (tasks per second)")
        lo, hi = (1.0, float(levels[0])) if len(levels) == 1 else (float(levels[0]), float(levels[-1]))
    else:
        try:
            lo, hi = (float(v) for v in bounds.split(","))
        except ValueError:
            raise ValueError(f"--search-bounds takes LO,HI, got {bounds!r}") from None
    if not 0 < lo <= hi or (mode == "agents" and (lo != int(lo) or hi != int(hi))):
        raise ValueError(f"--search-bounds need 0 < LO ≤ HI{' (whole agents)' if mode == 'agents' else ''}")
    if mode == "agents":
        lo, hi = int(lo), int(hi)
    return Settings(mode, lo, hi, rel_tol, max_probes, tasks, cap=max(levels))  # type: ignore[arg-type]


def plan_predictor(server: dict[str, Any], target: str | None, profile: str | None, api: str,
                   accelerator: bool) -> tuple[Callable[[LoadConfig], dict[str, Any]] | None, str]:  # fmt: skip
    """(predict, what it prices with) for the measured server, or (None, why there is no prediction).

    Default target: "local" (the committed CPU engine profile) for the self-started server on a CPU;
    an accelerator host names its own with --plan-target. The simulated server has the measured one's
    shape (slots, max_len, launch settings: plan --validate's rebuild)."""
    if target == "none":
        return None, "none (--plan-target none)"
    if not server.get("self_started") or "command" not in server:
        return None, "none: a --url server's engine shape is unknown to the simulator"
    if api == "chat":
        return None, "none: the simulator sends token-id prompts (--api chat given)"
    target = target or (None if accelerator else "local")
    if target is None:
        return None, "none: name the accelerator with --plan-target (tpu-v6e, h200, …)"
    from harness.calibrate.main import CalibrateError
    from harness.sim.planner import LOCAL_PROFILE, resolve_target
    from harness.sim.validate import shape_from_server

    try:
        tgt = resolve_target(target, profile, server["model"])
        shape = shape_from_server(server)
        pricer = tgt.pricer_for(shape)
    except (CalibrateError, FileNotFoundError, ValueError) as e:
        return None, f"none: {e}"
    name = profile or (LOCAL_PROFILE if target == "local" else target)
    pv = tgt.profile.provenance if tgt.profile is not None else {}
    prof = (f"profile {name} (fitted on {', '.join(map(str, pv.get('runs', [])))} at revision {pv.get('git_rev')})"
            if tgt.profile is not None else "hardware roofline (a lower bound)")  # fmt: skip
    return simulator_predictor(shape, pricer), f"plan --target {target}, {prof}, server shape as measured"
