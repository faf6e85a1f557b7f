"""`g4bench plot RUN_DIR`: figures (PNG and SVG) from a run folder's records.

Data flow: `plot_run` reads results.jsonl (harness/results.py), groups records by their `kind`, and
hands each group to the plotter registered for that kind (`register_plotter`); each plotter writes
``RUN_DIR/plots/<figure>.png`` and ``.svg`` and returns the paths. Kinds without records are
skipped; a kind without a plotter is reported, not an error. Capacity and serve-load figures are
registered by their own modules (`PLUGINS`).

Figures:

- ``step_time``: median decode step per configuration with IQR bars (q1..q3) and min/max ticks;
  beside it every within-run ratio with its verdict ("real" or "within noise") and the ±2·noise
  band the verdict was judged against.
- ``throughput``: aggregate tok/s against batch for this run, with the vLLM sweep from
  configs/baselines overlaid and labelled with its device (vLLM, TPU v6e-1), at the input length
  nearest the run's context, and the reference JAX engine's revalidation points.
- ``bandwidth`` (roofline records with ``achieved_gb_per_s`` and ``calibrated_gb_per_s``): achieved
  bandwidth per case against the calibrated roofline (and the nameplate peak where the device is
  known); skipped with a message otherwise.

Matplotlib runs on the Agg backend (no display needed).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from harness.results import is_failure

Plotter = Callable[[Sequence[dict[str, Any]], Path, Path, Any], list[Path]]
# Modules that register plotters for their own record kinds (imported on demand by plot_run).
PLUGINS = ("harness.capacity.report", "harness.load.plots")
PLOTTERS: dict[str, Plotter] = {}
# Kinds that ride along with another kind's figures rather than getting their own.
COMPANION_KINDS = {"ratio": "revalidate", "summary": "revalidate"}
MODEL_IDS = {"e2b": "google/gemma-4-E2B-it", "e4b": "google/gemma-4-E4B-it"}


def register_plotter(kind: str) -> Callable[[Plotter], Plotter]:
    """Decorator: `fn(records, run_dir, out_dir, console) -> [paths]` draws the figures of one record kind."""

    def deco(fn: Plotter) -> Plotter:
        PLOTTERS[kind] = fn
        return fn

    return deco


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save(fig: Any, out_dir: Path, stem: str) -> list[Path]:
    """Write `fig` as PNG (150 dpi) and SVG into `out_dir`, close it, return both paths."""
    plt = _pyplot()
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [out_dir / f"{stem}.png", out_dir / f"{stem}.svg"]
    fig.savefig(paths[0], dpi=150, bbox_inches="tight")
    fig.savefig(paths[1], bbox_inches="tight")
    plt.close(fig)
    return paths


def plot_run(run_dir: Path, out_dir: Path | None = None, console: Any = None) -> list[Path]:
    """Draw every figure the run's records support; returns the files written."""
    import importlib

    from rich.console import Console

    from harness.results import read_records

    for module in PLUGINS:
        importlib.import_module(module)
    console = console or Console(stderr=True)
    records = read_records(Path(run_dir))
    out_dir = Path(out_dir) if out_dir is not None else Path(run_dir) / "plots"
    by_kind: dict[str, list[dict[str, Any]]] = {}
    for rec in records:
        by_kind.setdefault(COMPANION_KINDS.get(rec["kind"], rec["kind"]), []).append(rec)
    written: list[Path] = []
    for kind, group in by_kind.items():
        plotter = PLOTTERS.get(kind)
        if plotter is None:
            console.print(f"[yellow]no plotter for {kind!r} records yet; skipped[/yellow]")
            continue
        written += plotter(group, Path(run_dir), out_dir, console)
    if "roofline" not in by_kind:
        console.print(
            "[dim]no roofline records in this run (g4bench roofline makes them); bandwidth figure skipped[/dim]"
        )
    return written


# -------------------------------------------------------------------------------------- revalidate


def _step_panel(ax: Any, meas: Sequence[dict[str, Any]]) -> None:
    """Horizontal bars: median step ms, IQR error bars, min/max ticks; failures labelled in red."""
    names = [r["name"] for r in meas]
    ys = list(range(len(meas)))[::-1]
    for y, r in zip(ys, meas, strict=True):
        if is_failure(r):
            ax.text(0, y, f"  failed: {r['failure']['kind']}", va="center", color="tab:red")
            continue
        color = "tab:blue" if r["config"].get("donate") else "tab:orange"
        med = r["step_ms_median"]
        ax.barh(y, med, color=color, alpha=0.75)
        ax.errorbar(
            med, y, xerr=[[med - r["step_ms_q1"]], [r["step_ms_q3"] - med]], color="black", capsize=4, lw=1.5
        )
        ax.plot([r["step_ms_min"], r["step_ms_max"]], [y, y], "|", color="dimgray", ms=10)
        ax.text(med, y + 0.3, f" {med:.2f} ms ({r['step_rel_iqr_pct']:.1f}%)", fontsize=7, va="bottom")
    ax.set_yticks(ys, names, fontsize=8)
    ax.set_xlabel("decode step, ms (bar: median; black: IQR; grey ticks: min/max)")
    ax.set_title("step time per configuration\n(orange copying, blue donated)", fontsize=9)
    ax.grid(axis="x", alpha=0.3)


