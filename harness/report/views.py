"""What `g4bench report` shows of one run folder: a `RunView` (verdict, facts, tables, figures).

    view = collect(Path("results/<run-id>"))

Kinds, judged from the folder's files (first match):

- serve-load (summary.json with run + levels): the levels table, the capacity line, and for trace
  replays the schedule fidelity and cache lines, for --find-max the probes beside the prediction;
  figures redrawn from summary.json / requests.jsonl / metrics.jsonl when plots/ is absent
  (committed reference folders drop their plots).
- plan (plan.json: sizing per knob; validation.json: predicted ÷ measured headline).
- record kinds in results.jsonl: revalidate (verdict counts, the ratio table), capacity (ceilings),
  engine-steps, roofline … and any other kind through the generic view: command, env summary,
  summary.csv (capped), every plot found.

Every view carries the command line and the env summary; a file that cannot be read becomes a note,
never an exception, so one odd folder does not stop a report of several.
"""

from __future__ import annotations

import base64
import json
import tempfile
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ENV_KEYS = ("g4bench_version", "git_rev", "platform", "device_kind", "device_count", "jax_version",
            "python_version", "host", "timestamp_utc")  # fmt: skip
MAX_ROWS, MAX_COLS, MAX_FIGURES, MAX_FIGURE_BYTES = 40, 12, 12, 3_000_000


@dataclass
class Table:
    title: str
    columns: list[str]
    rows: list[list[str]]
    note: str | None = None


@dataclass
class Figure:
    title: str
    data_uri: str  # data:image/png;base64,… (or svg+xml): the page needs no file beside it


@dataclass
class RunView:
    path: str
    name: str
    kind: str = "unknown"
    verdict: str = "no verdict: nothing this report knows how to read"
    command: str | None = None
    env: list[tuple[str, str]] = field(default_factory=list)
    facts: list[tuple[str, str]] = field(default_factory=list)
    tables: list[Table] = field(default_factory=list)
    figures: list[Figure] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    files: list[str] = field(default_factory=list)
    device_hint: str | None = None  # where the env block names no device (a serve-load client's env)

    @property
    def device(self) -> str:
        env = dict(self.env)
        return env.get("device_kind") or env.get("platform") or self.device_hint or "—"

    def env_value(self, key: str) -> str:
        return dict(self.env).get(key, "—")


def fmt(v: Any, nd: int | None = None) -> str:
    if v is None:
        return "—"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        return f"{v:.{nd if nd is not None else (0 if abs(v) >= 100 else 2 if abs(v) < 10 else 1)}f}"
    return str(v)


def _json(path: Path, view: RunView) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        view.notes.append(f"{path.name}: unreadable ({e})")
        return None


def _jsonl(path: Path, view: RunView) -> list[dict[str, Any]]:
    rows = []
    try:
        for line in path.read_text(encoding="utf-8").splitlines():
            if line.strip():
                rows.append(json.loads(line))
    except (OSError, ValueError) as e:
        view.notes.append(f"{path.name}: unreadable after line {len(rows)} ({e})")
    return rows


def figure(path: Path) -> Figure | None:
    """A PNG or SVG file as an inline data URI (None when too big to inline)."""
    data = path.read_bytes()
    if len(data) > MAX_FIGURE_BYTES:
        return None
    mime = "image/svg+xml" if path.suffix == ".svg" else "image/png"
    return Figure(path.stem.replace("_", " "), f"data:{mime};base64,{base64.b64encode(data).decode()}")


def _figures(folder: Path, view: RunView) -> None:
    """Every plot under `folder` (PNG, else the SVG of a stem with no PNG), at most MAX_FIGURES."""
    pngs = sorted(folder.rglob("*.png"))
    stems = {p.with_suffix("") for p in pngs}
    files = pngs + [p for p in sorted(folder.rglob("*.svg")) if p.with_suffix("") not in stems]
    for p in files[:MAX_FIGURES]:
        fig = figure(p)
        if fig is None:
            view.notes.append(f"{p.name}: over {MAX_FIGURE_BYTES // 1_000_000} MB, not inlined")
        else:
            view.figures.append(fig)
    if len(files) > MAX_FIGURES:
        view.notes.append(f"{len(files) - MAX_FIGURES} more figures in {folder.name}/ not shown")


