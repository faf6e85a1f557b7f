"""Run folders of several kinds, written in a tmp dir for the report tests (no server, no timing)."""

from __future__ import annotations

import json
from pathlib import Path

from harness.env import host_env
from harness.load import report
from harness.load.client import RequestRecord
from harness.load.replay import trace_block
from harness.load.runner import LevelResult, LoadConfig, RunResult
from harness.load.slo import SLO
from harness.load.trace import parse_trace
from harness.load.workloads import WorkloadConfig

TRACE = parse_trace([json.dumps({"timestamp": t * 100, "input_length": 600, "output_length": 2, "hash_ids": [1, 2]})
                     for t in range(4)])  # fmt: skip


def serve_load_trace_run(out: Path, plots: bool = True) -> Path:
    """A trace replay's folder, from hand-made records (4 requests, one late by 3 ms)."""
    wl = WorkloadConfig(kind="trace", api="chat", model="m", input_len=600, output_len=2, turns=1)
    cfg = LoadConfig(base_url="http://127.0.0.1:9", workload=wl, concurrencies=[4], slo=SLO(ttft_ms=500.0))
    recs = [RequestRecord(f"r{i}", "/v1/chat/completions", ok=True, done=True, scheduled_s=i * 0.1,
                          send_s=i * 0.1 + (0.003 if i == 2 else 0.001), chunk_times=[0.2, 0.25],
                          chunk_tokens=[1, 1], completion_tokens=2, prompt_tokens=600, cached_tokens=512 * (i > 0),
                          input_len=600, end_s=i * 0.1 + 0.25) for i in range(4)]  # fmt: skip
    result = RunResult(cfg, levels=[LevelResult(2, recs, 0.6)])
    result.trace = trace_block(TRACE, recs)
    result.server_metrics_block = {"status": "unavailable", "reason": "/metrics answered HTTP 404", "period_s": 1.0,
                                   "samples": 0, "scrape_errors": 0, "source": None}  # fmt: skip
    meta = {"run_id": out.name, "argv": ["g4bench", "serve-load", "--url", "http://127.0.0.1:9", "--trace", "t.jsonl"],
            "model_name": "m", "server": {"self_started": False}, "env": host_env({})}  # fmt: skip
    report.write_run(result, out, meta)
    if not plots:
        for p in (out / "plots").iterdir():
            p.unlink()
        (out / "plots").rmdir()
    return out


def revalidate_run(out: Path) -> Path:
    out.mkdir(parents=True)
    env = {"g4bench_version": "0.1.0", "git_rev": "abc1234", "platform": "cpu", "device_kind": "cpu"}
    rows = [{"kind": "revalidate", "name": "a", "env": env, "step_ms_median": 10.0},
            {"kind": "ratio", "name": "a/b", "effect": "donation", "numerator": "a", "denominator": "b", "ratio": 1.2,
             "ci95_lo": 1.1, "ci95_hi": 1.3, "verdict": "faster", "env": env},
            {"kind": "summary", "name": "summary", "verdict_counts": {"faster": 1}, "host_quiet": True, "env": env}]  # fmt: skip
    (out / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (out / "command.txt").write_text("g4bench revalidate --all\n")
    (out / "summary.csv").write_text("kind,name,step_ms_median\nrevalidate,a,10.0\n")
    return out


def plan_run(out: Path) -> Path:
    out.mkdir(parents=True)
    doc = {"target": "tpu-v6e", "agents": 64, "assumptions": ["one task per agent"],
           "settings": [{"knobs": "kv-bf16/ring/slots=agents", "memory_ceiling": 400, "agents_per_chip": 58,
                         "chips": 2, "binding": "SLO: TPOT"}]}  # fmt: skip
    (out / "plan.json").write_text(json.dumps(doc))
    return out


def unknown_run(out: Path) -> Path:
    """A kind the report has no view for: command, a CSV and a plot."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    (out / "plots").mkdir(parents=True)
    (out / "command.txt").write_text("g4bench something-new --flag\n")
    (out / "summary.csv").write_text("a,b\n1,2\n3,4\n")
    fig, ax = plt.subplots(figsize=(2, 2))
    ax.plot([1, 2], [3, 4])
    fig.savefig(out / "plots" / "curve.png")
    plt.close(fig)
    return out
