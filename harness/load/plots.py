"""serve-load figures (matplotlib Agg; each written as PNG and SVG into the run's plots/ folder).

- latency.png: median and p90/p99 TTFT and TPOT against concurrency, with the vLLM TPU v6e sweep
  (Gemma 4 E2B, the context nearest this run's mean prompt) overlaid and labelled with its device.
- throughput.png: output tok/s against concurrency, same overlay.
- goodput.png: request goodput (and task goodput for agent runs) plus SLO attainment with the
  attainment target drawn in.
- ttft_by_turn.png (agent runs): median TTFT and mean uncached prompt tokens by turn index, one line
  per concurrency.
- timeline.png: against run time, every request's TTFT and E2E (at its send time) above the server's
  /metrics rows (metrics.jsonl): KV usage, requests running and waiting, prefix-cache hit rate per
  scrape interval, batch size; level starts as dotted lines. Drawn from the run folder's files.
The baseline comes from configs/baselines/vllm-sweep-v6e1.csv via `harness.results.load_baseline`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from harness.plots import register_plotter

BASELINE = "vllm-sweep-v6e1"
BASELINE_MODEL = "google/gemma-4-E2B-it"


def baseline_rows(mean_prompt_tokens: float | None) -> tuple[Any, str] | None:
    """(rows by concurrency, label) of the vLLM E2B sweep at the ctx nearest the run's prompts."""
    from harness.results import load_baseline

    try:
        df = load_baseline(BASELINE)
    except FileNotFoundError:
        return None
    df = df[(df["model"] == BASELINE_MODEL) & (df["status"] == "ok")]
    if df.empty:
        return None
    target = mean_prompt_tokens or 1024
    ctx = min(df["ctx"].unique(), key=lambda c: abs(float(c) - target))
    rows = df[df["ctx"] == ctx].sort_values("concurrency")
    return rows, f"vLLM, {rows['device'].iloc[0]}, E2B, ctx {ctx}"


def _save(fig: Any, out: Path, name: str) -> list[Path]:
    paths = [out / f"{name}.png", out / f"{name}.svg"]
    for p in paths:
        fig.savefig(p, dpi=120, bbox_inches="tight")
    return paths


@register_plotter("serve-load")
def plot_serve_load(
    records: Sequence[dict[str, Any]], run_dir: Path, out_dir: Path, console: Any
) -> list[Path]:
    """`g4bench plot` on a serve-load run: the same figures, redrawn from its summary.json."""
    summary_path = Path(run_dir) / "summary.json"
    if not summary_path.is_file():
        console.print(f"[yellow]{summary_path} missing; serve-load figures skipped[/yellow]")
        return []
    return write_plots(json.loads(summary_path.read_text()), out_dir) + write_timeline(Path(run_dir), out_dir)


