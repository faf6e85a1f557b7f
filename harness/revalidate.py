"""`g4bench revalidate`: the decode-step grid, one fresh process per configuration, judged for noise.

Why: the reference engine published speedups it later retracted; they held up only once every
configuration ran in its own process, took 15 samples of one step each on fresh inputs, and
called a difference real only above twice the measured noise (seed-engine-notes §3.2, §4.5).
This module is that procedure as a tool.

Data flow::

    configs/sweeps/revalidate.toml ──load_sweep──▶ [SweepConfig] ──select_configs(--config)──▶
    probe_device() (a child: which platform?) ──resolve_settings──▶ SweepSettings (printed)
    for each config:  run_isolated(CHILD_TARGET, payload)            (harness/isolate.py)
        child: revalidate_child → make_decode_bench(DecodeCase) → measure_bench:
               compile() once, `warmup` steps, then `samples` × [fresh_inputs(); t0; step(); t1]
               → {"step_ms_samples", "compile_s", "weights_bytes", "kv_bytes", "device"}
        parent: measurement_record (stats.summarize, bootstrap CI of the median) or a failure
                record → results.append_record (run folder, validated)
    ratio_records (donation, int8 KV, PLE effects; stats.compare) → results.jsonl, summary.csv
    render_summary / render_verdicts (rich tables on stderr)

Ratios are speedups: ``ratio = median(numerator) / median(denominator)`` where the numerator is
the reference setting (copying, bf16 KV, bf16 PLE), so ratio > 1 means the variant is faster;
each has ``direction = "higher"`` for the gate, so within-run ratios can be compared across
machines (`g4bench gate --ratios-only`).

The child target is `CHILD_TARGET` unless the environment variable ``G4BENCH_REVALIDATE_CHILD``
names another ``module:function`` or ``file.py:function`` (tests run fake children that sleep,
crash, exhaust memory or hang); ``G4BENCH_REVALIDATE_PROBE`` does the same for the device probe.
"""

from __future__ import annotations

import fnmatch
import os
import re
import time
import tomllib
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

SWEEP_PATH = Path(__file__).resolve().parents[1] / "configs" / "sweeps" / "revalidate.toml"
CHILD_TARGET = "harness.revalidate:revalidate_child"
CHILD_ENV_VAR = "G4BENCH_REVALIDATE_CHILD"
PROBE_ENV_VAR = "G4BENCH_REVALIDATE_PROBE"
DEFAULT_TIMEOUT_S = 1800.0  # the reference harness's per-configuration limit
CASE_FIELDS = ("layers", "ple", "kv_dtype", "donate", "sliding_kv", "embed")


class RevalidateError(ValueError):
    """Unusable request (unknown configuration, resume mismatch, no device); exit code 2."""


@dataclass(frozen=True)
class Shape:
    """Default measurement shape for a platform, with the reason it was chosen (always printed)."""

    batch: int
    ctx: int
    samples: int
    warmup: int
    reason: str
    layers: str | None = None  # override of the grid's layer format (None: keep the grid's)
    layers_reason: str = ""


ACCELERATOR_DEFAULTS = Shape(
    batch=32,
    ctx=8192,
    samples=15,
    warmup=3,
    reason="the reference revalidation's shape on TPU v6e (seed-engine-notes §4.5), so results compare",
)
# Measured on the 2-core, 24 GiB development machine (jax 0.10.2, full E2B dimensions, f32
# layers): a decode step at batch 4, ctx 8192 takes ~1.3 s donated and ~1.6 s copying; a child
# (synthetic init ~25 s, compile ~4 s, 18 steps) ~60-70 s, so 12 configurations take ~13-14 min.
CPU_DEFAULTS = Shape(
    batch=4,
    ctx=8192,
    samples=15,
    warmup=3,
    reason="CPU: batch 4 at the reference's ctx 8192 keeps 12 full-E2B configurations to about 15 minutes "
    "on 2 cores (~1.3 s per step)",
    layers="f32",
    layers_reason="CPU: W4A16 weights unpacked inside the step do not fuse on XLA's CPU backend "
    "(~21 ms per 1536x12288 projection vs ~2.7 ms dense f32 at batch 1, ~5 s per E2B step), so the "
    "grid's W4A16 layers are stored as dense f32 here; PLE and KV formats are measured as specified",
)


@dataclass(frozen=True)
class SweepConfig:
    """One grid point: a name and the DecodeCase fields it sets (layers, ple, kv_dtype, donate, ...)."""

    name: str
    case: dict[str, Any]


