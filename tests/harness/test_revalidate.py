"""`g4bench revalidate` end to end with fake children (no engine needed).

The fake child (`fake_child` below, run in a fresh process via G4BENCH_REVALIDATE_CHILD) builds a
`FakeBench` whose step sleeps a known time and goes through the real timing code
(`measure_bench`); in "mixed" mode some configurations exhaust memory, hang or crash. Tests
assert the failure records, that the sweep went on, and that --resume reruns only what failed.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from g4bench.cli import app
from harness.results import read_records
from harness.revalidate import (
    CPU_DEFAULTS,
    RevalidateError,
    load_sweep,
    measure_bench,
    resolve_settings,
    select_configs,
    time_steps,
)

HERE = Path(__file__).resolve()
STEP_MS = {("bf16", False): 24.0, ("bf16", True): 12.0, ("int8", False): 16.0, ("int8", True): 10.0}


class FakeBench:
    """Stands in for g4bench.engine.bench.DecodeBench: a step that sleeps `step_ms`."""

    def __init__(self, step_ms: float, inputs_ms: float = 0.0):
        self.step_ms, self.inputs_ms = step_ms, inputs_ms
        self.weights_bytes, self.kv_bytes = 1234, 567
        self.steps = 0

    def compile(self) -> float:
        return 0.25

    def fresh_inputs(self):
        time.sleep(self.inputs_ms / 1e3)
        return object()

    def step(self, inputs) -> None:
        self.steps += 1
        time.sleep(self.step_ms / 1e3)


def fake_child(payload: dict) -> dict:
    case = payload["case"]
    if os.environ.get("FAKE_LOG"):
        with open(os.environ["FAKE_LOG"], "a") as fh:
            fh.write(payload["name"] + "\n")
    if os.environ.get("FAKE_MODE") == "mixed":
        if payload["name"] == "ple-int8/kv-bf16/copying":
            bytearray(8 * 2**30)  # past the RLIMIT_AS the test sets: MemoryError
        if payload["name"] == "ple-int4/kv-bf16/copying":
            time.sleep(600)  # past --timeout
        if payload["name"] == "ple-int4/kv-int8/copying":
            raise RuntimeError("injected crash")
    result = measure_bench(
        FakeBench(STEP_MS[case["kv_dtype"], case["donate"]]), payload["samples"], payload["warmup"]
    )
    result["device"] = {"platform": "cpu", "device_kind": "fake cpu", "device_count": 1}
    return result


def fake_probe(payload: dict) -> dict:
    return {"platform": "cpu", "device_kind": "fake cpu", "device_count": 1}


@pytest.fixture
def fake_env(monkeypatch, tmp_path):
    monkeypatch.setenv("G4BENCH_REVALIDATE_CHILD", f"{HERE}:fake_child")
    monkeypatch.setenv("G4BENCH_REVALIDATE_PROBE", f"{HERE}:fake_probe")
    monkeypatch.setenv("G4BENCH_JAX_CACHE_DIR", str(tmp_path / "jax-cache"))
    monkeypatch.setenv("FAKE_LOG", str(tmp_path / "ran.txt"))
    monkeypatch.chdir(tmp_path)
    return tmp_path


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


# ---------------------------------------------------------------------------------------- units


def test_grid_is_the_twelve_configurations():
    configs = load_sweep()
    assert len(configs) == 12
    assert {c.case["layers"] for c in configs} == {"w4a16"}
    assert {(c.case["ple"], c.case["kv_dtype"], c.case["donate"]) for c in configs} == {
        (p, k, d) for p in ("bf16", "int8", "int4") for k in ("bf16", "int8") for d in (False, True)
    }
    assert [c.name for c in select_configs(configs, ["ple-bf16/kv-bf16/*"])] == [
        "ple-bf16/kv-bf16/copying",
        "ple-bf16/kv-bf16/donated",
    ]
    with pytest.raises(RevalidateError, match="no configuration matches"):
        select_configs(configs, ["ple-int2/*"])


def test_timing_excludes_input_building():
    bench = FakeBench(step_ms=2.0, inputs_ms=30.0)
    times = time_steps(bench, samples=5, warmup=2)
    assert bench.steps == 7
    assert len(times) == 5
    assert all(1.5 < t < 25.0 for t in times)  # the 30 ms of fresh_inputs is outside the timed region


def test_cpu_defaults_are_printed_with_reason():
    settings, note = resolve_settings("cpu", model="e2b", batch=None, ctx=None, samples=None, warmup=None)
    assert (settings.batch, settings.ctx, settings.samples, settings.warmup) == (
        CPU_DEFAULTS.batch,
        CPU_DEFAULTS.ctx,
        CPU_DEFAULTS.samples,
        CPU_DEFAULTS.warmup,
    )
    assert "15 minutes" in note
    assert settings.layers == "f32" and "do not fuse" in note
    settings, note = resolve_settings("tpu", model="e2b", batch=None, ctx=None, samples=7, warmup=1)
    assert settings.layers is None
    assert (settings.batch, settings.ctx, settings.samples) == (32, 8192, 7)
    assert "batch 32, ctx 8192" in note and "samples" not in note
    _, note = resolve_settings("cpu", model="e2b", batch=1, ctx=2, samples=3, warmup=0, layers="w4a16")
    assert note is None


# ------------------------------------------------------------------------------------ end to end


def test_sweep_writes_run_folder_and_verdicts(fake_env):
    out = fake_env / "run"
    res = invoke(
        "--config",
        "ple-bf16/*",
        "--model",
        "tiny-a",
        "--batch",
        8,
        "--ctx",
        512,
        "--samples",
        5,
        "--warmup",
        1,
        "--out",
        out,
    )
    assert res.exit_code == 0, res.output
    records = read_records(out)
    meas = [r for r in records if r["kind"] == "revalidate"]
    assert [r["name"] for r in meas] == [c.name for c in select_configs(load_sweep(), ["ple-bf16/*"])]
    donated = next(r for r in meas if r["name"] == "ple-bf16/kv-bf16/donated")
    assert donated["step_ms_median"] == pytest.approx(12.0, rel=0.5)
    assert donated["compile_s"] == 0.25 and donated["weights_bytes"] == 1234 and donated["kv_bytes"] == 567
    assert donated["config"]["model"] == "tiny-a" and donated["env"]["device_kind"] == "fake cpu"
    assert donated["agg_tok_per_s"] == pytest.approx(8000 / donated["step_ms_median"])
    ratios = {r["name"]: r for r in records if r["kind"] == "ratio"}
    assert set(ratios) == {
        "donation/ple-bf16/kv-bf16",
        "donation/ple-bf16/kv-int8",
        "kv-int8/ple-bf16/copying",
        "kv-int8/ple-bf16/donated",
    }
    assert ratios["donation/ple-bf16/kv-bf16"]["verdict"] == "real"
    assert ratios["donation/ple-bf16/kv-bf16"]["ratio"] == pytest.approx(2.0, rel=0.3)
    for name in ("summary.csv", "command.txt", "env.json"):
        assert (out / name).is_file()
    assert (
        (out / "command.txt")
        .read_text()
        .startswith("g4bench revalidate --config 'ple-bf16/*' --model tiny-a")
    )
    env = json.loads((out / "env.json").read_text())
    assert env["settings"]["batch"] == 8 and env["platform"] == "cpu"
    assert (out / "logs" / "ple-bf16_kv-bf16_donated.log").is_file()
    assert "donation effect" in res.output and "real" in res.output
    assert str(out) in res.output.replace("\n", "")


def test_failures_recorded_sweep_continues_and_resume_reruns_only_them(fake_env, monkeypatch):
    monkeypatch.setenv("FAKE_MODE", "mixed")
    out = fake_env / "run"
    args = ["--samples", 3, "--warmup", 0, "--batch", 2, "--ctx", 64, "--out", out]
    res = invoke("--all", *args, "--timeout", 6, "--mem-limit-gib", 2)
    assert res.exit_code == 1, res.output
    meas = {r["name"]: r for r in read_records(out) if r["kind"] == "revalidate"}
    assert len(meas) == 12
    kinds = {n: r["failure"]["kind"] for n, r in meas.items() if "failure" in r}
    assert kinds == {
        "ple-int8/kv-bf16/copying": "oom",
        "ple-int4/kv-bf16/copying": "timeout",
        "ple-int4/kv-int8/copying": "crash",
    }
    assert meas["ple-int4/kv-int8/copying"]["failure"]["exception_type"] == "RuntimeError"
    assert "injected crash" in meas["ple-int4/kv-int8/copying"]["failure"]["stderr_tail"]
    assert len(ran(fake_env)) == 12  # every configuration ran despite the failures

    # --resume with other settings is refused; an existing run without --resume too
    assert invoke("--all", "--out", out, "--resume", "--batch", 4).exit_code == 2
    assert invoke("--all", "--out", out).exit_code == 2

    monkeypatch.setenv("FAKE_MODE", "ok")
    (fake_env / "ran.txt").unlink()
    res = invoke("--all", "--out", out, "--resume")
    assert res.exit_code == 0, res.output
    assert sorted(ran(fake_env)) == sorted(kinds)  # only the failed ones ran again
    records = read_records(out)
    meas = [r for r in records if r["kind"] == "revalidate"]
    assert len(meas) == 12 and not any("failure" in r for r in meas)
    assert all(r["config"]["batch"] == 2 for r in meas)  # settings inherited from the run
    assert len([r for r in records if r["kind"] == "ratio"]) == 6 + 6 + 8  # donation, kv-int8, ple
    assert len((out / "command.txt").read_text().splitlines()) == 2


def test_unusable_requests_exit_2(fake_env):
    assert invoke("--config", "nope/*").exit_code == 2
    assert invoke("--all", "--config", "ple-bf16/*").exit_code == 2
    res = invoke("--resume", "--config", "ple-bf16/kv-bf16/donated")
    assert res.exit_code == 2 and "--out" in res.output


@pytest.mark.slow
def test_real_engine_child_on_tiny_model(tmp_path, monkeypatch):
    """With the lead's engine present: one real configuration of tiny-a in a child process."""
    pytest.importorskip("g4bench.engine.bench")
    from harness.isolate import run_isolated
    from harness.revalidate import CHILD_TARGET, SweepSettings, child_payload

    monkeypatch.setenv("G4BENCH_JAX_CACHE_DIR", str(tmp_path / "cache"))
    cfg = select_configs(load_sweep(), ["ple-bf16/kv-bf16/donated"])[0]
    payload = child_payload(cfg, SweepSettings(model="tiny-a", batch=2, ctx=64, samples=3, warmup=1))
    res = run_isolated(CHILD_TARGET, payload, timeout_s=600)
    assert "failure" not in res, res.get("failure")
    assert len(res["step_ms_samples"]) == 3 and res["compile_s"] > 0 and res["device"]["platform"] == "cpu"
