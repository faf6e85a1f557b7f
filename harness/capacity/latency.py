"""Latency beside every capacity figure: predicted step time, tok/s, $/M tokens, and a TPOT ceiling.

Data flow::

    profile = calibrate.load_profile(target)           configs/profiles/<target>.toml, or None
    for each decode ceiling record (max batch B, its configuration):
        cost(b)  = costs.decode_cost(our step at b sequences, ctx, KV dtype, donated or copying)
        step(b)  = profile's decode model (± its held-out error band)   or, without a profile,
                   cost(b).bytes / nameplate bandwidth, labelled "roofline lower bound"
        tok/s    = b · 1000 / step(b)       $/M tokens = $/hour ÷ (tok/s · 3600) · 1e6
        --tpot-ms X: latency ceiling = the largest b with step(b) ≤ X (step is increasing in b;
                   bisection), binding = the smaller of the memory and the latency ceiling
    admission rows (N agents × C tokens): the same step time, tok/s, $/M and "meets TPOT".

A TPOT objective is a per-token decode latency: one decode step of the whole batch produces one
token per sequence, so step time = TPOT when decode runs alone (prefill interleaving adds to it).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Pricing:
    """How step times are priced: a profile (preferred) or the roofline at nameplate bandwidth."""

    profile: Any  # harness.calibrate.steptime.Profile | None
    bandwidth: float | None  # bytes/s, for the roofline fallback
    usd_per_hour: float | None
    usd_source: str

    @property
    def basis(self) -> str:
        if self.profile is not None:
            band = self.profile.model("decode").error_band_pct
            ref = self.profile.engine.startswith("reference")
            whose = "reference engine's step priced on our bytes, " if ref else ""
            return f"profile {self.profile.device} ({whose}± {band or 0:.1f}% held out)"
        return "roofline lower bound"


def pricing_for(target: str) -> Pricing:
    from harness.calibrate.main import load_profile
    from harness.hardware import load_hardware

    hw = load_hardware("cpu" if target == "local" else target)
    prof = load_profile(hw.id)
    if prof is not None and prof.model("decode") is None:
        prof = None
    return Pricing(
        prof,
        hw.value("peak_bandwidth_bytes_per_s"),
        hw.value("usd_per_hour"),
        hw.figures["usd_per_hour"].source,
    )


def _cost(
    model: str, layers: str, ple: str, kv: str, donate: bool, sliding: str, batch: int, ctx: int
) -> Any:
    from harness.calibrate.main import cost_of

    return cost_of({"model": model, "layers": layers, "ple": ple, "kv_dtype": kv, "donate": donate,
                    "sliding_kv": sliding, "batch": batch, "ctx": ctx})  # fmt: skip


def step_ms(pricing: Pricing, cfg: dict[str, Any], batch: int, ctx: int | None = None) -> float | None:
    """Predicted (profile) or lower-bound (roofline) step time of our decode step at `batch`."""
    cost = _cost(cfg["model"], cfg["layers"], cfg["ple"], cfg["kv_dtype"], bool(cfg["donate"]),
                 cfg["sliding_kv"], batch, int(ctx or cfg["ctx"]))  # fmt: skip
    if pricing.profile is not None:
        return pricing.profile.model("decode").predict(cost)
    return cost.bytes / pricing.bandwidth * 1e3 if pricing.bandwidth else None


def economics(pricing: Pricing, batch: int, ms: float | None) -> dict[str, Any]:
    if not ms or not batch:
        return {"tok_per_s": None, "usd_per_m_tokens": None}
    tps = batch * 1e3 / ms
    usd = pricing.usd_per_hour / (tps * 3600) * 1e6 if pricing.usd_per_hour else None
    return {"tok_per_s": tps, "usd_per_m_tokens": usd}


def latency_ceiling(pricing: Pricing, cfg: dict[str, Any], tpot_ms: float, upper: int) -> int:
    """Largest batch ≤ upper whose step time meets tpot_ms (0 if batch 1 does not)."""
    lo, hi = 0, upper + 1  # step(lo) meets (or lo = 0), step(hi) does not (or hi = upper + 1)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        ms = step_ms(pricing, cfg, mid)
        if ms is not None and ms <= tpot_ms:
            lo = mid
        else:
            hi = mid
    return lo


def ceiling_latency(
    ceilings: Sequence[dict[str, Any]], pricing: Pricing, tpot_ms: float | None
) -> list[dict[str, Any]]:
    """One row per decode ceiling: step time at the memory ceiling, tok/s, $/M; with a TPOT,
    the latency ceiling, its tok/s and $/M, and which ceiling binds."""
    rows = []
    for c in ceilings:
        cfg = c["config"]
        if cfg.get("program") != "decode" or not c.get("max_batch"):
            continue
        b = int(c["max_batch"])
        ms = step_ms(pricing, cfg, b)
        step = ("donated" if cfg["donate"] else "copying") + (" paged" if cfg.get("kv_layout") == "paged" else "")
        row = {"name": c["name"], "kv_dtype": cfg["kv_dtype"], "step": step,
               "sliding_kv": cfg["sliding_kv"], "memory_ceiling": b, "step_ms_at_memory": ms,
               **economics(pricing, b, ms), "basis": pricing.basis}  # fmt: skip
        if tpot_ms is not None:
            lat = latency_ceiling(pricing, cfg, tpot_ms, upper=max(4 * b, 64))
            use = min(lat, b)
            ms_use = step_ms(pricing, cfg, use) if use else None
            row.update({"tpot_ms": tpot_ms, "latency_ceiling": lat, "binding": "latency" if lat < b else "memory",
                        "batch_at_tpot": use, "step_ms_at_tpot": ms_use,
                        **{f"{k}_at_tpot": v for k, v in economics(pricing, use, ms_use).items()}})  # fmt: skip
        rows.append(row)
    return rows


def annotate_admission(
    rows: list[dict[str, Any]], settings: Any, pricing: Pricing, tpot_ms: float | None
) -> None:
    """Add step time (our donated step, N agents at C tokens), tok/s, $/M and 'meets TPOT' to each row."""
    for r in rows:
        cfg = {"model": settings.model, "layers": settings.layers, "ple": settings.ple[0], "kv_dtype": r["kv_dtype"],
               "donate": True, "sliding_kv": r["sliding_kv"], "ctx": r["agent_ctx"]}  # fmt: skip
        ms = step_ms(pricing, cfg, int(r["agents"]))
        r.update({"step_ms": ms, **economics(pricing, int(r["agents"]), ms), "step_basis": pricing.basis})
        if tpot_ms is not None:
            r["meets_tpot"] = ms is not None and ms <= tpot_ms


def latency_tables(rows: Sequence[dict[str, Any]], pricing: Pricing, tpot_ms: float | None) -> list[Any]:
    """Step time, tok/s and $/M tokens at each memory ceiling; with a TPOT objective a second table
    (each fits 80 columns): the latency ceiling, which of the two binds, and the figures at the
    batch that meets both."""
    from rich.table import Table

    def f(v: Any, fmt: str) -> str:
        return "—" if v is None else format(v, fmt)

    usd = f"$/M tok (${pricing.usd_per_hour}/h)" if pricing.usd_per_hour else "$/M tok (no price)"
    mem = Table(title=f"step time and cost at each memory ceiling — {pricing.basis}", title_justify="left")
    mem.add_column("kv / step / sliding", overflow="fold")
    for col in ("memory ceiling", "step ms", "tok/s", usd):
        mem.add_column(col, justify="right", overflow="fold")
    for r in rows:
        mem.add_row(f"{r['kv_dtype']} / {r['step']} / {r['sliding_kv']}", str(r["memory_ceiling"]),
                    f(r["step_ms_at_memory"], ".1f"), f(r["tok_per_s"], ",.0f"), f(r["usd_per_m_tokens"], ".3f"))  # fmt: skip
    if tpot_ms is None:
        return [mem]
    lat = Table(title=f"TPOT objective {tpot_ms:g} ms: memory vs latency ceiling", title_justify="left")
    lat.add_column("kv / step / sliding", overflow="fold")
    for col in ("memory", "latency", "binds", "batch", "step ms", "tok/s", "$/M tok"):
        lat.add_column(col, justify="right", overflow="fold")
    for r in rows:
        lat.add_row(f"{r['kv_dtype']} / {r['step']} / {r['sliding_kv']}", str(r["memory_ceiling"]),
                    str(r["latency_ceiling"]), r["binding"], str(r["batch_at_tpot"]), f(r["step_ms_at_tpot"], ".1f"),
                    f(r["tok_per_s_at_tpot"], ",.0f"), f(r["usd_per_m_tokens_at_tpot"], ".3f"))  # fmt: skip
    return [mem, lat]


def admission_latency_table(rows: Sequence[dict[str, Any]], pricing: Pricing, tpot_ms: float | None) -> Any:
    """Agent fleet × context: our donated step's time (✓/✗ against the TPOT), tok/s and $/M tokens."""
    from rich.table import Table

    ctxs = sorted({r["agent_ctx"] for r in rows})
    goal = f", ✓/✗ TPOT {tpot_ms:g} ms" if tpot_ms is not None else ""
    t = Table(
        title=f"agent-fleet step time (ms{goal}) · tok/s · $/M tokens — {pricing.basis}", title_justify="left"
    )
    t.add_column("kv / sliding")
    t.add_column("agents", justify="right")
    for c in ctxs:
        t.add_column(f"{c // 1024}K ctx", justify="right")
    cell = {(r["kv_dtype"], r["sliding_kv"], r["agents"], r["agent_ctx"]): r for r in rows}
    for kv, sl, n in sorted({(r["kv_dtype"], r["sliding_kv"], r["agents"]) for r in rows}):
        vals = []
        for c in ctxs:
            r = cell[(kv, sl, n, c)]
            if r.get("step_ms") is None:
                vals.append("—")
                continue
            mark = "" if tpot_ms is None else (" [green]✓[/green]" if r["meets_tpot"] else " [red]✗[/red]")
            usd = f" · ${r['usd_per_m_tokens']:.2f}" if r.get("usd_per_m_tokens") else ""
            vals.append(f"{r['step_ms']:.1f}{mark} · {r['tok_per_s']:,.0f}{usd}")
        t.add_row(f"{kv} / {sl}", str(n), *vals)
    return t
