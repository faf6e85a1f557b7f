"""Turn a `RunResult` into the run folder and the closing table.

results/<run-id>/
  requests.jsonl  one row per request (every record, failures included) with its level, derived
                  ttft/tpot/e2el ms, ITL gaps and the prefix-cache state of its turn
  summary.json    run block (command, workload, server, SLO, partial flag and reason, notes, checks,
                  env) + one block per concurrency level with vLLM's field names + capacity
  results.jsonl   one harness record (kind "serve-load") per level, so `g4bench gate` can compare runs
  summary.csv     those records flattened (harness.results.write_summary)
  metrics.jsonl   the server's /metrics every period (server_metrics.py), or one line saying it
                  was unavailable; plots/timeline.png draws it against time beside client latencies
  command.txt, env.json, plots/*.png|svg
Trace replays add a `trace` block to the run (schedule fidelity, implied vs server-reported cache
reuse; replay.py) and `g4bench serve-load --find-max` a `search` block (search.py).
Partial runs (server died, Ctrl-C) are written the same way with `partial: true` and the reason.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from harness.load import checks, metrics
from harness.load.decode_ratio import GOAL, compare, decode_window
from harness.load.runner import LevelResult, RunResult
from harness.results import is_failure

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
        "request_rate": _rate(level.rate if level.rate is not None else cfg.rate),
        "burstiness": cfg.burstiness,
        "partial": level.partial_reason is not None,
        "start_s": level.start_s,
    }
    out |= metrics.summarize_requests(recs, level.duration_s, cfg.slo)
    out |= decode_window(recs, level.concurrency)
    block, _ = checks.run_checks(recs)
    out["checks"] = block
    if not cfg.workload.single_request:
        tasks = metrics.task_table(recs, cfg.task_turns or cfg.workload.turns_per_task, cfg.slo)
        out |= metrics.summarize_tasks(tasks, level.duration_s)
        out["few_samples"] |= out.pop("task_few_samples")
        out["by_turn"] = metrics.by_turn(recs)
        out["ttft_vs_uncached"] = metrics.ttft_vs_uncached(recs)
        shared = cfg.workload.prefix_len if cfg.workload.kind == "shared-prefix" else 0
        out |= metrics.prefix_reuse(recs, out["by_turn"], shared_prefix=shared)
    if level.tool_calls is not None:
        out["tool_calls"] = level.tool_calls
    if level.speculation is not None:
        out["speculation"] = level.speculation
    few = metrics.few_samples_line(out["few_samples"])
    out["warnings"] = ([few] if few else []) + checks.check_warnings(block)
    return out


def build_summary(result: RunResult, meta: dict[str, Any]) -> dict[str, Any]:
    """The whole summary.json document (`meta`: model_name, url, server, argv, env, run_id)."""
    cfg = result.cfg
    levels = [level_summary(lv, result) for lv in result.levels]
    agent = not cfg.workload.single_request
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
        "workload": cfg.workload.__dict__
        | {"max_context": (result.trace or {}).get("max_context", cfg.workload.max_context)},
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
        "server_metrics": result.server_metrics_block,
    }
    if result.trace is not None:
        run["trace"] = result.trace
    if meta.get("search") is not None:
        run["search"] = meta["search"]
    baseline = meta.get("engine_baseline")
    if baseline is not None and not is_failure(baseline):
        for lv in levels:
            block = compare(lv, baseline)
            lv["engine_decode_tok_per_s"] = block["engine_tok_per_s"]
            lv["server_over_engine_decode"] = block["ratio"]
    capacity = {
        "max_concurrency_at_attainment": cap,
        "attainment_target": cfg.slo.attainment_target,
        "basis": att_key,
    }
    out = {"run": run, "levels": levels, "capacity": capacity}
    if baseline is not None:
        out["engine_baseline"] = baseline
    return _clean(out)


def request_rows(result: RunResult) -> list[dict[str, Any]]:
    rows = []
    for lv in result.levels:
        _, states = checks.run_checks(lv.records)
        for r in lv.records:
            row = {"concurrency": lv.concurrency, "level_start_s": lv.start_s} | r.to_json()
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
    skip = {"checks", "by_turn", "ttft_vs_uncached", "warnings", "failed_by_kind", "few_samples"}
    fields = {k: v for k, v in level.items() if k not in skip and not isinstance(v, dict | list)}
    fit = level.get("ttft_vs_uncached") or {}
    fields["ttft_ms_per_uncached_token"] = fit.get("ms_per_uncached_token")
    config = {
        "workload": run["workload"],
        "model_name": run["model_name"],
        "concurrency": level["concurrency"],
        "request_rate": level["request_rate"],
        "burstiness": run["burstiness"],
        "slo": run["slo"],
    }
    name = f"{run['workload']['kind']}-c{level['concurrency']}"
    if (run.get("search") or {}).get("mode") == "rate":  # every probe at one concurrency cap
        name += f"-r{level['request_rate']:g}"
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
    write_metrics(result, out)
    from harness.load.plots import write_plots, write_timeline

    plots = write_plots(summary, out / "plots") + write_timeline(out, out / "plots")
    summary["plots"] = [str(p) for p in plots]
    return summary


def write_metrics(result: RunResult, out: Path) -> None:
    """metrics.jsonl: one row per /metrics scrape, or one line saying why there are none."""
    block = result.server_metrics_block
    if block is None or block["status"] == "off":
        return
    with (out / "metrics.jsonl").open("w", encoding="utf-8") as fh:
        if block["status"] != "ok":
            fh.write(json.dumps({"available": False, "reason": block["reason"]}) + "\n")
        for row in result.server_metrics:
            fh.write(json.dumps(_clean(row), separators=(",", ":")) + "\n")


def _rate(rate: float) -> float | str:
    return rate if math.isfinite(rate) else "inf"


def _fmt(v: Any, nd: int | None = None) -> str:
    """A table cell: "—" for missing; floats with `nd` decimals, or 0 at ≥ 100 and 1 below."""
    if v is None:
        return "—"
    if isinstance(v, float):
        return f"{v:.{nd if nd is not None else (0 if abs(v) >= 100 else 1)}f}"
    return str(v)


def _table(title: str, cols: list[str], rows: list[list[str]]) -> Any:
    from rich import box
    from rich.table import Table

    t = Table(title=title, box=box.SIMPLE_HEAD, title_justify="left", pad_edge=False)
    for c in cols:
        t.add_column(c, justify="right", no_wrap=True)
    for row in rows:
        t.add_row(*row)
    return t


def summary_tables(summary: dict[str, Any]) -> list[Any]:
    """The closing note's tables, each narrow enough for an 80-column terminal: latency
    percentiles (ms), throughput and goodput, and for agent runs the task and prefix-cache view."""
    run, levels = summary["run"], summary["levels"]
    head = f"serve-load · {run['workload']['kind']} · {run['model_name']}"
    lat = []
    for lv in levels:
        row = [str(lv["concurrency"])]
        for m in ("ttft", "tpot", "itl", "e2el"):
            row += [_fmt(lv.get(f"median_{m}_ms")), _fmt(lv.get(f"p99_{m}_ms"))]
        lat.append(row)
    cols = ["conc", "TTFT\np50", "\np99", "TPOT\np50", "\np99", "ITL\np50", "\np99", "E2E\np50", "\np99"]
    tables = [_table(f"{head} · latency (ms)", cols, lat)]
    thr = [[str(lv["concurrency"]), f"{lv['completed']}/{lv['failed']}", _fmt(lv.get("output_throughput")),
            _fmt(lv.get("decode_tok_per_s_all_streams")), _fmt(lv.get("request_goodput"), 3),
            _fmt(lv.get("slo_attainment"), 2)] for lv in levels]  # fmt: skip
    cols = ["conc", "done/\nfailed", "output\ntok/s", "decode\ntok/s*", "goodput\nreq/s", "SLO\nattain"]
    tables.append(_table("throughput (* while every stream decodes)", cols, thr))
    if run["workload"]["kind"] not in ("fixed", "trace"):
        agent = []
        for lv in levels:
            done = lv.get("median_task_completion_ms")
            fit = lv.get("ttft_vs_uncached") or {}
            agent.append([
                str(lv["concurrency"]), _fmt(done / 1e3 if done is not None else None, 1),
                _fmt(lv.get("task_slo_attainment"), 2), _fmt(lv.get("prompt_tokens_computed")),
                _fmt(lv.get("prompt_tokens_reused")), _fmt(lv.get("computed_over_new_prompt_tokens"), 2),
                _fmt(lv.get("ttft_last_turn_over_first"), 2), _fmt(fit.get("ms_per_uncached_token"), 2),
            ])  # fmt: skip
        cols = ["conc", "task\np50 s", "task\nSLO", "prompt\ncomputed", "prompt\nreused", "comp.\n÷ new",
                "TTFT\nlast÷1st", "TTFT ms/\nuncached"]  # fmt: skip
        tables.append(_table("agent tasks; prompt tokens computed vs reused (prefix cache)", cols, agent))
    return tables


def print_closing(console: Any, summary: dict[str, Any], run_dir: Path) -> None:
    """The end of a serve-load run on stderr: tables, one warning line per level and check, the
    agent ratios, the engine-baseline ratio, capacity, and the run folder last."""
    for t in summary_tables(summary):
        console.print(t)
    for lv in summary["levels"]:
        c = lv["concurrency"]
        for w in lv["warnings"]:
            console.print(f"  [yellow]c={c}: {w}[/yellow]")
        if (
            lv.get("computed_over_new_prompt_tokens") is not None
            or lv.get("ttft_last_turn_over_first") is not None
        ):
            console.print(
                f"  c={c}: prompt tokens computed {_fmt(lv.get('prompt_tokens_computed'))} "
                f"vs reused {_fmt(lv.get('prompt_tokens_reused'))}; computed ÷ new "
                f"{_fmt(lv.get('computed_over_new_prompt_tokens'), 3)} (new {_fmt(lv.get('new_prompt_tokens'))}); "
                f"TTFT turn {lv.get('ttft_last_turn')} ÷ turn 0 = {_fmt(lv.get('ttft_last_turn_over_first'), 2)} "
                f"({_fmt(lv.get('ttft_last_turn_ms'))} / {_fmt(lv.get('ttft_first_turn_ms'))} ms)"
            )
        if lv.get("shared_prefix_tokens") and lv.get("ttft_first_turn_rest_max_ms") is not None:
            console.print(
                f"  c={c}: first-turn TTFT: first agent {_fmt(lv.get('ttft_first_turn_lead_ms'))} ms "
                f"(computes the shared prefix), the others median "
                f"{_fmt(lv.get('ttft_first_turn_rest_median_ms'))} / max {_fmt(lv.get('ttft_first_turn_rest_max_ms'))} ms"
            )
        spec = lv.get("speculation")
        if spec is not None:
            console.print(
                f"  c={c}: speculation: {int(spec['verify_rows'])} verify rows, acceptance rate "
                f"{_fmt(spec['acceptance_rate'], 3)}, mean acceptance length {_fmt(spec['mean_acceptance_length'], 2)} tokens"
            )
        tools = lv.get("tool_calls")
        if tools is not None:
            console.print(
                f"  c={c}: tool calls over {tools['replies']} replies: present {_fmt(tools['call_rate'], 3)}, "
                f"parsed {_fmt(tools['parse_rate'], 3)}, valid {_fmt(tools['valid_rate'], 3)}"
                + (f"; first errors: {tools['first_errors']}" if tools["first_errors"] else "")
            )
    base = summary.get("engine_baseline")
    if base is not None and is_failure(base):
        console.print(
            f"  [red]engine baseline failed:[/red] {base['failure'].get('kind')}: {base['failure'].get('detail')}"
        )
    elif base is not None:
        case = base.get("case", {})
        console.print(
            f"  engine decode step ({base.get('case_name')}, batch {case.get('batch')}, KV {case.get('ctx')}): "
            f"median {_fmt(base['step_ms_median'], 2)} ms of {len(base['step_ms_samples'])} "
            f"(IQR {_fmt(float(np.percentile(base['step_ms_samples'], 25)), 1)}–"
            f"{_fmt(float(np.percentile(base['step_ms_samples'], 75)), 1)} ms)"
        )
        for lv in summary["levels"]:
            console.print(
                f"  c={lv['concurrency']}: server decode {_fmt(lv.get('decode_tok_per_s_all_streams'))} tok/s "
                f"(window {_fmt(lv.get('decode_window_s'), 2)} s, {lv.get('decode_window_tokens')} tokens) ÷ engine "
                f"{_fmt(lv.get('engine_decode_tok_per_s'))} tok/s = {_fmt(lv.get('server_over_engine_decode'), 3)} "
                f"(goal ≥ {GOAL:g})"
            )
    print_trace(console, summary["run"])
    if summary["run"].get("search") is not None:
        print_search(console, summary["run"]["search"])
    cap = summary["capacity"]
    if summary["run"].get("trace") is None:  # a trace's one level says nothing about concurrency
        console.print(
            f"  capacity: largest concurrency with {cap['basis']} ≥ {cap['attainment_target']:g}: "
            f"{cap['max_concurrency_at_attainment']}"
        )
    console.print(f"  run folder: {run_dir}", soft_wrap=True)  # one line, copyable


def _pct(v: float | None) -> str:
    return "—" if v is None else f"{v * 100:.1f}%"


def print_search(console: Any, block: dict[str, Any]) -> None:
    """find-max's probe table (measured beside plan's prediction) and both answers."""
    from harness.tables import fitted_table

    def f(v: Any, nd: int = 0) -> str:
        return "—" if v is None else f"{v:.{nd}f}" if isinstance(v, float) else str(v)

    pred = block.get("predicted") is not None
    cols = ["level", "attain", "TTFT p50", "TPOT p50"] + (["pred attain", "pred TTFT", "pred TPOT"] if pred else [])
    rows = []
    for r in sorted(block["probes"], key=lambda r: r["level"]):
        row = [f"{r['level']:g}", f(r["attainment"], 2), f(r["median_ttft_ms"]), f(r["median_tpot_ms"])]
        if pred:
            row += [f(r.get("predicted_attainment"), 2), f(r.get("predicted_median_ttft_ms")),
                    f(r.get("predicted_median_tpot_ms"))]  # fmt: skip
        rows.append(row)
    console.print(fitted_table(f"find-max · {block['settings']} · {block['basis']} ≥ {block['attainment_target']:g} "
                               "(ms)", cols, rows))  # fmt: skip
    m = block["measured"]
    console.print(f"  [bold]measured max: {f(m['best'])}[/bold] ({m['reason']})", soft_wrap=True)
    if pred:
        p = block["predicted"]
        console.print(f"  [bold]plan predicts: {f(p['best'])}[/bold] ({p['reason']}; {p['basis']})", soft_wrap=True)


def print_trace(console: Any, run: dict[str, Any]) -> None:
    """Trace replays: answered, schedule fidelity, implied vs reported cache; and the /metrics line."""
    tr = run.get("trace")
    if tr is not None:
        lat = tr["schedule_lateness_ms"]
        console.print(
            f"  trace {tr['path']} ({tr['format']}, {tr['requests']} requests over {tr['span_s']:.1f} s): "
            f"{tr['answered']}/{tr['requests']} answered; schedule fidelity (send − trace time) p50 "
            f"{_fmt(lat['p50'], 2)} / p99 {_fmt(lat['p99'], 2)} / max {_fmt(lat['max'], 2)} ms",
            soft_wrap=True,
        )
        console.print(
            f"  cache the trace implies: {_pct(tr['implied_repeated_fraction'])} of prompt tokens in repeated "
            f"blocks, {_pct(tr['implied_prefix_fraction'])} in shared leading blocks (prefix-cacheable); server "
            f"reported cached {_pct(tr['server_cached_fraction'])} over {tr['server_cached_requests']} requests",
            soft_wrap=True,
        )
    sm = run.get("server_metrics")
    if sm is not None and sm["status"] == "ok":
        console.print(
            f"  server /metrics ({sm['source']}): {sm['samples']} samples every {sm['period_s']:g} s, "
            f"{sm['scrape_errors']} failed → metrics.jsonl, plots/timeline.png"
        )
    elif sm is not None and sm["status"] != "off":
        console.print(f"  [yellow]server /metrics unavailable: {sm['reason']}; the run went on without it[/yellow]")