def _env(run_dir: Path, view: RunView, fallback: dict[str, Any] | None = None) -> None:
    doc = _json(run_dir / "env.json", view) if (run_dir / "env.json").is_file() else None
    env = (doc.get("env") if isinstance(doc, dict) and isinstance(doc.get("env"), dict) else doc) or fallback or {}
    view.env = [(k, fmt(env.get(k))) for k in ENV_KEYS if env.get(k) is not None]


def _csv_table(path: Path, title: str) -> Table:
    import pandas as pd

    df = pd.read_csv(path).dropna(axis=1, how="all")
    cols = list(df.columns)
    note = []
    if len(cols) > MAX_COLS:
        note.append(f"{len(cols) - MAX_COLS} more columns")
        df = df[cols[:MAX_COLS]]
    if len(df) > MAX_ROWS:
        note.append(f"{len(df) - MAX_ROWS} more rows")
        df = df.head(MAX_ROWS)
    rows = [[fmt(v if not (isinstance(v, float) and v != v) else None) for v in r] for r in df.itertuples(index=False)]
    return Table(title, [str(c) for c in df.columns], rows, f"{', '.join(note)} in {path.name}" if note else None)


# ------------------------------------------------------------------------------------ serve-load


def _serve_load(run_dir: Path, summary: dict[str, Any], view: RunView) -> None:
    run, levels = summary["run"], summary["levels"]
    wl = run["workload"]
    server = run.get("server") or {}
    view.kind = "serve-load" + (" (simulated)" if server.get("simulated") else "")
    view.device_hint = (f"server: {server.get('model')}, {server.get('max_slots')} slots (self-started)"
                        if server.get("self_started") else f"server at {run.get('base_url')}")  # fmt: skip
    view.facts += [("workload", f"{wl['kind']}, transport {wl.get('api')}"), ("model", fmt(run.get("model_name"))),
                   ("SLO", ", ".join(f"{k} {v:g}" for k, v in (run.get("slo") or {}).items()
                                     if isinstance(v, int | float) and not isinstance(v, bool)))]  # fmt: skip
    by_rate = (run.get("search") or {}).get("mode") == "rate"
    first = "rate" if by_rate else "peak in flight" if run.get("trace") else "conc"
    cols = [first, "done/failed", "TTFT p50", "TTFT p99", "TPOT p50", "TPOT p99",
            "E2E p50", "out tok/s", "attain", "task attain"]  # fmt: skip
    rows = [[fmt(lv["request_rate"] if by_rate else lv["concurrency"]), f"{lv['completed']}/{lv['failed']}",
             *(fmt(lv.get(k)) for k in ("median_ttft_ms", "p99_ttft_ms", "median_tpot_ms", "p99_tpot_ms",
                                        "median_e2el_ms", "output_throughput")),
             fmt(lv.get("slo_attainment")), fmt(lv.get("task_slo_attainment"))] for lv in levels]  # fmt: skip
    view.tables.append(Table("levels (ms)", cols, rows))
    cap = summary.get("capacity") or {}
    verdict = (f"capacity: largest concurrency with {cap.get('basis')} ≥ {fmt(cap.get('attainment_target'))}: "
               f"{fmt(cap.get('max_concurrency_at_attainment'))}")  # fmt: skip
    if (tr := run.get("trace")) is not None:
        lat = tr["schedule_lateness_ms"]
        verdict = (f"trace: {tr['answered']}/{tr['requests']} answered; schedule fidelity p50 {fmt(lat['p50'])} / "
                   f"p99 {fmt(lat['p99'])} / max {fmt(lat['max'])} ms")  # fmt: skip
        pct = lambda v: "—" if v is None else f"{v * 100:.1f}%"  # noqa: E731
        view.facts += [("trace", f"{tr['path']} ({tr['format']}, {tr['requests']} requests over {tr['span_s']:.1f} s)"),
                       ("implied reuse", f"{pct(tr['implied_repeated_fraction'])} of prompt tokens in repeated blocks, "
                                         f"{pct(tr['implied_prefix_fraction'])} prefix-cacheable"),
                       ("server cached", f"{pct(tr['server_cached_fraction'])} ({tr['server_cached_requests']} requests)")]  # fmt: skip
    if (se := run.get("search")) is not None:
        pred = se.get("predicted")
        verdict = (f"find-max {se['mode']}: measured {fmt(se['measured']['best'])}"
                   + (f", plan predicts {fmt(pred['best'])}" if pred else "") + f" ({se['basis']} ≥ {se['attainment_target']:g})")  # fmt: skip
        view.facts += [("search", se["settings"]), ("measured", se["measured"]["reason"])]
        if pred:
            view.facts += [("predicted", f"{pred['reason']}; {pred.get('basis')}")]
        view.tables.append(Table("probes, in the order measured", ["level", "attain", "pred attain", "TTFT p50",
                                 "pred TTFT p50", "TPOT p50", "pred TPOT p50"],
                                 [[fmt(p["level"]), fmt(p["attainment"]), fmt(p.get("predicted_attainment")),
                                   fmt(p["median_ttft_ms"]), fmt(p.get("predicted_median_ttft_ms")),
                                   fmt(p["median_tpot_ms"]), fmt(p.get("predicted_median_tpot_ms"))]
                                  for p in se["probes"]]))  # fmt: skip
    if run.get("partial"):
        verdict = f"PARTIAL ({run.get('partial_reason')}); " + verdict
    view.verdict = verdict
    sm = run.get("server_metrics")
    if sm:
        view.facts.append(("server /metrics", f"{sm['samples']} samples every {sm['period_s']:g} s ({sm['source']})"
                           if sm["status"] == "ok" else f"{sm['status']}: {sm.get('reason')}"))  # fmt: skip
    for lv in levels:
        view.notes += [f"c={lv['concurrency']}: {w}" for w in lv.get("warnings") or []]
    if (run_dir / "plots").is_dir():
        _figures(run_dir / "plots", view)
        return
    from harness.load.plots import write_plots, write_timeline

    with tempfile.TemporaryDirectory() as tmp:  # a folder committed without plots: draw them here
        out = Path(tmp) / "plots"
        write_plots(summary, out)
        write_timeline(run_dir, out)
        if run.get("search") is not None:
            from harness.load.find_max import write_search

            write_search(run["search"], Path(tmp))
        view.notes.append("figures drawn for this report from the folder's summary (it has no plots/)")
        _figures(out, view)