def _ratio_panel(ax: Any, ratios: Sequence[dict[str, Any]]) -> None:
    """Each ratio with its 95% CI as an error bar, the ±floor band around 1 shaded, labelled with the
    verdict. Runs made before interleaved rounds (no CI) show the ±2·noise band of the old rule."""
    colors = {"faster": "tab:green", "slower": "tab:red", "equivalent": "tab:cyan", "real": "tab:green"}
    ys = list(range(len(ratios)))[::-1]
    for y, r in zip(ys, ratios, strict=True):
        has_ci = "ci95_lo" in r
        band = r["floor_pct"] / 100 if has_ci else 2 * r["noise_pct"] / 100
        ax.fill_betweenx([y - 0.35, y + 0.35], 1 - band, 1 + band, color="lightgray")
        color = colors.get(r["verdict"], "gray")
        if has_ci:
            err = [[r["ratio"] - r["ci95_lo"]], [r["ci95_hi"] - r["ratio"]]]
            ax.errorbar(r["ratio"], y, xerr=err, fmt="o", color=color, capsize=3)
        else:
            ax.plot(r["ratio"], y, "o", color=color)
        ax.text(r["ratio"], y + 0.25, f" {r['ratio']:.3f}× {r['verdict']}", fontsize=7, color=color)
    ax.axvline(1.0, color="black", lw=0.8)
    ax.set_yticks(ys, [r["name"] for r in ratios], fontsize=8)
    with_ci = bool(ratios) and "ci95_lo" in ratios[0]
    ax.set_xlabel(
        "ratio (> 1: the variant is faster); bars: 95% CI; grey band: ±practical floor"
        if with_ci
        else "ratio (> 1: the variant is faster); grey band: ±2 × noise"
    )
    ax.set_title("verdicts: faster/slower only when\nthe CI excludes 1 beyond the floor", fontsize=9)
    ax.grid(axis="x", alpha=0.3)


def _vllm_curve(model: str, ctx: int) -> tuple[Any, str] | None:
    """The vLLM sweep's output tok/s vs concurrency at the input length nearest `ctx`, and a label."""
    from harness.results import load_baseline

    sweep = load_baseline("vllm-sweep-v6e1")
    model_id = MODEL_IDS.get(model, MODEL_IDS["e2b"])
    rows = sweep[(sweep["model"] == model_id) & (sweep["status"] == "ok")]
    if rows.empty:
        return None
    nearest = min(rows["ctx"].unique(), key=lambda c: abs(int(c) - ctx))
    rows = rows[rows["ctx"] == nearest].sort_values("concurrency")
    device = rows["device"].iloc[0]
    note = "" if model in MODEL_IDS else f" (model {model} not in the sweep; E2B shown)"
    label = f"vLLM, {device}: {model_id.split('/')[-1]}, input {nearest}, 128 out, serve output tok/s{note}"
    return rows, label


def _throughput_figure(meas: Sequence[dict[str, Any]], out_dir: Path) -> list[Path]:
    """Aggregate tok/s against batch: this run, the vLLM v6e sweep, the reference JAX engine."""
    from harness.results import load_baseline

    plt = _pyplot()
    ok = [r for r in meas if not is_failure(r)]
    fig, ax = plt.subplots(figsize=(9, 6))
    for r in ok:
        marker = "o" if r["config"].get("donate") else "s"
        color = "tab:blue" if r["config"].get("kv_dtype") == "int8" else "tab:orange"
        ax.scatter(r["batch"], r["agg_tok_per_s"], marker=marker, color=color, alpha=0.7)
    if ok:
        platform = ok[0]["env"].get("device_kind") or ok[0]["env"].get("platform")
        ax.scatter(
            [],
            [],
            color="gray",
            label=f"this run ({platform}): ○ donated □ copying; orange bf16 KV, blue int8 KV",
        )
        curve = _vllm_curve(str(ok[0]["config"].get("model", "e2b")), int(ok[0]["ctx"]))
        if curve is not None:
            rows, label = curve
            ax.plot(rows["concurrency"], rows["output_tok_per_s"], "-^", color="tab:purple", label=label)
    ref = load_baseline("jax-reference-revalidate-v6e1")
    device = ref["device"].iloc[0]
    ax.scatter(
        ref["batch"],
        ref["agg_tok_per_s"],
        marker="x",
        color="black",
        label=f"reference JAX engine, {device}: decode step, ctx 8192 (12 configs)",
    )
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("batch (this run) / concurrency (vLLM)")
    ax.set_ylabel("aggregate tok/s")
    ax.set_title("aggregate decode throughput vs batch (vLLM figures are end-to-end serving, not one step)")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.12))
    return save(fig, out_dir, "throughput")