@dataclass(frozen=True)
class SweepSettings:
    """What every configuration of a run shares; stored in env.json and checked on --resume."""

    model: str
    batch: int
    ctx: int
    samples: int
    warmup: int
    seed: int = 0
    layers: str | None = None
    timeout_s: float = DEFAULT_TIMEOUT_S
    mem_limit_bytes: int | None = None

    def identity(self) -> dict[str, Any]:
        """The fields that define the measurement (a resumed run must match them)."""
        return {k: getattr(self, k) for k in ("model", "batch", "ctx", "samples", "warmup", "seed", "layers")}


@dataclass
class SweepOutcome:
    """What a sweep produced: the run folder, its records, and what was skipped or failed."""

    run_dir: Path
    measurements: list[dict[str, Any]] = field(default_factory=list)
    ratios: list[dict[str, Any]] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)

    @property
    def failures(self) -> list[dict[str, Any]]:
        """Measurement records that carry a `failure`."""
        return [r for r in self.measurements if "failure" in r]


# ------------------------------------------------------------------------------------------ the grid


def load_sweep(path: Path = SWEEP_PATH) -> list[SweepConfig]:
    """Read a sweep TOML: ``[defaults]`` merged under each ``[[config]]`` (which needs a `name`)."""
    data = tomllib.loads(Path(path).read_text())
    defaults = dict(data.get("defaults", {}))
    configs = []
    for i, raw in enumerate(data.get("config", [])):
        entry = dict(raw)
        name = entry.pop("name", None)
        if not name:
            raise RevalidateError(f"{path}: config #{i + 1} has no name")
        unknown = set(entry) - set(CASE_FIELDS)
        if unknown:
            raise RevalidateError(f"{path}: config {name!r}: unknown keys {sorted(unknown)}")
        configs.append(SweepConfig(name=name, case={**defaults, **entry}))
    names = [c.name for c in configs]
    if len(set(names)) != len(names):
        raise RevalidateError(f"{path}: duplicate configuration names")
    return configs


def select_configs(configs: Sequence[SweepConfig], patterns: Sequence[str] | None) -> list[SweepConfig]:
    """The configurations matching any of `patterns` (exact names or fnmatch globs); all if None."""
    if not patterns:
        return list(configs)
    chosen = [c for c in configs if any(fnmatch.fnmatchcase(c.name, p) for p in patterns)]
    missing = [p for p in patterns if not any(fnmatch.fnmatchcase(c.name, p) for c in configs)]
    if missing:
        known = ", ".join(c.name for c in configs)
        raise RevalidateError(f"no configuration matches {missing}; known: {known}")
    return chosen


def defaults_for(platform: str | None) -> Shape:
    """CPU_DEFAULTS on the CPU, ACCELERATOR_DEFAULTS on a TPU or GPU."""
    return CPU_DEFAULTS if platform in (None, "cpu") else ACCELERATOR_DEFAULTS


def resolve_settings(
    platform: str | None,
    *,
    model: str,
    batch: int | None,
    ctx: int | None,
    samples: int | None,
    warmup: int | None,
    layers: str | None = None,
    **extra: Any,
) -> tuple[SweepSettings, str | None]:
    """Fill unset shape options from the platform defaults; returns the settings and a note saying
    which defaults were applied and why (None when the caller set everything)."""
    shape = defaults_for(platform)
    chosen = {"batch": batch, "ctx": ctx, "samples": samples, "warmup": warmup}
    applied = {k: getattr(shape, k) for k, v in chosen.items() if v is None}
    settings = SweepSettings(
        model=model,
        layers=layers if layers is not None else shape.layers,
        **{k: v if v is not None else getattr(shape, k) for k, v in chosen.items()},
        **extra,
    )
    if settings.samples < 1 or settings.warmup < 0 or settings.batch < 1 or settings.ctx < 1:
        raise RevalidateError("batch, ctx and samples must be >= 1 and warmup >= 0")
    notes = []
    if applied:
        shown = ", ".join(f"{k} {v}" for k, v in applied.items())
        why = f" — {shape.reason}" if {"batch", "ctx"} & set(applied) else ""
        notes.append(f"defaults for {platform or 'cpu'}: {shown}{why}")
    if layers is None and shape.layers is not None:
        notes.append(f"layers {shape.layers} instead of the grid's — {shape.layers_reason}")
    return settings, "\n".join(notes) or None


# ---------------------------------------------------------------------------------------- the child


