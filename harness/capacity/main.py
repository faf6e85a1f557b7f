"""A capacity run: settings → run folder → one search per configuration → tables, CSV, plot.

Data flow::

    resolve_settings(request)    limit (local: a stated fraction of available RAM, also the
                                 children's RLIMIT_AS; TPU: the device's usable HBM, corrected by
                                 the compiler's own figure once an OOM message states it)
    open_run (harness/run.py): folder, command.txt, env.json(settings)
    for each configuration (harness.capacity.probes.configurations):
        Driver.run(estimate)  → probe records appended as they happen, then a ceiling record
        local decode: local_prediction() → the compiled prediction beside the measured ceiling
    admission table (harness/capacity/admission.py) → admission records + admission.csv
    render tables (harness/capacity/report.py) · finish: summary.csv, plots/capacity_frontier.png

A configuration whose search stops on a real error (ProbeError) is recorded as a failure and the
run goes on; `CapacityOutcome.errors` lists them (exit 1).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rich.markup import escape

from g4bench.engine.served_step import ServedStep
from harness.capacity.aot import cuda_plugin_needed, has_cuda_plugin
from harness.capacity.probes import (
    Driver,
    Settings,
    ceiling_fields,
    configurations,
    estimate_batch,
    local_prediction,
)
from harness.capacity.search import ProbeError
from harness.results import is_failure
from harness.run import CHILD_TIMEOUT_S, COMPILE_TIMEOUT_S, CPU_LAYERS, RequestError

DEFAULT_RAM_FRACTION = 0.75
COMPILE_CHILD_CAP = 8 * 2**30  # a deviceless E2B compile peaks near 2.2 GiB of address space


class CapacityError(RequestError):
    """An unusable request (unknown target, nothing to run); exit code 2."""


@dataclass(frozen=True)
class CapacityRequest:
    """The command line's values; None = not given (the target's default)."""

    target: str | None = None  # "local" or a hardware id with an aot_topology
    model: str | None = None
    ctx: int | None = None
    kv: tuple[str, ...] | None = None
    steps: tuple[str, ...] | None = None  # "donated" | "copying"
    ple: tuple[str, ...] | None = None
    sliding: tuple[str, ...] | None = None  # "full" | "ring"
    kv_layouts: tuple[str, ...] | None = None  # "contiguous" | "paged" (decode configurations)
    layers: str | None = None
    compute: str | None = None
    prefill_tokens: tuple[int, ...] | None = None
    tol: float | None = None
    tpot_ms: float | None = None
    mem_limit_bytes: int | None = None
    timeout_s: float | None = None
    shared_prefix: int | None = None
    agents: tuple[int, ...] | None = None  # the admission table's fleet sizes (None: admission.AGENTS)
    agent_ctx: tuple[int, ...] | None = None  # its contexts per agent (None: admission.AGENT_CTX)


@dataclass
class CapacityOutcome:
    run_dir: Path
    ceilings: list[dict[str, Any]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


def local_accelerator_limit(timeout_s: float) -> tuple[int, str] | None:
    """(bytes, source) of the local accelerator's allocator limit, read in a fresh child; None on a
    host without accelerator device files (the CPU path: RAM and RLIMIT_AS). With
    XLA_PYTHON_CLIENT_PREALLOCATE=false each probe then takes only what its step needs, and an
    oversized probe fails with the allocator's RESOURCE_EXHAUSTED (recorded as "oom")."""
    import os

    from harness.isolate import run_isolated
    from harness.load.server import has_accelerator

    if not has_accelerator():
        return None
    dev = run_isolated("harness.checks.doctor:device_child", {}, timeout_s=timeout_s)
    if is_failure(dev):
        detail = dev["failure"]["detail"]
        raise CapacityError(f"could not read the local accelerator's memory limit: {detail}")
    if dev.get("platform") == "cpu" or not dev.get("bytes_limit"):
        return None
    prealloc = os.environ.get("XLA_PYTHON_CLIENT_PREALLOCATE", "true")
    return int(dev["bytes_limit"]), (
        f"{dev['device_kind']} allocator bytes_limit (XLA_PYTHON_CLIENT_PREALLOCATE={prealloc})"
    )


