"""The prepared device check: every headline measurement on one accelerator in under 8 minutes.

Why: a borrowed H200 comes for ~15 minutes with no package registry; the check must be one command
whose every step is already known to start (the `--dry-run` runs the same steps at tiny sizes on the
CPU, in the test suite), that keeps going when a step fails, and that leaves one run folder per step.
It drives the command line itself (each step is a `g4bench` command in a fresh process), so it lives
in the CLI layer, beside the commands whose flags it spells.

Data flow::

    steps(out, dry_run)        THE place where every step's command line is written (flags change
                               with the commands; the dry-run test catches a mismatch)
    for each step: run_step    `python -m g4bench.cli ARGV` in a fresh process (a timeout kills it
                               and all its descendants), stdout+stderr → OUT/<step>.log,
                               wall clock bounded by the step's budget; its run folder OUT/<step>/
    → OUT/device-check.json    per step: argv, rc, status ok | failed | timeout, wall_s, budget_s

Budgets (seconds, accelerator) sum to 465 < 8 min: doctor 45, revalidate 140 (12 configurations,
E2B batch 32 ctx 8192, one round (reduced from the accelerator default of 2, so CIs come from one
process per configuration) of 5 samples after 2 warm-up steps: ~11 s per fresh process), roofline 50,
capacity 110 (donated bf16 full-length KV, bisected to 5%), serve-load 120 (server start and
bucket warm-up, then conc 2, 4, 8 × 8 requests of 1,024 in / 128 out, as the vLLM baseline's fixed
workload). One optional step runs only when named: `--step burst`, 480 s (two servers warm up), the
burst-prefill check (`python -m harness.load.burst`, both prefill policies on fresh E2B servers, 2
rounds), whose CPU figures are bound by 2 cores' compute. These are estimates for an H200, not
measurements: a step over its budget is killed, recorded as "timeout", and the check goes on. JAX
preallocation is off in every step (XLA_PYTHON_CLIENT_PREALLOCATE=false) so children that share
the device (serve-load's server, a capacity probe after the compile child) each take only what they
use, and capacity's bisection meets the allocator's own limit rather than a preallocated pool.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

DEFAULT_OUT = Path("results/reference/h200")
STEP_ENV = {"XLA_PYTHON_CLIENT_PREALLOCATE": "false", "PYTHONUNBUFFERED": "1"}


@dataclass(frozen=True)
class Step:
    name: str
    argv: tuple[str, ...]  # after `python -m <module>`
    budget_s: float
    module: str = "g4bench.cli"
    optional: bool = False  # run only when named (`--step`): outside the 8-minute default check


@dataclass
class StepResult:
    name: str
    argv: list[str]
    budget_s: float
    status: str = "not run"  # ok | failed | timeout
    rc: int | None = None
    wall_s: float = 0.0
    log: str = ""


@dataclass
class CheckOutcome:
    out: Path
    results: list[StepResult] = field(default_factory=list)

    @property
    def failed(self) -> list[StepResult]:
        return [r for r in self.results if r.status != "ok"]


# ------------------------------------------------------------------------------------------------
# Every step's command line, accelerator and dry run. Update flags HERE when a command's flags change.
# ------------------------------------------------------------------------------------------------
def steps(out: Path, dry_run: bool) -> list[Step]:
    """The steps in order; each writes its run folder under `out`."""
    names = ("doctor", "revalidate", "roofline", "capacity", "serve-load", "burst")
    d = {name: str(out / name) for name in names}
    if dry_run:  # the CPU, tiny models and shapes: every step starts and writes its folder
        return [
            Step("doctor", ("doctor", "--no-e2b-compile", "--out", d["doctor"]), 120),
            Step("revalidate", ("revalidate", "--model", "tiny-a", "--config", "ple-bf16/kv-bf16/*",
                                "--batch", "2", "--ctx", "64", "--rounds", "2", "--samples", "3",
                                "--warmup", "1", "--out", d["revalidate"]), 120),
            Step("roofline", ("roofline", "--model", "tiny-a", "--batch", "1", "--ctx", "64,128",
                              "--samples", "3", "--warmup", "1", "--no-breakdown", "--out", d["roofline"]), 120),
            Step("capacity", ("capacity", "--model", "tiny-a", "--ctx", "64", "--kv-dtype", "bf16",
                              "--step", "donated", "--sliding-kv", "full", "--mem-limit-gib", "4",
                              "--tol", "0.9", "--out", d["capacity"]), 150),
            Step("serve-load", ("serve-load", "--model", "tiny-a", "--workload", "fixed", "--conc", "2",
                                "--num-requests", "2", "--input-len", "16", "--output-len", "4",
                                "--out", d["serve-load"]), 150),
            Step("burst", ("--model", "tiny-a", "--rounds", "1", "--stream-tokens", "1800", "--out", d["burst"]), 240,
                 module="harness.load.burst", optional=True),
        ]  # fmt: skip
    return [
        Step("doctor", ("doctor", "--e2b-compile", "--out", d["doctor"]), 45),
        Step("revalidate", ("revalidate", "--all", "--model", "e2b", "--batch", "32", "--ctx", "8192",
                            "--rounds", "1", "--samples", "5", "--warmup", "2", "--timeout", "60",
                            "--out", d["revalidate"]), 140),
        Step("roofline", ("roofline", "--model", "e2b", "--batch", "32", "--ctx", "2048,8192",
                          "--samples", "5", "--no-breakdown", "--out", d["roofline"]), 50),
        Step("capacity", ("capacity", "--model", "e2b", "--ctx", "8192", "--kv-dtype", "bf16", "--step", "donated",
                          "--sliding-kv", "full", "--tol", "0.05", "--timeout", "40", "--out", d["capacity"]), 110),
        Step("serve-load", ("serve-load", "--model", "e2b", "--workload", "fixed", "--conc", "2,4,8",
                            "--num-requests", "8", "--input-len", "1024", "--output-len", "128",
                            "--out", d["serve-load"]), 120),
        # the burst-prefill bar on the accelerator (both prefill policies, a fresh E2B server each)
        Step("burst", ("--model", "e2b", "--rounds", "2", "--stream-tokens", "1500", "--out", d["burst"]), 480,
             module="harness.load.burst", optional=True),
    ]  # fmt: skip


def _kill_tree(pid: int) -> None:
    """SIGKILL a step and every descendant. Measuring children and servers start their own
    sessions (harness.isolate, harness.load.server), so the step's process group alone would
    leave them holding the device for the next step; they are collected before anything dies."""
    import psutil

    try:
        family = [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        return
    for p in family:
        with contextlib.suppress(psutil.NoSuchProcess):  # exited on its own meanwhile: nothing to kill
            p.send_signal(signal.SIGKILL)
    psutil.wait_procs(family, timeout=30)


def run_step(step: Step, out: Path, env: dict[str, str]) -> StepResult:
    """Run one step as `python -m <its module> ...` in its own session; kill it and its descendants
    at the budget. Never raises for the step's own failure: it is the result's status."""
    argv = [sys.executable, "-m", step.module, *step.argv]
    log = out / f"{step.name}.log"
    result = StepResult(step.name, list(step.argv), step.budget_s, log=str(log))
    t0 = time.perf_counter()
    with log.open("w") as fh:
        fh.write(" ".join(argv) + "\n")
        fh.flush()
        proc = subprocess.Popen(argv, stdout=fh, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        try:
            result.rc = proc.wait(timeout=step.budget_s)
            result.status = "ok" if result.rc == 0 else "failed"
        except subprocess.TimeoutExpired:
            _kill_tree(proc.pid)
            result.rc = proc.wait()
            result.status = "timeout"
    result.wall_s = time.perf_counter() - t0
    return result


def run_check(
    out: Path,
    *,
    dry_run: bool,
    only: list[str] | None = None,
    time_scale: float = 1.0,
    progress: Any = None,
) -> CheckOutcome:
    """Run the default steps (or those named in `only`, optional ones included) in order, each with
    its budget × `time_scale`, recording each; writes device-check.json after every step so an
    interrupted check still says what ran."""
    say = progress or (lambda _msg: None)
    out.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, **STEP_ENV}
    if dry_run:
        env["JAX_PLATFORMS"] = "cpu"
    outcome = CheckOutcome(out)
    plan = [
        replace(s, budget_s=s.budget_s * time_scale)
        for s in steps(out, dry_run)
        if (s.name in only if only else not s.optional)
    ]
    started = time.perf_counter()
    for step in plan:
        command = "g4bench" if step.module == "g4bench.cli" else f"python -m {step.module}"
        say(f"{step.name}: budget {step.budget_s:.0f} s: {command} {' '.join(step.argv)}")
        res = run_step(step, out, env)
        outcome.results.append(res)
        say(f"{step.name}: {res.status} (rc {res.rc}) in {res.wall_s:.0f} s; log {res.log}")
        summary = {
            "dry_run": dry_run,
            "time_scale": time_scale,
            "total_s": time.perf_counter() - started,
            "steps": [asdict(r) for r in outcome.results],
        }
        (out / "device-check.json").write_text(json.dumps(summary, indent=2) + "\n")
    return outcome