def time_steps(bench: Any, samples: int, warmup: int) -> list[float]:
    """Milliseconds of `samples` single decode steps, each on fresh inputs built outside the timing.

    `warmup` untimed steps first. Only ``bench.step(inputs)`` (which blocks until the result is
    ready) sits between the two ``perf_counter`` calls; the previous inputs are dropped before new
    ones are built, so at most one cache is alive besides the one a copying step produces.
    """
    for _ in range(warmup):
        inputs = bench.fresh_inputs()
        bench.step(inputs)
        del inputs
    times_ms = []
    for _ in range(samples):
        inputs = bench.fresh_inputs()
        t0 = time.perf_counter()
        bench.step(inputs)
        t1 = time.perf_counter()
        del inputs
        times_ms.append((t1 - t0) * 1e3)
    return times_ms


def measure_bench(bench: Any, samples: int, warmup: int) -> dict[str, Any]:
    """Compile `bench` (timed apart), then `time_steps`; the child's result fields."""
    compile_s = float(bench.compile())
    return {
        "step_ms_samples": time_steps(bench, samples, warmup),
        "compile_s": compile_s,
        "weights_bytes": int(bench.weights_bytes),
        "kv_bytes": int(bench.kv_bytes),
    }


def revalidate_child(payload: dict[str, Any]) -> dict[str, Any]:
    """Isolated-child target: build the DecodeBench for ``payload["case"]`` and measure it."""
    from harness.env import device_info
    from harness.isolate import configure_jax_cache

    configure_jax_cache()
    from g4bench.engine.bench import DecodeCase, make_decode_bench

    bench = make_decode_bench(DecodeCase(**payload["case"]), seed=int(payload.get("seed", 0)))
    result = measure_bench(bench, int(payload["samples"]), int(payload["warmup"]))
    result["device"] = device_info()
    return result


def child_payload(cfg: SweepConfig, settings: SweepSettings) -> dict[str, Any]:
    """The JSON the child receives: the full DecodeCase, the sampling plan and the seed."""
    case = {**cfg.case, "model": settings.model, "batch": settings.batch, "ctx": settings.ctx}
    if settings.layers is not None:
        case["layers"] = settings.layers
    return {
        "name": cfg.name,
        "case": case,
        "samples": settings.samples,
        "warmup": settings.warmup,
        "seed": settings.seed,
    }


# -------------------------------------------------------------------------------------- the records


def _record_config(cfg: SweepConfig, settings: SweepSettings) -> dict[str, Any]:
    return {
        **child_payload(cfg, settings)["case"],
        "samples": settings.samples,
        "warmup": settings.warmup,
        "seed": settings.seed,
    }


def measurement_record(
    cfg: SweepConfig,
    settings: SweepSettings,
    result: dict[str, Any],
    *,
    run_id: str,
    base_env: dict[str, Any],
) -> dict[str, Any]:
    """A `revalidate` record from a child's result (statistics computed here) or a failure record."""
    from harness.env import config_hash, merge_device, utc_now
    from harness.results import make_record
    from harness.stats import bootstrap_ci, summarize

    config = _record_config(cfg, settings)
    env = merge_device(
        {**base_env, "config_hash": config_hash(config), "timestamp_utc": utc_now()}, result.get("device")
    )
    wall_s = float(result.get("wall_s", 0.0))
    if "failure" in result:
        return make_record(
            "revalidate",
            cfg.name,
            run_id=run_id,
            env=env,
            config=config,
            failure=result["failure"],
            wall_s=wall_s,
        )
    samples = [float(x) for x in result["step_ms_samples"]]
    st = summarize(samples)
    lo, hi = bootstrap_ci(samples, seed=settings.seed)
    return make_record(
        "revalidate",
        cfg.name,
        run_id=run_id,
        env=env,
        config=config,
        batch=settings.batch,
        ctx=settings.ctx,
        step_ms_median=st.median,
        step_ms_min=st.min,
        step_ms_max=st.max,
        step_ms_q1=st.q1,
        step_ms_q3=st.q3,
        step_ms_iqr=st.iqr,
        step_rel_iqr_pct=st.rel_iqr_pct,
        step_ms_ci95_lo=lo,
        step_ms_ci95_hi=hi,
        agg_tok_per_s=settings.batch * 1000.0 / st.median,
        n_samples=st.n,
        warmup=settings.warmup,
        weights_bytes=int(result["weights_bytes"]),
        kv_bytes=int(result["kv_bytes"]),
        compile_s=float(result["compile_s"]),
        wall_s=wall_s,
        step_ms_samples=samples,
    )


