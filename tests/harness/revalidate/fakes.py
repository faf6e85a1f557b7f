"""Fakes for `g4bench revalidate` end to end without an engine: the child (`fake_child`, run in a fresh
process via G4BENCH_REVALIDATE_CHILD, so `HERE` names this file) builds a `FakeBench` per point whose
step advances a fake clock by a known time (±10% seeded jitter) and goes through the real timing code
(`measure_benches`), so no assertion depends on the machine's speed. FAKE_MODE picks a host: "mixed"
(some configurations exhaust memory, hang or crash), "procspeed" (each process at its own speed),
"procbandwidth" (each at the memory bandwidth it gets, which the probe reads), "hog" / "steal"
(contaminated samples), "bandwidth" (the probe alternates 8 and 12 GB/s)."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import numpy as np
from typer.testing import CliRunner

from g4bench.cli import app
from harness.timing import measure_benches

HERE = Path(__file__).resolve()

STEP_MS = {("bf16", False): 24.0, ("bf16", True): 12.0, ("int8", False): 16.0, ("int8", True): 10.0}


class FakeBench:
    """Stands in for g4bench.engine.bench.DecodeBench: building inputs takes `inputs_ms` and a step
    `step_ms` — slept, or, given a `clock` (a `FakeClock`), added to it (the step times a seeded
    jitter within ±`jitter`) without sleeping."""

    def __init__(self, step_ms: float, inputs_ms: float = 0.0, clock=None, seed=0, jitter=0.1):
        self.step_ms, self.inputs_ms = step_ms, inputs_ms
        self.weights_bytes, self.kv_bytes = 1234, 567
        self.steps = 0
        self.clock, self.jitter, self.rng = clock, jitter, np.random.default_rng(seed)

    def compile(self) -> float:
        return 0.25

    def _take(self, ms: float) -> None:
        if self.clock is None:
            time.sleep(ms / 1e3)
        else:
            self.clock.now += ms / 1e3

    def fresh_inputs(self):
        self._take(self.inputs_ms)
        return object()

    def step(self, inputs) -> None:
        self.steps += 1
        self._take(self.step_ms * float(self.rng.uniform(1 - self.jitter, 1 + self.jitter)))


class FakeClock:
    """A perf_counter that only the fake steps move: timings in the fake children are exact on any
    machine, however loaded."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def fake_child(payload: dict) -> dict:
    """The child protocol of harness.revalidate.main.revalidate_child, over FakeBench steps (interleaved
    by the real `measure_benches`)."""
    points = payload["points"]
    if os.environ.get("FAKE_LOG"):
        with open(os.environ["FAKE_LOG"], "a") as fh:
            fh.writelines(p["name"] + "\n" for p in points)
    names = {p["name"] for p in points}
    if os.environ.get("FAKE_MODE") == "mixed":
        if "ple-int8/kv-bf16/copying" in names:
            bytearray(8 * 2**30)  # past the RLIMIT_AS the test sets: MemoryError
        if "ple-int4/kv-bf16/copying" in names:
            time.sleep(600)  # past --timeout
        if "ple-int4/kv-int8/copying" in names:
            raise RuntimeError("injected crash")
    speed, gbs = 1.0, None
    seed = [payload["round"], *points[0]["name"].encode()]  # fixed per process, so it cannot flake
    if os.environ.get("FAKE_MODE") == "procspeed":  # each process runs at its own speed, ±40%
        speed = float(np.random.default_rng(seed).uniform(0.6, 1.4))
    if os.environ.get("FAKE_MODE") == "procbandwidth":  # ...set by the memory bandwidth it gets, which the probe reads
        gbs = float(np.random.default_rng([*seed, 1]).uniform(7.0, 13.0))
        speed = 10.0 / gbs
    import harness.timing

    clock = FakeClock()
    harness.timing.perf_counter = clock  # this child's own module: the timing code reads the fake clock
    benches = [
        FakeBench(speed * STEP_MS[p["case"]["kv_dtype"], p["case"]["donate"]], clock=clock,
                  seed=[payload["round"], *p["name"].encode()])
        for p in points
    ]  # fmt: skip
    rng = np.random.default_rng(payload["round"])
    results = {}
    measured = measure_benches(benches, payload["samples"], payload["warmup"], rng, FakeProbe(payload["round"], gbs))
    for p, result in zip(points, measured, strict=True):
        case = p["case"]
        n = len(result["step_ms_samples"])
        result["host_other_cores"] = [0.0] * n  # the fake is never contaminated...
        result["host_steal_frac"] = [0.0] * n
        if os.environ.get("FAKE_MODE") in ("hog", "steal") and payload["round"] == 1 and case["donate"]:
            # ...unless a hog (or the hypervisor) ran while round 2 measured the donated points: 3 of 5
            # samples slowed 3× and flagged
            field, value = ("host_other_cores", 1.0) if os.environ["FAKE_MODE"] == "hog" else ("host_steal_frac", 0.05)
            for i in (0, 2, 4):
                result["step_ms_samples"][i] *= 3.0
                result[field][i] = value
        result["device"] = {"platform": "cpu", "device_kind": "fake cpu", "device_count": 1}
        results[p["name"]] = result
    return {"results": results}


class FakeProbe:
    """The children's memory bandwidth probe: a steady 10 GB/s, or, when the neighbours' memory
    traffic comes and goes (FAKE_MODE=bandwidth), 8 GB/s in even rounds and 12 in odd ones, or the
    process's own bandwidth where it is given."""

    def __init__(self, round_index: int, gbs: float | None = None) -> None:
        self.round_index, self.gbs = round_index, gbs

    def read_gbs(self) -> float:
        if self.gbs is not None:
            return self.gbs
        if os.environ.get("FAKE_MODE") == "bandwidth":
            return 12.0 if self.round_index % 2 else 8.0
        return 10.0


def fake_probe(payload: dict) -> dict:
    return {"platform": "cpu", "device_kind": "fake cpu", "device_count": 1}


def invoke(*args):
    """Run the command as the shell would (sys.argv is what command.txt records)."""
    argv = ["revalidate", *map(str, args)]
    saved = sys.argv
    sys.argv = ["g4bench", *argv]
    try:
        return CliRunner().invoke(app, argv)
    finally:
        sys.argv = saved


def ran(tmp_path) -> list[str]:
    path = tmp_path / "ran.txt"
    return path.read_text().split() if path.exists() else []