def resolve_settings(req: CapacityRequest, console: Any) -> Settings:
    """Fill defaults and print every choice that was not given explicitly."""
    import psutil

    from harness.hardware import load_hardware

    target = req.target or "local"
    local = target == "local"
    timeout = req.timeout_s or (CHILD_TIMEOUT_S if local else COMPILE_TIMEOUT_S)
    device_limit = local_accelerator_limit(timeout) if local else None
    if device_limit is not None:
        limit, source = device_limit
        console.print(
            f"local accelerator: limit {limit / 2**30:.2f} GiB = {source}; no address-space cap "
            "(GPU runtimes reserve far more virtual memory than they use)"
        )
        layers = req.layers or "w4a16"
        mem_cap = None
    elif local:
        avail = psutil.virtual_memory().available
        if req.mem_limit_bytes:
            limit, source = int(req.mem_limit_bytes), "--mem-limit-gib"
        else:
            limit = int(avail * DEFAULT_RAM_FRACTION)
            source = f"{DEFAULT_RAM_FRACTION:.0%} of available RAM ({avail / 2**30:.1f} GiB, psutil)"
        if limit > avail:
            raise CapacityError(
                f"memory cap {limit / 2**30:.1f} GiB exceeds available RAM {avail / 2**30:.1f} GiB"
            )
        console.print(
            f"local probes: address-space cap (RLIMIT_AS) {limit / 2**30:.2f} GiB per child = {source}"
        )
        layers = req.layers or CPU_LAYERS
        if not req.layers:
            console.print(
                "local CPU weight format: layers f32, PLE bf16, embed f32 — the engine's CPU default "
                "(g4bench.engine.loading.default_format). Compiled for this CPU it also has the smallest "
                "footprint: W4A16 and bf16 layers are converted at use and XLA's CPU buffer assignment keeps "
                "every layer's f32 copy live (temps 9.5-11.5 GB at batch 1-8 vs 1.2 GB for f32)."
            )
        mem_cap = limit
    else:
        hw = load_hardware(target)
        if not hw.aot_topology:
            raise CapacityError(
                f"{target} has no aot_topology (no deviceless compile): compile targets are tpu-v5e, tpu-v6e, "
                "tpu-v5p, h100, h200; on the device itself run `g4bench capacity --target local`"
            )
        if hw.platform == "gpu" and not has_cuda_plugin():
            raise CapacityError(cuda_plugin_needed(target))
        usable = hw.value("usable_hbm_bytes")
        limit = int(usable or hw.value("hbm_bytes") or 0)
        fig = hw.figures["usable_hbm_bytes" if usable else "hbm_bytes"]
        source = f"{hw.name}: {'usable' if usable else 'nameplate (usable unknown)'} HBM — {fig.source}"
        if hw.platform == "gpu" and req.mem_limit_bytes:
            limit, source = int(req.mem_limit_bytes), "--mem-limit-gib"
        if hw.platform == "gpu":
            console.print(
                f"limit {limit / 2**30:.2f} GiB: {source}. XLA:GPU allocates at run time, so a probe fits "
                "when its compiled peak (args + out + temps − donated) is within it; JAX's allocator gets "
                "XLA_PYTHON_CLIENT_MEM_FRACTION of the device (0.75 unless set): serve with it set to match, "
                "or give --mem-limit-gib"
            )
        else:
            console.print(
                f"limit {limit / 2**30:.2f} GiB: {source}; the compiler's own limit is read from its OOM messages"
            )
        layers = req.layers or "w4a16"
        mem_cap = COMPILE_CHILD_CAP
    return Settings(
        model=req.model or "e2b",
        ctx=int(req.ctx or 8192),
        target=target,
        kv=tuple(req.kv or ("bf16", "int8")),
        steps=tuple(req.steps or ("donated", "copying")),
        ple=tuple(req.ple or ("bf16",)),
        sliding=tuple(req.sliding or ("full", "ring")),
        kv_layouts=tuple(req.kv_layouts or (ServedStep.served().kv_layout,)),
        layers=layers,
        compute=req.compute,
        limit_bytes=limit,
        limit_source=source,
        mem_limit_bytes=mem_cap,
        timeout_s=float(timeout),
        tol=float(req.tol) if req.tol is not None else default_tol(target),
        prefill_tokens=tuple(req.prefill_tokens or ()),
        tpot_ms=req.tpot_ms,
    )


LOCAL_TOL = 0.02  # a local probe allocates and runs: each costs seconds to minutes of the machine's memory
COMPILE_TOL = 0.0  # a compile probe is deterministic and the linear guess lands next to the boundary


def default_tol(target: str) -> float:
    """Bisection tolerance when none is asked for: within 2% on the local device, exact for a compile
    target (the compiler's fit/no-fit answer has no noise, and one or two more compiles settle the last
    2% — 173 vs 175 sequences on v6e, where the reference engine measured 174)."""
    return LOCAL_TOL if target == "local" else COMPILE_TOL