def safe_name(name: str) -> str:
    """A file-name-safe form of a configuration name (for its stderr log)."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name)


def child_target() -> str:
    """The child entry point: `CHILD_TARGET`, or the override in ``G4BENCH_REVALIDATE_CHILD``."""
    return os.environ.get(CHILD_ENV_VAR) or CHILD_TARGET


def probe_target() -> str:
    """The device-probe entry point, overridable with ``G4BENCH_REVALIDATE_PROBE``."""
    return os.environ.get(PROBE_ENV_VAR) or "harness.env:probe_child"


# ---------------------------------------------------------------------------------------- the sweep


def _finished_names(records: Sequence[dict[str, Any]]) -> set[str]:
    return {r["name"] for r in records if r.get("kind") == "revalidate" and "failure" not in r}


def prepare_run(
    *, out: Path | None, resume: bool, results_root: Path, requested: dict[str, Any], platform: str | None
) -> tuple[Path, SweepSettings, str | None, list[dict[str, Any]]]:
    """Choose the run folder and the settings; returns (run_dir, settings, defaults note, kept records).

    - New run without `out`: ``results_root/<UTC stamp>-revalidate/``.
    - `out` given: used as is if it is new or holds no results.jsonl; an existing run needs `resume`.
    - `resume`: settings come from the folder's env.json; any option given on the command line
      must equal the stored one (a resumed run must measure the same thing). Successful
      measurements are kept; failures of configurations about to rerun and old ratio records are
      dropped by the caller.
    """
    from harness.results import RECORDS_FILE, RunError, create_run_dir, read_env, read_records

    extra = {k: requested[k] for k in ("timeout_s", "mem_limit_bytes") if requested.get(k) is not None}
    if resume:
        if out is None:
            raise RevalidateError("--resume needs --out RUN_DIR (the run folder to continue)")
        try:
            stored = read_env(out).get("settings")
            kept = read_records(out) if (out / RECORDS_FILE).exists() else []
        except RunError as exc:
            raise RevalidateError(f"cannot resume {out}: {exc}") from exc
        if not isinstance(stored, dict):
            raise RevalidateError(f"cannot resume {out}: env.json has no settings")
        base = SweepSettings(**{k: v for k, v in stored.items() if k in SweepSettings.__dataclass_fields__})
        clash = {
            k: (v, getattr(base, k))
            for k, v in requested.items()
            if k in base.identity() and v is not None and v != getattr(base, k)
        }
        if clash:
            shown = "; ".join(f"{k}: run has {old!r}, asked {new!r}" for k, (new, old) in clash.items())
            raise RevalidateError(f"cannot resume {out} with different settings ({shown})")
        return out, SweepSettings(**{**asdict(base), **extra}), None, kept
    shape_keys = ("batch", "ctx", "samples", "warmup", "layers")
    settings, note = resolve_settings(
        platform,
        model=requested.get("model") or "e2b",
        **{k: requested.get(k) for k in shape_keys},
        seed=requested.get("seed") or 0,
        **extra,
    )
    if out is None:
        return create_run_dir(results_root, "revalidate"), settings, note, []
    if (out / RECORDS_FILE).exists():
        raise RevalidateError(
            f"{out} already holds results; pass --resume to continue it, or choose a new --out"
        )
    out.mkdir(parents=True, exist_ok=True)
    return out, settings, note, []


def run_sweep(
    configs: Sequence[SweepConfig],
    settings: SweepSettings,
    run_dir: Path,
    *,
    base_env: dict[str, Any],
    kept: Sequence[dict[str, Any]] = (),
    console: Any = None,
) -> SweepOutcome:
    """Measure each configuration in its own child, append its record, then derive ratio records.

    `kept` are records already in the folder (a resumed run): configurations with a successful
    record there are skipped. A failing child becomes a failure record and the sweep goes on.
    results.jsonl is rewritten at the start (kept records, minus stale failures and ratios) and
    extended as children finish; ratio records and summary.csv are written at the end.
    """
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    from harness.isolate import run_isolated
    from harness.results import append_record, rewrite_records, run_id_of, write_summary
    from harness.verdicts import ratio_records

    console = console or Console(stderr=True)
    run_id = run_id_of(run_dir)
    done = _finished_names(kept)
    selected = {c.name for c in configs}
    measurements = [
        r for r in kept if r.get("kind") == "revalidate" and ("failure" not in r or r["name"] not in selected)
    ]
    rewrite_records(run_dir, measurements)
    outcome = SweepOutcome(run_dir=run_dir, measurements=list(measurements))
    todo = [c for c in configs if c.name not in done]
    outcome.skipped = [c.name for c in configs if c.name in done]
    if outcome.skipped:
        console.print(
            f"[dim]resume: {len(outcome.skipped)} configuration(s) already measured in {run_dir}, skipped[/dim]"
        )
    (run_dir / "logs").mkdir(exist_ok=True)
    target = child_target()
    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("eta"),
        TimeRemainingColumn(),
    )
    with Progress(*columns, console=console, transient=False) as progress:
        task = progress.add_task("revalidate", total=len(todo))
        for cfg in todo:
            progress.update(task, description=f"[bold]{cfg.name}[/bold]")
            result = run_isolated(
                target,
                child_payload(cfg, settings),
                timeout_s=settings.timeout_s,
                mem_limit_bytes=settings.mem_limit_bytes,
                stderr_log=run_dir / "logs" / f"{safe_name(cfg.name)}.log",
            )
            record = measurement_record(cfg, settings, result, run_id=run_id, base_env=base_env)
            append_record(run_dir, record)
            outcome.measurements.append(record)
            progress.console.print(_one_line(record))
            progress.advance(task)
    outcome.ratios = ratio_records(outcome.measurements, run_id=run_id, base_env=base_env)
    rewrite_records(run_dir, [*outcome.measurements, *outcome.ratios])
    write_summary(run_dir, [*outcome.measurements, *outcome.ratios])
    return outcome


def _one_line(record: dict[str, Any]) -> str:
    """Progress line for one finished configuration (rich markup)."""
    if "failure" in record:
        f = record["failure"]
        return f"[red]✗ {record['name']}: {f['kind']} — {f['detail']}[/red]"
    return (
        f"[green]✓[/green] {record['name']}: median {record['step_ms_median']:.3f} ms "
        f"(rel IQR {record['step_rel_iqr_pct']:.2f}%), {record['agg_tok_per_s']:.1f} tok/s, compile {record['compile_s']:.1f} s"
    )


# -------------------------------------------------------------------------------------- entry point


def run_revalidate(
    *,
    patterns: Sequence[str] | None,
    requested: dict[str, Any],
    out: Path | None,
    resume: bool,
    argv: Sequence[str],
    results_root: Path = Path("results"),
    sweep_path: Path = SWEEP_PATH,
    console: Any = None,
) -> SweepOutcome:
    """The whole command: select, probe the device, settle settings, run, write, print tables.

    `requested` holds the command-line values (None = not given): model, batch, ctx, samples,
    warmup, seed, timeout_s, mem_limit_bytes. Raises `RevalidateError` for unusable requests.
    """
    from rich.console import Console

    from harness.env import host_env, merge_device, probe_device
    from harness.results import write_command, write_env
    from harness.verdicts import render_summary, render_verdicts

    console = console or Console(stderr=True)
    configs = select_configs(load_sweep(sweep_path), patterns)
    device = probe_device(target=probe_target())
    if "failure" in device:
        f = device["failure"]
        raise RevalidateError(
            f"could not start jax in a child process ({f['kind']}: {f['detail']})\n{f['stderr_tail']}"
        )
    platform = device.get("platform")
    run_dir, settings, note, kept = prepare_run(
        out=out, resume=resume, results_root=results_root, requested=requested, platform=platform
    )
    if note:
        console.print(f"[yellow]{note}[/yellow]")
    console.print(
        f"revalidate on {platform} ({device.get('device_kind')}): model {settings.model}, "
        f"layers {settings.layers or 'as in the grid'}, batch {settings.batch}, "
        f"ctx {settings.ctx}, {settings.samples} samples after {settings.warmup} warmup, "
        f"{len(configs)} configuration(s), one process each, timeout {settings.timeout_s:g} s"
    )
    base_env = merge_device(host_env(settings.identity()), device)
    write_command(run_dir, argv, append=resume)
    write_env(run_dir, {**base_env, "settings": asdict(settings), "sweep": str(sweep_path)})
    outcome = run_sweep(configs, settings, run_dir, base_env=base_env, kept=kept, console=console)
    render_summary(outcome.measurements, console)
    render_verdicts(outcome.ratios, console)
    if outcome.failures:
        names = ", ".join(f"{r['name']} ({r['failure']['kind']})" for r in outcome.failures)
        console.print(
            f"[red]{len(outcome.failures)} configuration(s) failed: {names}; see {run_dir / 'logs'}[/red]"
        )
    console.print(f"results: {run_dir}/ (results.jsonl, summary.csv, env.json, command.txt, logs/)")
    return outcome