# -------------------------------------------------------------------------------------- records


def _revalidate(records: list[dict[str, Any]], view: RunView) -> None:
    ratios = [r for r in records if r["kind"] == "ratio"]
    summ = next((r for r in records if r["kind"] == "summary"), None)
    counts = summ.get("verdict_counts") if summ else dict(Counter(r["verdict"] for r in ratios))
    view.verdict = "verdicts: " + (", ".join(f"{k} {v}" for k, v in sorted((counts or {}).items())) or "none")
    if summ is not None:
        view.verdict += f"; host quiet: {fmt(summ.get('host_quiet'))}"
        view.facts.append(("median CI half-width", f"±{fmt(summ.get('median_ci95_half_width_pct'))}%"))
    if ratios:
        view.tables.append(Table("within-run ratios", ["effect", "numerator", "ratio", "95% CI", "verdict"],
                                 [[r.get("effect", ""), r["numerator"], fmt(r["ratio"], 3),
                                   f"{fmt(r.get('ci95_lo'), 3)}–{fmt(r.get('ci95_hi'), 3)}", r["verdict"]]
                                  for r in ratios[:MAX_ROWS]]))  # fmt: skip


def _capacity(records: list[dict[str, Any]], view: RunView) -> None:
    ceilings = [r for r in records if r.get("record") == "ceiling"]
    shown = "; ".join(f"{r['name']}: {r['max_batch']}" for r in ceilings[:3])
    more = f" (+{len(ceilings) - 3} more)" if len(ceilings) > 3 else ""
    view.verdict = f"ceilings (max batch): {shown or 'none'}{more}"
    view.tables.append(Table("residency ceilings", ["configuration", "max batch", "probes", "step ms"],
                             [[r["name"], fmt(r["max_batch"]), fmt(r.get("n_probes")), fmt(r.get("step_ms_median"))]
                              for r in ceilings[:MAX_ROWS]]))  # fmt: skip


