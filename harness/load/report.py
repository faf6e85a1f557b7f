"""Turn a `RunResult` into the run folder and the closing table.

results/<run-id>/
  requests.jsonl  one row per request (every record, failures included) with its level, derived
                  ttft/tpot/e2el ms, ITL gaps and the prefix-cache state of its turn
  summary.json    run block (command, workload, server, SLO, partial flag and reason, notes, checks,
                  env) + one block per concurrency level with vLLM's field names + capacity
  results.jsonl   one harness record (kind "serve-load") per level, so `g4bench gate` can compare runs
  summary.csv     those records flattened (harness.results.write_summary)
  command.txt, env.json, plots/*.png|svg
Partial runs (server died, Ctrl-C) are written the same way with `partial: true` and the reason.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from harness.load import checks, metrics
from harness.load.runner import LevelResult, RunResult

# Fields the gate compares by default (direction of "better").
GATE_METRICS = {
    "median_ttft_ms": "lower",
    "median_tpot_ms": "lower",
    "output_throughput": "higher",
    "request_goodput": "higher",
}


def _clean(x: Any) -> Any:
    """JSON-safe: NaN/inf → None, recursively."""
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: _clean(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_clean(v) for v in x]
    return x


def level_summary(level: LevelResult, result: RunResult) -> dict[str, Any]:
    cfg = result.cfg
    recs = level.records
    out: dict[str, Any] = {
        "concurrency": level.concurrency,
        "max_concurrency": level.concurrency,
        "request_rate": cfg.rate if math.isfinite(cfg.rate) else "inf",
        "burstiness": cfg.burstiness,
        "partial": level.partial_reason is not None,
    }
    out |= metrics.summarize_requests(recs, level.duration_s, cfg.slo)
    block, _ = checks.run_checks(recs)
    out["checks"] = block
    out["warnings"] = out["warnings"] + checks.check_warnings(block)
    if cfg.workload.kind != "fixed":
        tasks = metrics.task_table(recs, cfg.workload.turns_per_task, cfg.slo)
        out |= metrics.summarize_tasks(tasks, level.duration_s)
        out["warnings"] += out.pop("task_warnings")
        out["by_turn"] = metrics.by_turn(recs)
        out["ttft_vs_uncached"] = metrics.ttft_vs_uncached(recs)
    return out


def build_summary(result: RunResult, meta: dict[str, Any]) -> dict[str, Any]:
    """The whole summary.json document (`meta`: model_name, url, server, argv, env, run_id)."""
    cfg = result.cfg
    levels = [level_summary(lv, result) for lv in result.levels]
    agent = cfg.workload.kind != "fixed"
    att_key = "task_slo_attainment" if agent else "slo_attainment"
    cap = metrics.max_concurrency_at_attainment(
        [(lv["concurrency"], lv.get(att_key)) for lv in levels if not lv["partial"]],
        cfg.slo.attainment_target,
    )
    run = {
        "run_id": meta.get("run_id"),
        "command": meta.get("argv"),
        "model_name": meta.get("model_name"),
        "base_url": cfg.base_url,
        "server": meta.get("server"),
        "workload": cfg.workload.__dict__ | {"max_context": cfg.workload.max_context},
        "concurrencies": cfg.concurrencies,
        "num_tasks_per_level": cfg.num_tasks,
        "duration_s_per_level": cfg.duration_s,
        "request_rate": cfg.rate if math.isfinite(cfg.rate) else "inf",
        "burstiness": cfg.burstiness,
        "timeout_s": cfg.timeout_s,
        "slo": cfg.slo.to_json(),
        "partial": result.partial_reason is not None,
        "partial_reason": result.partial_reason,
        "notes": result.notes,
        "env": meta.get("env"),
        "ttft_definition": "send -> first chunk with generated output (role-only chunks excluded)",
    }
    capacity = {
        "max_concurrency_at_attainment": cap,
        "attainment_target": cfg.slo.attainment_target,
        "basis": att_key,
    }
    return _clean({"run": run, "levels": levels, "capacity": capacity})


def request_rows(result: RunResult) -> list[dict[str, Any]]:
    rows = []
    for lv in result.levels:
        _, states = checks.run_checks(lv.records)
        for r in lv.records:
            row = {"concurrency": lv.concurrency} | r.to_json()
            row |= {
                "ttft_ms": metrics.ttft_ms(r),
                "tpot_ms": metrics.tpot_ms(r),
                "e2el_ms": metrics.e2el_ms(r),
                "client_queue_ms": r.queue_s * 1e3,
                "itl_ms": metrics.itls_ms(r),
                "cache_state": states.get(r.request_id),
                "good": metrics.is_good(r, result.cfg.slo),
            }
            rows.append(_clean(row))
    return rows


def level_record(
    level: dict[str, Any], summary: dict[str, Any], run_id: str, env: dict[str, Any]
) -> dict[str, Any]:
    """One harness result record (kind serve-load) for a level: scalars only, config separate."""
    from harness.results import make_record

    run = summary["run"]
    skip = {"checks", "by_turn", "ttft_vs_uncached", "warnings", "failed_by_kind"}
    fields = {k: v for k, v in level.items() if k not in skip and not isinstance(v, dict | list)}
    fit = level.get("ttft_vs_uncached") or {}
    fields["ttft_ms_per_uncached_token"] = fit.get("ms_per_uncached_token")
    config = {
        "workload": run["workload"],
        "model_name": run["model_name"],
        "concurrency": level["concurrency"],
        "request_rate": run["request_rate"],
        "burstiness": run["burstiness"],
        "slo": run["slo"],
    }
    name = f"{run['workload']['kind']}-c{level['concurrency']}"
    gate = {k: {"direction": d} for k, d in GATE_METRICS.items() if fields.get(k) is not None}
    return make_record("serve-load", name, run_id=run_id, env=env, config=config, gate_metrics=gate, **fields)


def write_run(result: RunResult, out: Path, meta: dict[str, Any]) -> dict[str, Any]:
    """Write every file of the run folder; returns the summary document."""
    from harness.results import append_record, write_command, write_env, write_summary

    out.mkdir(parents=True, exist_ok=True)
    summary = build_summary(result, meta)
    write_command(out, meta.get("argv") or [])
    write_env(out, {"env": meta.get("env"), "settings": summary["run"]})
    with (out / "requests.jsonl").open("w", encoding="utf-8") as fh:
        for row in request_rows(result):
            fh.write(json.dumps(row, separators=(",", ":")) + "\n")
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    records_path = out / "results.jsonl"
    if records_path.exists():
        records_path.unlink()
    records = [
        level_record(lv, summary, meta.get("run_id") or out.name, meta["env"]) for lv in summary["levels"]
    ]
    for rec in records:
        append_record(out, rec)
    if records:
        write_summary(out, records)
    from harness.load.plots import write_plots

    summary["plots"] = [str(p) for p in write_plots(summary, out / "plots")]
    return summary


def summary_table(summary: dict[str, Any]) -> Any:
    """A rich Table of the per-level headline numbers (the closing note's table)."""
    from rich.table import Table

    def f(v: Any, nd: int = 1) -> str:
        return "—" if v is None else f"{v:.{nd}f}" if isinstance(v, float) else str(v)

    agent = summary["run"]["workload"]["kind"] != "fixed"
    t = Table(title=f"serve-load · {summary['run']['workload']['kind']} · {summary['run']['model_name']}")
    cols = [
        "conc",
        "done/fail",
        "TTFT p50",
        "TTFT p99",
        "TPOT p50",
        "ITL p50",
        "E2E p50",
        "out tok/s",
        "goodput/s",
        "attain",
    ]
    if agent:
        cols += ["task p50 s", "task attain", "ms/uncached tok"]
    for c in cols:
        t.add_column(c, justify="right")
    for lv in summary["levels"]:
        row = [
            str(lv["concurrency"]), f"{lv['completed']}/{lv['failed']}",
            f(lv.get("median_ttft_ms")), f(lv.get("p99_ttft_ms")), f(lv.get("median_tpot_ms"), 2),
            f(lv.get("median_itl_ms"), 2), f(lv.get("median_e2el_ms")), f(lv.get("output_throughput")),
            f(lv.get("request_goodput"), 3), f(lv.get("slo_attainment"), 2),
        ]  # fmt: skip
        if agent:
            done = lv.get("median_task_completion_ms")
            fit = lv.get("ttft_vs_uncached") or {}
            row += [f(done / 1e3 if done is not None else None, 2), f(lv.get("task_slo_attainment"), 2),
                    f(fit.get("ms_per_uncached_token"), 3)]  # fmt: skip
        t.add_row(*row)
    return t
