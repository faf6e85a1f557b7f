"""Capacity tables (rich, stderr), the reference comparison, and the capacity-frontier figure.

Data flow: `render_ceilings(ceiling records, admission rows, settings)` prints

- the ceilings: max batch, resident KV tokens, the compiled memory breakdown at the ceiling
  (weights, KV, temporaries, logits/outputs, peak vs limit) and the step time beside it
  (measured locally; for a TPU target the bytes-moved roofline, with XLA's own figure shown only
  when it passed the sanity check), and predicted ÷ measured against the reference engine's
  bisected ceilings (configs/baselines/jax-reference-capacity-v6e1.csv, TPU v6e-1);
- donated ÷ copying and ring ÷ full ceiling ratios; for a local run, measured ÷ compiled-predicted;
- prefill budgets (batch × prompt tokens per call);
- the agent-fleet admission table (harness/capacity/admission.py).

`plot_capacity` (registered for kind "capacity" with harness.plots) draws max agents against
context per agent for each KV dtype and sliding mode, with the fleet grid marked fit / no fit.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from harness.plots import register_plotter, save
from harness.results import is_failure

BASELINE = "jax-reference-capacity-v6e1"
GB = 1e9


def reference_ceilings() -> dict[tuple[str, bool, int], int]:
    """(kv dtype, donated, ctx) → max batch measured by the reference engine on TPU v6e-1."""
    from harness.results import load_baseline

    df = load_baseline(BASELINE)
    return {(r.kv_dtype, bool(r.donate), int(r.ctx)): int(r.max_batch) for r in df.itertuples()}


def _gb(v: Any) -> str:
    return "—" if v is None else f"{v / GB:.2f}"


def _step(c: dict[str, Any]) -> str:
    """The step time beside a ceiling: measured locally, else the roofline (XLA's own figure only when
    it passed the sanity check; the notes under the table say why one was dropped)."""
    if "step_ms_median" in c:
        return f"{c['step_ms_median']:.0f} measured"
    parts = []
    if "roofline_step_ms" in c:
        parts.append(f"{c['roofline_step_ms']:.1f} roofline")
    if "xla_optimal_s" in c and c.get("xla_time_plausible"):
        parts.append(f"{c['xla_optimal_s'] * 1e3:.1f} XLA")
    return ", ".join(parts) or "—"


def _is_reference_config(cfg: dict[str, Any]) -> bool:
    return (
        cfg["target"] == "tpu-v6e"
        and cfg["layers"] == "w4a16"
        and cfg["ple"] == "bf16"
        and cfg["sliding_kv"] == "full"
    )


def _label(c: dict[str, Any]) -> str:
    cfg = c["config"]
    prog = c["name"].split("/")[0]
    step = "donated" if cfg["donate"] else "copying"
    paged = " / paged" if cfg.get("kv_layout") == "paged" else ""
    return f"{'' if prog == 'decode' else prog + ' / '}{cfg['kv_dtype']} / {step} / {cfg['sliding_kv']} / ple {cfg['ple']}{paged}"


def ceilings_tables(ceilings: Sequence[dict[str, Any]], title: str) -> list[Any]:
    """Two tables that each fit 80 columns: the ceilings against the reference engine's, and the
    compiled (or measured) memory breakdown at each ceiling with its step time."""
    from rich.table import Table

    refs = reference_ceilings()
    top = Table(title=title, title_justify="left")
    mem = Table(title="memory at the ceiling (GB) and step time (ms)", title_justify="left")
    top.add_column("kv / step / sliding / ple", overflow="fold")
    mem.add_column("kv / step / sliding / ple", overflow="fold")
    for col in ("max B", "KV tokens", "ref B", "pred ÷ ref"):
        top.add_column(col, justify="right", no_wrap=True)
    for col in ("weights", "KV", "temps", "peak", "limit"):
        mem.add_column(col, justify="right", no_wrap=True)
    mem.add_column("step", justify="right", overflow="fold")
    for c in ceilings:
        cfg, label = c["config"], _label(c)
        if is_failure(c):
            top.add_row(label, "[red]error[/red]", "", "", "")
            continue
        prog = c["name"].split("/")[0]
        ref = (
            refs.get((cfg["kv_dtype"], bool(cfg["donate"]), int(cfg["ctx"])))
            if _is_reference_config(cfg) and prog == "decode"
            else None
        )
        ratio = f"{c['max_batch'] / ref:.3f}" if ref else "—"
        peak = c.get("host_vm_peak_bytes") if cfg["target"] == "local" else c.get("peak_bytes")
        tokens = f"{c['kv_tokens']:,}" + ("" if prog == "decode" else " (B×T)")
        top.add_row(label, f"{c['max_batch']}", tokens, str(ref or "—"), ratio)
        mem.add_row(label, _gb(c.get("weights_bytes")), _gb(c.get("kv_bytes")), _gb(c.get("temp_bytes")),
                    _gb(peak), _gb(c.get("limit_bytes")), _step(c))  # fmt: skip
    return [top, mem]


def ratio_lines(ceilings: Sequence[dict[str, Any]]) -> list[str]:
    """donated ÷ copying, ring ÷ full and paged ÷ contiguous ceiling ratios between matching decode
    configurations."""
    by_key = {_layout_key(c): c for c in ceilings if c["config"]["program"] == "decode" and "max_batch" in c}
    dec = {k: c["max_batch"] for k, c in by_key.items()}
    out = []
    for (lay, kv, don, sl, ple), b in sorted(dec.items()):
        paged = ", paged" if lay == "paged" else ""
        if don and dec.get((lay, kv, False, sl, ple)):
            other = dec[(lay, kv, False, sl, ple)]
            out.append(f"donated ÷ copying, kv {kv}, sliding {sl}, ple {ple}{paged}: {b} ÷ {other} = {b / other:.3f}")
    for (lay, kv, don, sl, ple), b in sorted(dec.items()):
        paged = ", paged" if lay == "paged" else ""
        if sl == "ring" and dec.get((lay, kv, don, "full", ple)):
            step = "donated" if don else "copying"
            other = dec[(lay, kv, don, "full", ple)]
            out.append(f"ring ÷ full sliding KV, kv {kv}, {step}{paged}: {b} ÷ {other} = {b / other:.2f}")
    for (lay, kv, don, sl, ple), b in sorted(dec.items()):
        if lay == "paged" and dec.get(("contiguous", kv, don, sl, ple)):
            step = "donated" if don else "copying"
            other = dec[("contiguous", kv, don, sl, ple)]
            out.append(f"paged ÷ contiguous, kv {kv}, {step}, sliding {sl}: {b} ÷ {other} = {b / other:.3f}")
            out += _paged_cost_lines(by_key[("paged", kv, don, sl, ple)], by_key[("contiguous", kv, don, sl, ple)])
    return out


def _layout_key(c: dict[str, Any]) -> tuple[Any, ...]:
    """(KV layout, kv dtype, donated, sliding, PLE) of a ceiling: what its ratios pair on."""
    cfg = c["config"]
    return (cfg.get("kv_layout", "contiguous"), cfg["kv_dtype"], cfg["donate"], cfg["sliding_kv"], cfg["ple"])


def _paged_cost_lines(paged: dict[str, Any], contiguous: dict[str, Any]) -> list[str]:
    """What the compiler says the paged read costs at the two ceilings, per sequence: XLA's bytes
    accessed (read as a ratio only: its absolute figure is not the byte model) and the temporaries.
    The step times priced above know nothing of it: the byte model has no gather."""
    pb, cb = paged.get("xla_bytes_accessed"), contiguous.get("xla_bytes_accessed")
    pt, ct = paged.get("temp_bytes"), contiguous.get("temp_bytes")
    if not (pb and cb and pt is not None and ct is not None):
        return []
    per_p, per_c = pb / paged["max_batch"], cb / contiguous["max_batch"]
    return [
        f"  compiled: XLA bytes accessed per sequence {per_p / 1e9:.2f} vs {per_c / 1e9:.2f} GB ({per_p / per_c:.2f}×), "
        f"temps {pt / 1e9:.2f} vs {ct / 1e9:.2f} GB; step times above price the paged step as the contiguous one"
    ]


def local_lines(ceilings: Sequence[dict[str, Any]]) -> list[str]:
    out = []
    for c in ceilings:
        if c["config"]["target"] != "local" or "predicted_max_batch" not in c:
            if "prediction_error" in c:
                out.append(f"{c['name']}: compiled prediction failed: {c['prediction_error']}")
            continue
        m, p = c["max_batch"], c["predicted_max_batch"]
        ratio = f"{m / p:.3f}" if p else ("1.000 (both 0)" if m == 0 else "∞")
        out.append(
            f"{c['name']}: measured ceiling {m} vs compiled prediction {p} (measured ÷ predicted {ratio}); "
            f"prediction = (cap {c['limit_bytes'] / 2**30:.2f} GiB − runtime {c['runtime_vm_bytes'] / 2**30:.2f} GiB − "
            f"fixed {c['predicted_fixed_bytes'] / GB:.2f} GB) ÷ {c['predicted_per_seq_bytes'] / 1e6:.0f} MB per sequence"
        )
    return out


def admission_table(rows: Sequence[dict[str, Any]]) -> Any:
    from rich.table import Table

    ctxs = sorted({r["agent_ctx"] for r in rows})
    t = Table(
        title="agent-fleet admission (✓ fits / ✗ does not; headroom GB, % of limit)", title_justify="left"
    )
    t.add_column("kv / sliding")
    t.add_column("agents", justify="right")
    for c in ctxs:
        t.add_column(f"{c // 1024}K ctx", justify="right")
    shared = [r for r in rows if r.get("shared_prefix")]
    rows = [r for r in rows if not r.get("shared_prefix")]
    keys = sorted({(r["kv_dtype"], r["sliding_kv"], r["agents"]) for r in rows})
    cell = {(r["kv_dtype"], r["sliding_kv"], r["agents"], r["agent_ctx"]): r for r in rows}
    for kv, sl, n in keys:
        vals = []
        for c in ctxs:
            r = cell[(kv, sl, n, c)]
            mark = "[green]✓[/green]" if r["fits"] else "[red]✗[/red]"
            vals.append(f"{mark} {r['headroom_bytes'] / GB:+.2f} ({r['headroom_pct']:+.0f}%)")
        t.add_row(f"{kv} / {sl}", str(n), *vals)
    maxrow = {}
    for r in rows:
        maxrow[(r["kv_dtype"], r["sliding_kv"], r["agent_ctx"])] = r["max_agents"]
    for kv, sl in sorted({(k[0], k[1]) for k in maxrow}):
        t.add_row(f"{kv} / {sl}", "max", *[str(maxrow[(kv, sl, c)]) for c in ctxs], style="bold")
    smax = {(r["kv_dtype"], r["sliding_kv"], r["agent_ctx"]): r for r in shared}
    for kv, sl in sorted({(k[0], k[1]) for k in smax}):
        n = next(r["shared_prefix"] for r in shared if (r["kv_dtype"], r["sliding_kv"]) == (kv, sl))
        vals = [str(smax[(kv, sl, c)]["max_agents"]) if (kv, sl, c) in smax else "—" for c in ctxs]
        t.add_row(f"{kv} / {sl}", f"max, {n} shared", *vals, style="bold")
    return t


def render_ceilings(
    ceilings: Sequence[dict[str, Any]], rows: Sequence[dict[str, Any]], settings: Any, console: Any
) -> None:
    where = (
        "compiled for " + settings.target if settings.target != "local" else "measured on the local device"
    )
    for table in ceilings_tables(ceilings, f"capacity ceilings, {settings.model}, ctx {settings.ctx}, {where}"):
        console.print(table)
    for line in ratio_lines(ceilings) + local_lines(ceilings):
        console.print(line, soft_wrap=True)
    for c in ceilings:
        if c.get("xla_cost_notes"):
            console.print(
                f"[dim]{c['name']}: XLA cost figures not used: {c['xla_cost_notes']}[/dim]", soft_wrap=True
            )
    if rows:
        console.print(admission_table(rows))


@register_plotter("capacity")
def plot_capacity(
    records: Sequence[dict[str, Any]], run_dir: Path, out_dir: Path, console: Any
) -> list[Path]:
    """Capacity frontier: max agents vs context per agent, per KV dtype × sliding, fleet grid marked."""
    from harness.plots import _pyplot

    rows = [r for r in records if r.get("record") == "admission" and not r["config"].get("shared_prefix")]
    if not rows:
        console.print("[dim]no admission records; capacity frontier skipped[/dim]")
        return []
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7.5, 5))
    series: dict[tuple[str, str], dict[int, int]] = {}
    for r in rows:
        series.setdefault((r["config"]["kv_dtype"], r["config"]["sliding_kv"]), {})[
            r["config"]["agent_ctx"]
        ] = r["max_agents"]
    for (kv, sl), pts in sorted(series.items()):
        xs = sorted(pts)
        ax.plot(
            xs,
            [max(pts[x], 0.5) for x in xs],
            marker="o",
            ls="-" if sl == "ring" else "--",
            label=f"KV {kv}, sliding {sl}",
        )
    for r in rows:
        c = r["config"]
        ax.scatter(
            c["agent_ctx"],
            c["agents"],
            marker="s",
            s=30,
            color="tab:green" if r["fits"] else "tab:red",
            alpha=0.35,
            zorder=0,
        )
    from matplotlib.ticker import NullFormatter

    ctxs = sorted({r["config"]["agent_ctx"] for r in rows})
    ax.set(
        xscale="log",
        yscale="log",
        xlabel="context per agent (tokens)",
        ylabel="max concurrent agents (sequences)",
    )
    ax.set_xticks(ctxs, [f"{x // 1024}K" for x in ctxs])
    ax.xaxis.set_minor_formatter(NullFormatter())
    c0 = rows[0]["config"]
    ax.set_title(
        f"capacity frontier: {c0['model']} on {c0['target']} (limit {rows[0]['limit_bytes'] / GB:.2f} GB)\n"
        "squares: fleet grid, agents × context (green fits, red does not)",
        fontsize=9,
    )
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    return save(fig, Path(out_dir), "capacity_frontier")
