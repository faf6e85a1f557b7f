"""`plan --validate RUN_DIR`: re-simulate a measured serve-load run and compare, metric by metric.

Data flow::

    RUN_DIR/summary.json ── run.workload, concurrencies, tasks per level, rate, burstiness, SLO,
                            server {model, max_slots, max_len} (serve-load's self-started server)
      → LoadConfig + ServerShape (the server's other settings from the LaunchSpec in its recorded
        command, else LaunchSpec defaults, as serve-load starts it) → simulate() with the profile's pricer → summary (report.build_summary)
      → one row per (metric, concurrency): measured, predicted, predicted ÷ measured, error %
      → validation.json + the simulated run folder (serve-load's files), so plots overlay

The prompts are the measured run's own (same workload seed and task ids), so the scheduler sees the
same requests; only engine time is modelled.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np

METRICS = ("median_ttft_ms", "median_tpot_ms", "median_e2el_ms", "p99_ttft_ms", "p99_tpot_ms", "p99_e2el_ms",
           "output_throughput")  # fmt: skip
HEADLINE = ("median_ttft_ms", "median_tpot_ms", "median_e2el_ms")  # the cells the error band is judged on


class ValidateError(ValueError):
    """The run folder is not a serve-load run the simulator can reproduce."""


def load_measured(run_dir: Path) -> dict[str, Any]:
    path = Path(run_dir) / "summary.json"
    if not path.is_file():
        raise ValidateError(f"{run_dir}: no summary.json (not a serve-load run folder)")
    summary = json.loads(path.read_text(encoding="utf-8"))
    server = summary["run"].get("server") or {}
    if not server.get("self_started") or "max_slots" not in server:
        raise ValidateError(f"{run_dir}: server settings unknown (--url run); cannot rebuild its engine")
    if summary["run"]["workload"].get("kind") in ("trace", "sessions"):
        raise ValidateError(f"{run_dir}: a trace replay; the simulator reproduces serve-load's own workloads")
    if summary["run"]["workload"].get("api") != "tokens":
        raise ValidateError(f"{run_dir}: chat transport; the simulator reproduces token-id runs only")
    return summary


def setup_from(summary: dict[str, Any]) -> tuple[Any, Any]:
    """(LoadConfig, ServerShape) of a measured run."""
    from harness.load.runner import LoadConfig
    from harness.load.slo import SLO
    from harness.load.workloads import WorkloadConfig

    run, server = summary["run"], summary["run"]["server"]
    wl = {k: v for k, v in run["workload"].items() if k != "max_context"}
    slo = {k: v for k, v in run["slo"].items()}
    rate = run["request_rate"]
    levels = summary["levels"]
    cfg = LoadConfig(
        base_url="simulated", workload=WorkloadConfig(**wl), concurrencies=[lv["concurrency"] for lv in levels],
        num_tasks=run["num_tasks_per_level"], duration_s=run["duration_s_per_level"],
        tasks_per_conc=_tasks_per_conc(summary), rate=math.inf if rate == "inf" else float(rate),
        burstiness=float(run["burstiness"]), slo=SLO(**slo),
    )  # fmt: skip
    return cfg, shape_from_server(server)


def shape_from_server(server: dict[str, Any]) -> Any:
    """The ServerShape of serve-load's self-started server (its `server` block: model, max_slots,
    max_len and the launch command, whose last argument is the LaunchSpec JSON)."""
    from g4bench.server.launch import LaunchSpec
    from harness.sim.simulate import ServerShape

    cmd = server.get("command") or []
    launched = cmd and str(cmd[-1]).startswith("{")
    spec = LaunchSpec.from_json(cmd[-1]) if launched else LaunchSpec()
    # a server launched before the mixed step existed ran one prefill chunk per loop turn
    policy = spec.prefill_policy or ("chunk" if launched and "prefill_policy" not in cmd[-1] else None)
    return ServerShape(model=server["model"], max_slots=int(server["max_slots"]), max_len=int(server["max_len"]),
                       kv_dtype=spec.kv_dtype, sliding_kv=spec.sliding_kv, chunk_size=spec.chunk_size,
                       kv_layout=spec.kv_layout, cached_windows=spec.cached_windows, max_waiting=spec.max_waiting,
                       max_batched_tokens=spec.max_batched_tokens, prefill_policy=policy)  # fmt: skip


def _tasks_per_conc(summary: dict[str, Any]) -> int:
    """Tasks per concurrent stream when the run gave neither a count nor a duration (CPU defaults)."""
    lv = summary["levels"][0]
    turns = max(
        1,
        int(summary["run"]["workload"].get("turns", 1))
        if summary["run"]["workload"]["kind"] != "fixed"
        else 1,
    )
    return max(1, round((lv["completed"] + lv["failed"]) / turns / lv["concurrency"]))


def compare(
    measured: dict[str, Any], predicted: dict[str, Any], metrics: tuple[str, ...] = METRICS
) -> list[dict[str, Any]]:
    """One row per (metric, concurrency) present in both summaries."""
    pred = {lv["concurrency"]: lv for lv in predicted["levels"]}
    rows = []
    for lv in measured["levels"]:
        p = pred.get(lv["concurrency"])
        for m in metrics:
            a, b = lv.get(m), (p or {}).get(m)
            if a is None or b is None or a == 0:
                continue
            rows.append({"metric": m, "concurrency": lv["concurrency"], "measured": float(a),
                         "predicted": float(b), "ratio": float(b) / float(a),
                         "error_pct": (float(b) / float(a) - 1) * 100})  # fmt: skip
    return rows


def headline(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Median and max |error| over the TTFT p50, TPOT p50 and E2E p50 cells."""
    err = np.array([abs(r["error_pct"]) for r in rows if r["metric"] in HEADLINE])
    if not len(err):
        return {"cells": 0}
    return {
        "cells": int(len(err)),
        "median_abs_error_pct": float(np.median(err)),
        "max_abs_error_pct": float(err.max()),
    }


def validate(run_dir: Path, pricer_for: Any, out: Path | None) -> dict[str, Any]:
    """Re-simulate RUN_DIR; `pricer_for(shape)` builds the pricer for the run's engine shape.
    Writes the simulated run (serve-load's files) and validation.json under `out` when given."""
    from harness.load.report import build_summary, write_run
    from harness.sim.simulate import simulate

    measured = load_measured(run_dir)
    cfg, shape = setup_from(measured)
    pricer = pricer_for(shape)
    result, _ = simulate(cfg, shape, pricer)
    meta = {"run_id": f"sim-{Path(run_dir).name}", "argv": ["g4bench", "plan", "--validate", str(run_dir)],
            "model_name": measured["run"]["model_name"], "server": measured["run"]["server"] | {"simulated": True},
            "env": measured["run"].get("env")}  # fmt: skip
    predicted = write_run(result, out, meta) if out is not None else build_summary(result, meta)
    rows = compare(measured, predicted)
    doc = {"run_dir": str(run_dir), "workload": cfg.workload.kind, "rows": rows, "headline": headline(rows),
           "pricing": dict(pricer.basis), "error_band_pct": pricer.error_band_pct()}  # fmt: skip
    if out is not None:
        (out / "validation.json").write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
    doc["measured"], doc["predicted"] = measured, predicted
    return doc
