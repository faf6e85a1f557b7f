"""What `g4bench plan` runs: targets and profiles resolved once, then validation or fleet sizing.

    target  = resolve_target("tpu-v6e")         Target(hardware, profile, model, weight format, limit)
    pricer_for(shape)                            a StepPricer for that server shape (pricing.py)
    run_validate(run_dirs, target, out, console) predicted ÷ measured tables (validate.py)
    run_fleet(target, workload, slo, knobs, agents, out, console)   sizing per knob (fleet.py)

Targets: "local" (this host: the CPU profile fitted from `g4bench engine-steps`, the small model,
f32 layers as the CPU engine serves them, host memory as the limit) and accelerator ids
(tpu-v5e, tpu-v6e, h200 → configs/hardware/nvidia-h200.toml: E2B, W4A16 layers, usable HBM as the
limit, the profile configs/profiles/<id>.toml when there is one, else the hardware roofline).
Every assumption the numbers rest on is collected in `Target.assumptions` and printed.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.markup import escape

from g4bench.engine.served_step import ServedStep
from harness.sim.fleet import Knobs, Sizing, costs_of, memory_ceiling, size_one
from harness.sim.simulate import ServerShape

ALIASES = {"h100": "nvidia-h100", "h200": "nvidia-h200", "local": "cpu"}
LOCAL_PROFILE = "cpu-2core-engine"


@dataclass
class Target:
    id: str
    hardware: Any
    profile: Any  # harness.calibrate.steptime.Profile | None
    model: str
    fmt: Any  # WeightFormat
    limit_bytes: int
    usd_per_hour: float | None
    assumptions: list[str] = field(default_factory=list)

    def pricer_for(self, shape: ServerShape) -> Any:
        from g4bench.engine.served_step import ServedStep
        from g4bench.model.config import load_config
        from harness.calibrate.step_record import check
        from harness.sim.pricing import StepPricer

        if self.profile is not None:  # refuse a profile fitted on another step than the one simulated
            check(self.profile, ServedStep.served().with_(
                kv_layout=shape.kv_layout, sliding_kv=shape.sliding_kv, kv_dtype=shape.kv_dtype,
                chunk_size=shape.chunk_size, max_batched_tokens=getattr(shape, "max_batched_tokens", None),
                prefill_policy=getattr(shape, "prefill_policy", None)))  # fmt: skip

        return StepPricer.for_engine(self.profile, load_config(shape.model), self.fmt, shape.engine_config(),
                                     self.hardware)  # fmt: skip


def _band(profile: Any) -> str:
    parts = []
    for prog, m in profile.programs.items():
        v = m.validation
        band = m.error_band_pct
        held = (
            f"held-out max {v['holdout_max_abs_pct']:.0f}%"
            if "holdout_max_abs_pct" in v
            else f"LOO max {v.get('loo_max_abs_pct', float('nan')):.0f}%"
        )
        parts.append(
            f"{prog}: ±{band:.0f}% ({held}, {v.get('n_fit')} fit points)"
            if band is not None
            else f"{prog}: unvalidated"
        )
    if "mixed" not in profile.programs:  # the served step's call: say what prices it and that no band covers it
        rates = "prefill" if "prefill" in profile.programs else "decode"
        parts.append(f"mixed: no mixed fit, priced with the [{rates}] rates, no validated band")
    return "; ".join(parts)


def resolve_target(target: str, profile: str | None = None, model: str | None = None) -> Target:
    """Hardware, profile, model and weight format for `target` (see the module docstring)."""
    from g4bench.model.params import WeightFormat
    from harness.calibrate.main import load_profile
    from harness.hardware import load_hardware

    hw_id = ALIASES.get(target, target)
    hw = load_hardware(hw_id)
    local = hw_id == "cpu"
    prof = load_profile(profile or (LOCAL_PROFILE if local else hw_id))
    if profile and prof is None:
        raise FileNotFoundError(f"no profile {profile!r} (a path or configs/profiles/<id>.toml)")
    if local:
        from g4bench.engine.loading import default_format
        from g4bench.model.config import load_config

        mdl = model or "small"
        fmt = default_format(load_config(mdl))
        limit = int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
        limit_src = "host physical memory"
    else:
        mdl = model or "e2b"
        fmt = WeightFormat(layers="w4a16", ple="bf16", embed="bf16")
        usable = hw.value("usable_hbm_bytes")
        limit = int(usable or hw.value("hbm_bytes") or 0)
        limit_src = "usable HBM" if usable else "HBM"
    usd = hw.value("usd_per_hour")
    price = f"${usd:.2f}/hour" if usd else "unknown"
    t = Target(target, hw, prof, mdl, fmt, limit, usd)
    t.assumptions += [
        f"hardware: {hw.name} ({hw_id}); memory limit {limit / 2**30:.2f} GiB ({limit_src}); price {price}",
        f"model {mdl}, weights layers={fmt.layers} ple={fmt.ple} embed={fmt.embed} (synthetic shapes as served)",
    ]
    if prof is None:
        t.assumptions.append("step times: hardware roofline (no profile): a lower bound, not a prediction")
    else:
        pv = prof.provenance
        t.assumptions.append(
            f"profile {prof.device} ({prof.engine}); fitted from {', '.join(map(str, pv.get('runs', [])))}; "
            f"error band {_band(prof)}"
        )
        if prof.model("prefill") is None:
            t.assumptions.append(
                "prefill: no prefill fit in this profile; prefill calls are priced with the decode model's fitted "
                "rates on prefill bytes/FLOPs (costs.prefill_cost); TTFT carries that extra, unvalidated error"
            )
    return t


def cli_target(target: str, profile: str | None = None, model: str | None = None) -> Target:
    """`resolve_target` for a command line: an unknown target is a usage error that lists them, and
    the assumptions are printed before any figure."""
    from harness.args import target_hardware

    target_hardware(target)
    t = resolve_target(target, profile, model)
    for line in t.assumptions:
        print(f"assumption: {line}")
    return t


def capacity_overheads(run_dir: Path, target: Target) -> dict[tuple[str, str], tuple[int, str]]:
    """{(kv dtype, sliding KV): (non-KV bytes, source)} from a capacity run's donated ceilings on the
    served KV layout, compiled for `target` (what the admission arithmetic adds to the KV rows: the
    weights plus the compiled step's temporaries, harness/capacity/admission.overhead_of).
    ValueError naming the run when it holds no such ceiling."""
    from g4bench.engine.served_step import ServedStep
    from harness.capacity.admission import overhead_of
    from harness.results import RECORDS_FILE, read_records

    if not (Path(run_dir) / RECORDS_FILE).is_file():
        raise ValueError(f"--capacity {run_dir}: no {RECORDS_FILE} (a `g4bench capacity` run folder)")
    layout = ServedStep.served().kv_layout
    out: dict[tuple[str, str], tuple[int, str]] = {}
    for rec in read_records(Path(run_dir), validate=False):
        cfg = rec.get("config", {})
        if rec.get("record") != "ceiling" or cfg.get("target") != target.hardware.id or not cfg.get("donate"):
            continue
        if cfg.get("kv_layout", "contiguous") != layout or cfg.get("program", "decode") != "decode":
            continue
        oh = overhead_of(rec)
        if oh is not None:
            att = rec.get("attention", "?")
            out[(cfg["kv_dtype"], cfg["sliding_kv"])] = (
                oh, f"capacity run {run_dir} (compiled at its {rec['max_batch']}-row ceiling, attention {att})"
            )
    if not out:
        raise ValueError(
            f"--capacity {run_dir}: no donated {layout} decode ceiling compiled for {target.hardware.id} in it"
        )
    return out


def run_fleet(target: Target, workload: Any, slo: Any, knobs: list[Knobs], agents: int,
              overhead: dict[tuple[str, str], tuple[int, str]] | None,
              console: Any) -> list[tuple[Sizing, dict[str, Any]]]:  # fmt: skip
    """Size every knob setting; print the assumptions and the table; return (sizing, costs) rows.
    `overhead`: the non-KV bytes and their source per (KV dtype, sliding KV) (`capacity_overheads`);
    None, or a knob it lacks: the weights alone."""
    from g4bench.model.config import load_config
    from g4bench.model.params import param_bytes
    from harness.load.defaults import server_max_len
    from harness.sim.fleet import agents_runner

    ctx = workload.max_context
    max_len = server_max_len(ctx)
    weights = param_bytes(load_config(target.model), target.fmt)
    why = "the capacity run has no ceiling for this KV dtype and sliding KV" if overhead else "no capacity run given"
    run = agents_runner(workload, slo, target.pricer_for)
    out = []
    used: dict[str, tuple[int, str]] = {}
    for k in knobs:
        oh = (overhead or {}).get((k.kv_dtype, k.sliding_kv), (weights, f"weights only ({why})"))
        used[k.label] = oh
        ceiling = memory_ceiling(target.model, k, max_len, target.limit_bytes, oh[0])
        sizing = size_one(k, workload, slo, target.model, ceiling, oh[1], run, max_len)
        out.append((sizing, costs_of(sizing, target.usd_per_hour, agents)))
    target.assumptions += [
        f"workload {workload.kind}: {workload.turns_per_task} turns, first prompt {workload.input_len}, output "
        f"{workload.output_len}, tool result {workload.tool_result_tokens}, shared prefix {workload.prefix_len} → "
        f"context up to {ctx} (server max_len {max_len}); one task per agent, closed loop",
        f"SLO {slo.describe()}; an agent count passes when task SLO attainment ≥ {slo.attainment_target:g}",
        "memory ceiling: admission arithmetic (harness/capacity/admission.py), overhead "
        + "; ".join(f"{label} {oh[0] / 2**30:.2f} GiB from {oh[1]}" for label, oh in used.items())
        + "; block rounding and the cached-window reserve not counted",
        f"engine step priced: {ServedStep.served().describe()} (KV dtype and sliding KV per row), attention "
        f"{served_attention(target.hardware.platform)}, the real Scheduler (continuous batching, mixed prefill, "
        "prefix reuse); HTTP and client overheads not modelled",
    ]
    return out


def served_attention(platform: str) -> str:
    """What the served step's attention is on `platform` and how the pricing counts it."""
    if platform == "tpu":
        return ("the Pallas paged kernel (g4bench/model/paged_kernels.py; bytes priced as the keys it reads, "
                "g4bench/model/costs.py)")  # fmt: skip
    if platform == "gpu":
        return "plain JAX (the paged read is a gather there; priced as the keys it needs, a lower bound)"
    return "plain JAX, key-blocked on the CPU"


def print_fleet(rows: list[tuple[Sizing, dict[str, Any]]], target: Target, agents: int, console: Any) -> None:
    """Two tables that fit an 80-column log (sizing and cost; latency at the ceiling), then one line
    per knob setting saying what binds."""
    from harness.tables import fitted_table

    for line in target.assumptions:
        console.print(f"  assumption: {escape(line)}", soft_wrap=True)

    def f(v: Any, nd: int = 1) -> str:
        return "—" if v is None else f"{v:.{nd}f}"

    sizing, latency = [], []
    for s, c in rows:
        top = s.at_ceiling.summary if s.at_ceiling else {}
        sizing.append([s.knobs.label, str(s.memory_ceiling), str(s.agents_per_chip), str(c["chips"] or "—"),
                       f(c["usd_per_m_output_tokens"], 3), f(c["usd_per_agent_hour"], 4)])  # fmt: skip
        latency.append([s.knobs.label, f(top.get("median_tpot_ms")), f(top.get("p99_tpot_ms")),
                        f(top.get("median_ttft_ms")), f(c["output_tok_per_s_per_chip"], 0)])  # fmt: skip
    console.print(fitted_table(f"plan · {target.id} · {agents} agents: sizing and cost",
                               ["knobs", "mem ceiling", "agents/chip", "chips", "$/M out tok", "$/agent-h"], sizing))  # fmt: skip
    console.print(fitted_table("at the agents-per-chip ceiling (ms)",
                               ["knobs", "TPOT p50", "TPOT p99", "TTFT p50", "tok/s/chip"], latency))  # fmt: skip
    for s, _ in rows:
        console.print(f"  {s.knobs.label} binds on: {s.binding}", soft_wrap=True)


def fleet_json(rows: list[tuple[Sizing, dict[str, Any]]], target: Target, agents: int) -> dict[str, Any]:
    settings: list[dict[str, Any]] = []
    out = {"target": target.id, "agents": agents, "assumptions": target.assumptions, "settings": settings}
    for s, c in rows:
        settings.append({
            "knobs": s.knobs.label, "kv_dtype": s.knobs.kv_dtype, "sliding_kv": s.knobs.sliding_kv,
            "max_slots": s.knobs.max_slots, "memory_ceiling": s.memory_ceiling, "agents_per_chip": s.agents_per_chip,
            "binding": s.binding, **c,
            "probes": [{"agents": p.agents, "attainment": p.attainment,
                        **{k: p.summary.get(k) for k in ("median_tpot_ms", "p99_tpot_ms", "median_ttft_ms",
                                                         "p99_ttft_ms", "output_throughput")}} for p in s.probes],
        })  # fmt: skip
    return out


def write_json(path: Path, doc: dict[str, Any]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=2, default=str) + "\n", encoding="utf-8")
    return path