def rounds_done(meas: Sequence[dict[str, Any]], cfg: dict[str, Any]) -> int:
    """The rounds the run measured (a budgeted run adds rounds after its configured minimum)."""
    done = [r["rounds"] for r in meas if not is_failure(r) and "rounds" in r]
    return max(done) if done else int(cfg.get("rounds", 1))


@register_plotter("revalidate")
def plot_revalidate(
    records: Sequence[dict[str, Any]], run_dir: Path, out_dir: Path, console: Any
) -> list[Path]:
    """step_time (bars + verdicts) and throughput (vs the vLLM v6e baseline) figures."""
    plt = _pyplot()
    meas = [r for r in records if r["kind"] == "revalidate"]
    ratios = [r for r in records if r["kind"] == "ratio"]
    if not meas:
        return []
    ncols = 2 if ratios else 1
    height = max(4.0, 0.45 * max(len(meas), len(ratios)) + 1.5)
    fig, axes = plt.subplots(1, ncols, figsize=(8 * ncols, height), squeeze=False)
    _step_panel(axes[0][0], meas)
    if ratios:
        _ratio_panel(axes[0][1], ratios)
    env = meas[0]["env"]
    cfg = meas[0]["config"]
    fig.suptitle(
        f"{cfg.get('model')} decode step, batch {cfg.get('batch')}, ctx {cfg.get('ctx')}, "
        f"{rounds_done(meas, cfg)} round(s) done × {cfg.get('samples')} samples — "
        f"{env.get('device_kind') or env.get('platform')}, g4bench {env.get('g4bench_version')} ({env.get('git_rev')})",
        fontsize=10,
    )
    fig.tight_layout()
    paths = save(fig, out_dir, "step_time")
    paths += _throughput_figure(meas, out_dir)
    return paths


# ---------------------------------------------------------------------------------------- roofline


@register_plotter("roofline")
def plot_roofline(
    records: Sequence[dict[str, Any]], run_dir: Path, out_dir: Path, console: Any
) -> list[Path]:
    """Achieved GB/s per case against the calibrated roofline (and nameplate peak if known)."""
    from harness.hardware import hardware_for_device

    usable = [
        r for r in records if not is_failure(r) and "achieved_gb_per_s" in r and "calibrated_gb_per_s" in r
    ]
    if not usable:
        console.print(
            "[yellow]roofline records lack achieved_gb_per_s / calibrated_gb_per_s; bandwidth figure skipped[/yellow]"
        )
        return []
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(9, max(3.5, 0.5 * len(usable) + 1.5)))
    ys = list(range(len(usable)))[::-1]
    for y, r in zip(ys, usable, strict=True):
        frac = r["achieved_gb_per_s"] / r["calibrated_gb_per_s"]
        ax.barh(y, r["achieved_gb_per_s"], color="tab:blue", alpha=0.75)
        ax.text(
            r["achieved_gb_per_s"],
            y,
            f" {r['achieved_gb_per_s']:.0f} GB/s ({frac:.0%} of calibrated)",
            va="center",
            fontsize=8,
        )
    calibrated = max(r["calibrated_gb_per_s"] for r in usable)
    ax.axvline(
        calibrated, color="tab:green", ls="--", label=f"calibrated streaming bandwidth {calibrated:.0f} GB/s"
    )
    env = usable[0]["env"]
    hw = hardware_for_device(env.get("platform"), env.get("device_kind"))
    peak = hw.value("peak_bandwidth_bytes_per_s") if hw else None
    if peak:
        assert hw is not None  # peak came from it
        ax.axvline(peak / 1e9, color="tab:red", ls=":", label=f"{hw.name} nameplate {peak / 1e9:.0f} GB/s")
    ax.set_yticks(ys, [r["name"] for r in usable], fontsize=8)
    ax.set_xlabel("achieved bandwidth, GB/s (bytes-moved model / measured step time)")
    ax.set_title(f"decode step against the roofline — {env.get('device_kind') or env.get('platform')}")
    ax.legend(fontsize=8, loc="lower right")
    ax.grid(axis="x", alpha=0.3)
    return save(fig, out_dir, "bandwidth")
