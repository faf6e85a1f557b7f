"""`g4bench doctor`: can this machine run g4bench, and on what? One table, exit ≠ 0 when broken.

Why: the first minutes on a borrowed accelerator must not go to finding out that JAX sees no GPU,
that the image lacks fastapi, or that E2B's decode step does not compile there. Every check that
touches JAX runs in a fresh child (harness.isolate), so this process never holds the device and a
crash is a row, not a dead command.

Data flow::

    device_child (child)     platform, device kind and count, the allocator's memory limit,
                             versions (python, jax, jaxlib, CUDA/TPU plugins)
    calibrate (child)        harness.roofline.probes.calibrate_child on buffers of 1/96 and 1/48 of memory
                             → calibrated GB/s (harness.roofline.main.pick_calibration) and the fraction
                             of the device's nameplate bandwidth (configs/hardware) where known
    compile tiny-a (child)   harness.capacity.aot.compile_child: the engine's decode step, compiled
    E2B (child)              compiled at the device's reference shape when memory allows, else
                             eval_shape only (no code generation), with the reason on the row
    commands                 per command, the modules it needs (find_spec, nothing imported) and
                             whether the device checks above passed
    → DoctorReport(rows): each row (check, status ok|warn|fail|skip, detail); `broken` = any fail

A "warn" or "skip" is not broken: the parity extra, libtpu or a timing figure away from the
datasheet does not stop the benchmarks.
"""

from __future__ import annotations

import importlib.util
from dataclasses import asdict, dataclass, field
from importlib import metadata
from typing import Any

from harness.results import is_failure
from harness.run import CPU_LAYERS

DEVICE_TARGET = "harness.checks.doctor:device_child"
EVAL_SHAPE_TARGET = "harness.checks.doctor:eval_shape_child"
CALIBRATE_TARGET = "harness.roofline.probes:calibrate_child"
COMPILE_TARGET = "harness.capacity.aot:compile_child"
VERSIONED = (
    "jax",
    "jaxlib",
    "jax-cuda13-plugin",
    "jax-cuda12-plugin",
    "libtpu",
    "numpy",
    "fastapi",
    "pydantic",
)
# E2B's compile child peaks near 2.2 GiB of address space (harness/capacity/main.py); demand margin.
E2B_COMPILE_MIN_FREE_BYTES = 6 * 2**30
# Calibration buffers (fractions of device memory) and reps: 1-3 s on the 2-core CPU (0.25 and 0.5 GiB).
CALIBRATION = {"fractions": [1 / 96, 1 / 48], "reps": 10}

# Modules each command needs beyond the core (jax, numpy, typer, rich), and whether it runs JAX here.
COMMAND_NEEDS: dict[str, tuple[tuple[str, ...], bool]] = {
    "revalidate": (("pandas", "jsonschema"), True),
    "roofline": (("pandas", "jsonschema"), True),
    "capacity (local)": (("pandas", "psutil", "matplotlib"), True),
    "capacity (tpu-* targets)": (("libtpu",), False),
    "generate": ((), True),
    "serve": (("fastapi", "uvicorn", "pydantic", "prometheus_client", "tokenizers", "jinja2"), True),
    "serve-load": (("httpx", "pandas"), False),
    "gate": (("pandas",), False),
    "plot": (("matplotlib", "pandas"), False),
    "verify": (("torch", "transformers"), True),
}
OPTIONAL_COMMANDS = ("capacity (tpu-* targets)", "verify")


@dataclass
class Row:
    check: str
    status: str  # ok | warn | fail | skip
    detail: str


@dataclass
class DoctorReport:
    rows: list[Row] = field(default_factory=list)
    facts: dict[str, Any] = field(default_factory=dict)

    @property
    def broken(self) -> list[Row]:
        return [r for r in self.rows if r.status == "fail"]

    def to_json(self) -> dict[str, Any]:
        return {"rows": [asdict(r) for r in self.rows], "facts": self.facts, "broken": len(self.broken)}


def versions() -> dict[str, str | None]:
    """Installed versions of the distributions that decide what runs, without importing them."""
    out: dict[str, str | None] = {}
    for dist in VERSIONED:
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = None
    return out