def run_capacity(
    req: CapacityRequest, *, out: Path | None, argv: list[str], console: Any, results_root: Path = Path("results")
) -> CapacityOutcome:
    """The whole command: settle settings, search each configuration's ceiling, build the latency and
    admission tables, print them; the run folder's lifecycle (folder, command, env, summary, plots)
    is harness/run.py's. Raises `CapacityError` (a `RequestError`) for unusable requests."""
    import psutil

    from harness.capacity.admission import AGENT_CTX, AGENTS, admission_rows, write_admission_csv
    from harness.capacity.latency import (
        admission_latency_table,
        annotate_admission,
        ceiling_latency,
        latency_tables,
        pricing_for,
    )
    from harness.capacity.report import render_ceilings
    from harness.hardware import load_hardware
    from harness.run import finish, open_run

    s = resolve_settings(req, console)
    folder = open_run(
        out=out,
        results_root=results_root,
        short_name=f"capacity-{s.target}",
        argv=argv,
        settings=asdict(s),
        identity=asdict(s),
        device=None,  # each probe's child reports its own device
        timeout_s=s.timeout_s,
        mem_limit_bytes=s.mem_limit_bytes,
    )
    run_dir = folder.path
    hw = load_hardware("cpu" if s.target == "local" else s.target)
    outcome = CapacityOutcome(run_dir)
    records: list[dict[str, Any]] = []

    def record(
        name: str, config: dict[str, Any], fields: dict[str, Any], device: Any = None
    ) -> dict[str, Any]:
        rec = folder.append(folder.record("capacity", name, config, device, **fields))
        records.append(rec)
        return rec

    configs = configurations(s)
    console.print(f"run folder {run_dir}; {len(configs)} configurations; tolerance {s.tol:.0%}")
    for i, cfg in enumerate(configs, 1):
        if s.target == "local" and s.mem_limit_bytes is not None:
            avail = psutil.virtual_memory().available
            if avail < s.limit_bytes * 1.05:
                msg = f"{cfg.name}: only {avail / 2**30:.1f} GiB available now, below the cap; not probing (would endanger the machine)"
                outcome.errors.append(msg)
                console.print(f"[red]{escape(msg)}[/red]")
                continue
        est = estimate_batch(cfg.case, cfg.program, s.limit_bytes, cfg.tokens)
        console.print(f"[bold]{i}/{len(configs)} {cfg.name}[/bold]: arithmetic estimate {est}")
        drv = Driver(cfg, s.limit_bytes, folder, record, console.print)
        try:
            search = drv.run(est, s.tol)
        except ProbeError as exc:
            outcome.errors.append(str(exc))
            console.print(f"[red]{escape(str(exc))}[/red]", soft_wrap=True)
            continue
        fields = ceiling_fields(cfg, search, s.limit_bytes, hw)
        # the compiled prediction adds the host's address space, a CPU measure (not on an accelerator)
        if s.target == "local" and cfg.program == "decode" and s.mem_limit_bytes is not None:
            top = max(2, search.lo or est)
            console.print(f"  compiled prediction: compiling (not running) at batch 1 and {top}")
            fields.update(local_prediction(cfg, s, (1, top), folder))
        dev = search.ceiling_probe.result.get("device") if search.ceiling_probe else None
        outcome.ceilings.append(record(cfg.name, cfg.config(), fields, dev))
    rows = admission_rows(
        outcome.ceilings,
        s,
        agents=req.agents or AGENTS,
        contexts=req.agent_ctx or AGENT_CTX,
        shared_prefix=int(req.shared_prefix or 0),
    )
    if len(s.kv_layouts) > 1:
        console.print(f"admission counts the {s.kv_layouts[0]} ceilings (the first --kv-layout)")
    keys = ("kv_dtype", "sliding_kv", "agents", "agent_ctx", "model", "target", "shared_prefix")
    pricing = pricing_for(s.target)
    annotate_admission(rows, s, pricing, s.tpot_ms)
    latency = ceiling_latency(outcome.ceilings, pricing, s.tpot_ms)
    for row in latency:
        record(
            f"latency/{row['name']}",
            {"ceiling": row["name"], "tpot_ms": s.tpot_ms},
            {"record": "latency", **{k: v for k, v in row.items() if k != "name"}},
        )
    for row in rows:
        shared = f"/shared{row['shared_prefix']}" if row["shared_prefix"] else ""
        record(f"admission/{row['kv_dtype']}/sliding-{row['sliding_kv']}/agents{row['agents']}/ctx{row['agent_ctx']}{shared}",
               {k: row[k] for k in keys}, {"record": "admission", **{k: v for k, v in row.items() if k not in keys}})  # fmt: skip
    write_admission_csv(run_dir / "admission.csv", rows)
    render_ceilings(outcome.ceilings, rows, s, console)
    for table in latency_tables(latency, pricing, s.tpot_ms):
        console.print(table)
    if rows:
        console.print(admission_latency_table(rows, pricing, s.tpot_ms))
    finish(folder, records, console, also="admission.csv")
    return outcome
