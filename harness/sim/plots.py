"""The planner's figures (matplotlib Agg, PNG + SVG).

- validation.png: predicted (dashed) vs measured (solid) against concurrency, one panel per metric
  (TTFT, TPOT, E2E p50 and p99, output tok/s), one colour per validated run (workload).
- frontier.png: agents per chip vs TPOT p50 (solid) and p99 (dashed), one colour per knob setting,
  from every point the fleet search simulated, with the TPOT objective drawn in.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

PANELS = (("median_ttft_ms", "TTFT p50 (ms)"), ("p99_ttft_ms", "TTFT p99 (ms)"), ("median_tpot_ms", "TPOT p50 (ms)"),
          ("p99_tpot_ms", "TPOT p99 (ms)"), ("median_e2el_ms", "E2E p50 (ms)"), ("output_throughput", "output tok/s"))  # fmt: skip


def _save(fig: Any, out: Path, stem: str) -> list[Path]:
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    paths = [out / f"{stem}.{ext}" for ext in ("png", "svg")]
    for p in paths:
        fig.savefig(p, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return paths


def validation_plot(docs: list[dict[str, Any]], out: Path) -> list[Path]:
    """`docs`: validate() results (with their measured and predicted summaries)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 3, figsize=(13, 7))
    for i, doc in enumerate(docs):
        color = f"C{i}"
        for ax, (key, title) in zip(axes.flat, PANELS, strict=True):
            for src, style in (("measured", "-o"), ("predicted", "--x")):
                pts = [
                    (lv["concurrency"], lv.get(key)) for lv in doc[src]["levels"] if lv.get(key) is not None
                ]
                if pts:
                    xs, ys = zip(*pts, strict=True)
                    ax.plot(xs, ys, style, color=color, label=f"{doc['workload']} {src}")
            ax.set_title(title)
            ax.set_xscale("log", base=2)
            ax.set_xlabel("concurrency")
    axes.flat[0].legend(fontsize=8)
    fig.suptitle("serve-load measured (solid) vs plan --validate predicted (dashed)")
    return _save(fig, out, "validation")


def frontier_plot(fleet: dict[str, Any], out: Path, tpot_slo_ms: float | None) -> list[Path]:
    """`fleet`: planner.fleet_json output."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    for i, s in enumerate(fleet["settings"]):
        pts = sorted(
            (p["agents"], p["median_tpot_ms"], p["p99_tpot_ms"]) for p in s["probes"] if p["median_tpot_ms"]
        )
        if not pts:
            continue
        xs, p50, p99 = zip(*pts, strict=True)
        ax.plot(xs, p50, "-o", color=f"C{i}", label=f"{s['knobs']} p50")
        ax.plot(xs, p99, "--", color=f"C{i}", label=f"{s['knobs']} p99")
    if tpot_slo_ms is not None:
        ax.axhline(tpot_slo_ms, color="k", lw=0.8, ls=":", label=f"TPOT SLO {tpot_slo_ms:g} ms")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("concurrent agents per chip")
    ax.set_ylabel("TPOT (ms)")
    ax.set_title(f"plan frontier · {fleet['target']} (simulated)")
    ax.legend(fontsize=7)
    return _save(fig, out, "frontier")