def device_child(payload: dict[str, Any]) -> dict[str, Any]:
    """Isolated child: the JAX backend, its devices, and the allocator's memory limit and use."""
    import jax

    from harness.env import device_info

    stats = jax.devices()[0].memory_stats() or {}
    return {
        **device_info(),
        "bytes_limit": stats.get("bytes_limit"),
        "bytes_in_use": stats.get("bytes_in_use"),
        "devices": [str(d) for d in jax.devices()],
    }


def eval_shape_child(payload: dict[str, Any]) -> dict[str, Any]:
    """Isolated child: trace (never compile) the engine's decode step for a case with jax.eval_shape
    over abstract arguments; returns the logits-free outputs' bytes and the weights and KV bytes."""
    import jax

    from g4bench.engine.bench import DecodeCase, make_decode_bench

    bench = make_decode_bench(DecodeCase(**payload["case"]))
    out = jax.eval_shape(bench.step_fn, *bench.abstract_args())
    leaves = jax.tree_util.tree_leaves(out)
    return {
        "output_bytes": int(sum(x.size * x.dtype.itemsize for x in leaves)),
        "weights_bytes": bench.weights_bytes,
        "kv_bytes": bench.kv_bytes,
    }


def _gb(nbytes: float | None) -> str:
    if nbytes is None:
        return "?"
    return f"{nbytes / 2**30:.1f} GiB" if nbytes >= 2**30 else f"{nbytes / 2**20:.1f} MiB"


def _fail_detail(result: dict[str, Any]) -> str:
    f = result["failure"]
    return f"{f['kind']}: {f['detail']}"[:300]


def command_rows(device_ok: bool, compile_ok: bool) -> list[Row]:
    """Whether each command can run here: its modules are importable (find_spec, no import), and,
    for commands that run JAX, the device and the tiny-a compile checks passed."""
    rows = []
    for name, (mods, uses_jax) in COMMAND_NEEDS.items():
        missing = [m for m in mods if importlib.util.find_spec(m) is None]
        if missing:
            status = "skip" if name in OPTIONAL_COMMANDS else "fail"
            extra = " (parity extra)" if name == "verify" else " (tpu extra)" if "tpu" in name else ""
            rows.append(Row(f"command: {name}", status, f"missing {', '.join(missing)}{extra}"))
        elif uses_jax and not (device_ok and compile_ok):
            rows.append(Row(f"command: {name}", "fail", "JAX device or decode-step compile check failed"))
        else:
            rows.append(Row(f"command: {name}", "ok", "can run here"))
    return rows