def _plan(run_dir: Path, view: RunView) -> None:
    view.kind = "plan"
    if (run_dir / "plan.json").is_file() and (doc := _json(run_dir / "plan.json", view)):
        settings = doc.get("settings") or []
        view.verdict = f"{doc.get('target')}, {doc.get('agents')} agents: " + "; ".join(
            f"{s['knobs']} {s['agents_per_chip']}/chip" for s in settings[:4])
        view.tables.append(Table("agents per chip", ["knobs", "memory ceiling", "agents/chip", "chips", "binds on"],
                                 [[s["knobs"], fmt(s["memory_ceiling"]), fmt(s["agents_per_chip"]), fmt(s.get("chips")),
                                   s.get("binding", "")] for s in settings]))  # fmt: skip
        view.notes += [f"assumption: {a}" for a in doc.get("assumptions") or []]
    if (run_dir / "validation.json").is_file() and (doc := _json(run_dir / "validation.json", view)):
        h = doc.get("headline") or {}
        view.kind = "plan --validate"
        view.verdict = (f"predicted ÷ measured: median |error| {fmt(h.get('median_abs_error_pct'))}%, max "
                        f"{fmt(h.get('max_abs_error_pct'))}% over {h.get('cells')} p50 cells")  # fmt: skip


def collect(run_dir: Path) -> RunView:
    """The view of one run folder (module docstring)."""
    run_dir = Path(run_dir)
    view = RunView(str(run_dir), run_dir.resolve().name)
    if not run_dir.is_dir():
        view.verdict = "not a folder"
        return view
    view.files = sorted(p.name for p in run_dir.iterdir())
    if (run_dir / "command.txt").is_file():
        view.command = (run_dir / "command.txt").read_text(encoding="utf-8", errors="replace").strip()
    summary = _json(run_dir / "summary.json", view) if (run_dir / "summary.json").is_file() else None
    if isinstance(summary, dict) and "run" in summary and "levels" in summary:
        _env(run_dir, view, summary["run"].get("env"))
        view.command = view.command or " ".join(summary["run"].get("command") or [])
        _serve_load(run_dir, summary, view)
        return view
    if (run_dir / "plan.json").is_file() or (run_dir / "validation.json").is_file():
        _env(run_dir, view)
        _plan(run_dir, view)
        _figures(run_dir, view)
        return view
    records = _jsonl(run_dir / "results.jsonl", view) if (run_dir / "results.jsonl").is_file() else []
    _env(run_dir, view, records[0].get("env") if records else None)
    kinds = Counter(r.get("kind", "?") for r in records)
    if records:
        view.kind = "revalidate" if "revalidate" in kinds else kinds.most_common(1)[0][0]
        failed = sum("failure" in r for r in records)
        view.verdict = f"{len(records)} records ({', '.join(f'{k} {n}' for k, n in kinds.items())}), {failed} failed"
    if view.kind == "revalidate":
        _revalidate(records, view)
    elif view.kind == "capacity":
        _capacity(records, view)
    if (run_dir / "summary.csv").is_file():
        try:
            view.tables.append(_csv_table(run_dir / "summary.csv", "summary.csv"))
        except (OSError, ValueError) as e:
            view.notes.append(f"summary.csv: unreadable ({e})")
    _figures(run_dir, view)
    return view