def write_plots(summary: dict[str, Any], out: Path) -> list[Path]:
    """Draw every figure the summary supports; returns the written paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    levels = summary["levels"]
    if not levels:
        return []
    by_rate = (summary["run"].get("search") or {}).get("mode") == "rate"  # probes share one concurrency cap
    conc = [lv["request_rate"] if by_rate else lv["concurrency"] for lv in levels]
    xlabel = "request rate (tasks/s)" if by_rate else "concurrency"
    title = f"serve-load {summary['run']['workload']['kind']} · {summary['run']['model_name']}"
    prompts = [lv.get("total_input_tokens", 0) / lv["completed"] for lv in levels if lv.get("completed")]
    base = None if by_rate else baseline_rows(sum(prompts) / len(prompts) if prompts else None)
    written: list[Path] = []
    ticks = sorted(set(conc) | (set(int(c) for c in base[0]["concurrency"]) if base is not None else set()))
    labels = [f"{c:g}" for c in ticks]

    def get(key: str) -> list[float]:
        return [lv.get(key) if lv.get(key) is not None else float("nan") for lv in levels]

    # a trace replay is one level at the trace's own load: nothing to draw against concurrency
    if summary["run"]["workload"]["kind"] not in ("trace", "sessions"):
        fig, axes = plt.subplots(1, 2, figsize=(11, 4))
        for ax, metric in zip(axes, ("ttft", "tpot"), strict=True):
            ax.plot(conc, get(f"median_{metric}_ms"), "o-", label="median")
            ax.plot(conc, get(f"p90_{metric}_ms"), "s--", label="p90")
            ax.plot(conc, get(f"p99_{metric}_ms"), "^:", label="p99")
            if base is not None:
                rows, label = base
                ax.plot(
                    rows["concurrency"], rows[f"{metric}_ms_median"], "k.-", alpha=0.6, label=f"{label} (median)"
                )
            ax.set(xlabel=xlabel, ylabel=f"{metric.upper()} (ms)", xscale="log", yscale="log")
            ax.set_xticks(ticks, labels)
            ax.legend(fontsize=7)
        fig.suptitle(title)
        written += _save(fig, out, "latency")
        plt.close(fig)

        fig, ax = plt.subplots(figsize=(6, 4))
        ax.plot(conc, get("output_throughput"), "o-", label="output tok/s (this run)")
        if base is not None:
            rows, label = base
            ax.plot(rows["concurrency"], rows["output_tok_per_s"], "k.-", alpha=0.6, label=label)
        ax.set(xlabel=xlabel, ylabel="output tokens/s", xscale="log", yscale="log", title=title)
        ax.set_xticks(ticks, labels)
        ax.legend(fontsize=7)
        written += _save(fig, out, "throughput")
        plt.close(fig)

        fig, ax = plt.subplots(figsize=(6, 4))
        ax.plot(conc, get("request_goodput"), "o-", label="request goodput (req/s)")
        if any(lv.get("task_goodput") is not None for lv in levels):
            ax.plot(conc, get("task_goodput"), "s-", label="task goodput (tasks/s)")
        ax.set(xlabel=xlabel, ylabel="goodput (/s)", xscale="log", title=title)
        ax.set_xticks(ticks, labels)
        ax2 = ax.twinx()
        ax2.plot(conc, get("slo_attainment"), "g^--", label="request attainment")
        if any(lv.get("task_slo_attainment") is not None for lv in levels):
            ax2.plot(conc, get("task_slo_attainment"), "mv--", label="task attainment")
        ax2.axhline(summary["run"]["slo"]["attainment_target"], color="grey", lw=0.8, ls=":")
        ax2.set(ylabel="SLO attainment", ylim=(-0.02, 1.02))
        ax.legend(loc="upper left", fontsize=7)
        ax2.legend(loc="lower left", fontsize=7)
        written += _save(fig, out, "goodput")
        plt.close(fig)

    if any(lv.get("by_turn") for lv in levels):
        fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4))
        for lv in levels:
            rows = lv.get("by_turn") or []
            turns = [r["turn"] for r in rows]
            a1.plot(
                turns,
                [r["median_ttft_ms"] or float("nan") for r in rows],
                "o-",
                label=f"c={lv['concurrency']}",
            )
            a2.plot(
                turns,
                [r["mean_uncached_tokens"] or float("nan") for r in rows],
                "o-",
                label=f"c={lv['concurrency']}",
            )
        a1.set(xlabel="turn", ylabel="median TTFT (ms)", title="TTFT by turn")
        a2.set(xlabel="turn", ylabel="mean uncached prompt tokens", title="uncached prompt tokens by turn")
        a1.legend(fontsize=7)
        written += _save(fig, out, "ttft_by_turn")
        plt.close(fig)
    return written


def _jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def write_timeline(run_dir: Path, out: Path) -> list[Path]:
    """timeline.png/.svg from requests.jsonl and metrics.jsonl (module docstring); [] without requests."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    reqs = [r for r in _jsonl(run_dir / "requests.jsonl") if r.get("ok")]
    if not reqs:
        return []
    rows = _jsonl(run_dir / "metrics.jsonl")
    missing = next((r.get("reason") for r in rows if r.get("available") is False), None)
    rows = [r for r in rows if "t_s" in r]
    panels = [("KV usage (%)", [("kv_usage", 100.0, "used")]),
              ("requests", [("running", 1.0, "running"), ("waiting", 1.0, "waiting (queue)")]),
              ("prefix hit rate (%)", [("prefix_hit_rate", 100.0, "per interval")]),
              ("batch size", [("batch_size", 1.0, rows[0].get("batch_size_basis", "") if rows else "")])]  # fmt: skip
    fig, axes = plt.subplots(1 + len(panels), 1, figsize=(10, 2.0 * (1 + len(panels))), sharex=True)
    t = [r.get("level_start_s", 0.0) + r["send_s"] for r in reqs]
    axes[0].plot(t, [r["ttft_ms"] for r in reqs], ".", label="TTFT")
    axes[0].plot(t, [r["e2el_ms"] for r in reqs], "x", ms=4, label="E2E")
    axes[0].set(ylabel="client ms", yscale="log", title="client latencies (at send time) and server /metrics")
    axes[0].legend(fontsize=7, loc="upper left")
    for ax, (label, series) in zip(axes[1:], panels, strict=True):
        for key, scale, name in series:
            pts = [(r["t_s"], r[key] * scale) for r in rows if r.get(key) is not None]
            if pts:
                ax.plot(*zip(*pts, strict=True), ".-", ms=3, label=name)
        ax.set(ylabel=label)
        if ax.has_data():
            ax.legend(fontsize=7, loc="upper left")
        else:
            why = f"/metrics unavailable: {missing}" if missing else "no samples"
            ax.text(0.5, 0.5, why, transform=ax.transAxes, ha="center", va="center", fontsize=8, color="grey")
    for start in sorted({r.get("level_start_s", 0.0) for r in reqs}):
        for ax in axes:
            ax.axvline(start, color="grey", lw=0.6, ls=":")
    axes[-1].set(xlabel="run time (s)")
    fig.tight_layout()
    out.mkdir(parents=True, exist_ok=True)
    written = _save(fig, out, "timeline")
    plt.close(fig)
    return written