def run_doctor(*, e2b_compile: bool | None, timeout_s: float = 600.0, progress: Any = None) -> DoctorReport:
    """Run every check (see the module docstring) and return the rows; nothing is raised."""
    import psutil

    from g4bench.engine.bench import DecodeCase
    from harness.hardware import hardware_for_device
    from harness.isolate import run_isolated
    from harness.roofline.main import pick_calibration

    say = progress or (lambda _msg: None)
    report = DoctorReport()
    vers = versions()
    report.facts["versions"] = vers
    shown = ", ".join(f"{k} {v}" for k, v in vers.items() if v)
    import platform as _platform

    report.rows.append(Row("versions", "ok", f"python {_platform.python_version()}, {shown}"))

    say("device: starting JAX in a child")
    dev = run_isolated(DEVICE_TARGET, {}, timeout_s=timeout_s)
    report.facts["device"] = dev
    device_ok = not is_failure(dev)
    if not device_ok:
        report.rows.append(Row("device", "fail", _fail_detail(dev)))
        report.rows.extend(command_rows(False, False))
        return report
    accel = dev["platform"] != "cpu"
    report.rows.append(
        Row("device", "ok", f"{dev['platform']}: {dev['device_kind']} × {dev['device_count']}")
    )
    limit = dev.get("bytes_limit")
    ram = psutil.virtual_memory()
    report.rows.append(
        Row(
            "memory limit",
            "ok",
            f"allocator limit {_gb(limit)}, in use {_gb(dev.get('bytes_in_use'))}"
            if limit
            else f"no allocator limit (CPU): RAM {_gb(ram.total)}, available {_gb(ram.available)}",
        )
    )

    say("calibration: streaming bandwidth (sum, max, matvec, copy)")
    cal = run_isolated(CALIBRATE_TARGET, CALIBRATION, timeout_s=timeout_s)
    if is_failure(cal):
        report.rows.append(Row("bandwidth calibration", "fail", _fail_detail(cal)))
    else:
        best = pick_calibration(cal["kernels"])
        report.facts["calibration"] = best
        hw = hardware_for_device(dev["platform"], dev["device_kind"])
        peak = hw.value("peak_bandwidth_bytes_per_s") if hw else None
        frac = (
            f", {best['gb_per_s_median'] * 1e9 / peak:.0%} of {hw.name}'s {peak / 1e9:.0f} GB/s"
            if peak and hw
            else ""
        )
        report.rows.append(
            Row(
                "bandwidth calibration",
                "ok",
                f"{best['gb_per_s_median']:.1f} GB/s ({best['kernel']}, {_gb(best['buffer_bytes'])} buffer, "
                f"rel IQR {best['rel_iqr_pct']:.1f}%){frac}",
            )
        )

    say("compile: tiny-a decode step")
    tiny = DecodeCase(model="tiny-a", layers=CPU_LAYERS if not accel else "w4a16", batch=4, ctx=256)
    payload = {"program": "decode", "case": asdict(tiny), "tokens": 1, "target": "local", "compute": None}
    res = run_isolated(COMPILE_TARGET, payload, timeout_s=timeout_s)
    compile_ok = not is_failure(res) and res.get("fits", False)
    report.rows.append(
        Row(
            "decode step tiny-a (compiled)",
            "ok" if compile_ok else "fail",
            f"batch 4, ctx 256: compiled in {res['compile_s']:.1f} s (a cache load when the JAX cache is warm), peak {_gb(res.get('peak_bytes'))}"
            if compile_ok
            else _fail_detail(res)
            if is_failure(res)
            else "did not fit",
        )
    )

    e2b = DecodeCase(model="e2b", batch=32 if accel else 1, ctx=8192 if accel else 1024)
    shape = f"batch {e2b.batch}, ctx {e2b.ctx}, {e2b.name}"
    if e2b_compile is None:
        e2b_compile = accel or ram.available >= E2B_COMPILE_MIN_FREE_BYTES
        why = (
            ""
            if e2b_compile
            else f"available RAM {_gb(ram.available)} < {_gb(E2B_COMPILE_MIN_FREE_BYTES)} needed for E2B's compile"
        )
    else:
        why = "" if e2b_compile else "--no-e2b-compile"
    if e2b_compile:
        say(f"compile: E2B decode step ({shape})")
        payload = {"program": "decode", "case": asdict(e2b), "tokens": 1, "target": "local", "compute": None}
        res = run_isolated(COMPILE_TARGET, payload, timeout_s=timeout_s)
        ok = not is_failure(res) and res.get("fits", False)
        report.rows.append(
            Row(
                "decode step E2B (compiled)",
                "ok" if ok else "fail",
                f"{shape}: compiled in {res['compile_s']:.1f} s (a cache load when the JAX cache is warm), peak {_gb(res.get('peak_bytes'))}"
                if ok
                else _fail_detail(res)
                if is_failure(res)
                else f"{shape}: does not fit the device",
            )
        )
    else:
        say(f"eval_shape: E2B decode step ({shape})")
        res = run_isolated(EVAL_SHAPE_TARGET, {"case": asdict(e2b)}, timeout_s=timeout_s)
        ok = not is_failure(res)
        report.rows.append(
            Row(
                "decode step E2B (eval_shape only)",
                "ok" if ok else "fail",
                f"{shape}: traced, weights {_gb(res['weights_bytes'])}, KV {_gb(res['kv_bytes'])}; not compiled: {why}"
                if ok
                else _fail_detail(res),
            )
        )
    report.rows.extend(command_rows(device_ok, compile_ok))
    return report