def run_validate(run_dirs: list[Path], target: Target, out: Path, console: Any) -> list[dict[str, Any]]:
    """Re-simulate each measured run (validate.py); print predicted ÷ measured per metric and
    concurrency, and the headline over every run's TTFT / TPOT / E2E p50 cells."""
    from harness.sim.validate import headline, validate

    for line in target.assumptions:
        console.print(f"  assumption: {escape(line)}", soft_wrap=True)
    docs = [validate(Path(d), target.pricer_for, out / f"sim-{Path(d).name}") for d in run_dirs]
    for doc in docs:
        print_validation(doc, console)
    overall = headline([r for d in docs for r in d["rows"]])
    if overall["cells"]:
        console.print(
            f"  [bold]all runs: median |error| {overall['median_abs_error_pct']:.1f}%, max "
            f"{overall['max_abs_error_pct']:.1f}% over {overall['cells']} TTFT/TPOT/E2E p50 cells[/bold]"
        )
    write_json(out / "validation.json", {"runs": [{k: d[k] for k in ("run_dir", "workload", "rows", "headline",
               "pricing", "error_band_pct")} for d in docs], "headline": overall, "assumptions": target.assumptions})  # fmt: skip
    return docs


def print_validation(doc: dict[str, Any], console: Any) -> None:
    from rich.table import Table

    from harness.sim.validate import METRICS

    levels = sorted({r["concurrency"] for r in doc["rows"]})
    t = Table(
        title=f"plan --validate {doc['run_dir']} ({doc['workload']}): predicted ÷ measured",
        title_justify="left",
    )
    t.add_column("metric", justify="left")
    for c in levels:
        t.add_column(f"c={c}", justify="right")
    cell = {(r["metric"], r["concurrency"]): r for r in doc["rows"]}
    for m in METRICS:
        row = [m]
        for c in levels:
            r = cell.get((m, c))
            row.append("—" if r is None else f"{r['ratio']:.2f} ({r['measured']:.0f}→{r['predicted']:.0f})")
        t.add_row(*row)
    console.print(t)
    h = doc["headline"]
    if h["cells"]:
        console.print(
            f"  p50 cells: median |error| {h['median_abs_error_pct']:.1f}%, max {h['max_abs_error_pct']:.1f}%"
        )
