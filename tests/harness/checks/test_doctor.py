"""`g4bench doctor`: rows say what is broken, and a broken check makes the exit code 1.

The happy path on this CPU (every child started) runs in tests/harness/test_device_check.py's dry
run; here the children are replaced, so each branch is checked by hand in milliseconds.
"""

import importlib.util
import json

from typer.testing import CliRunner

import harness.isolate
from g4bench.cli import app
from harness.checks.doctor import command_rows


def test_a_missing_server_module_fails_serve_but_a_missing_parity_extra_is_a_skip(monkeypatch):
    real = importlib.util.find_spec
    absent = {"fastapi", "torch"}
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None if name in absent else real(name))
    rows = {r.check: r for r in command_rows(device_ok=True, compile_ok=True)}
    assert rows["command: serve"].status == "fail" and "fastapi" in rows["command: serve"].detail
    assert rows["command: verify"].status == "skip" and "parity extra" in rows["command: verify"].detail
    assert rows["command: gate"].status == "ok"


def test_jax_commands_fail_when_the_compile_check_failed():
    rows = {r.check: r.status for r in command_rows(device_ok=True, compile_ok=False)}
    assert rows["command: revalidate"] == "fail" and rows["command: serve-load"] == "ok"


def test_a_device_that_does_not_start_is_exit_code_1(monkeypatch, tmp_path):
    def no_device(target, payload, timeout_s):
        return {"failure": {"kind": "crash", "detail": "RuntimeError: no CUDA devices", "stderr_tail": ""}}

    monkeypatch.setattr(harness.isolate, "run_isolated", no_device)
    result = CliRunner().invoke(app, ["doctor", "--out", str(tmp_path)])
    assert result.exit_code == 1, result.output
    report = json.loads((tmp_path / "doctor.json").read_text())
    status = {r["check"]: r["status"] for r in report["rows"]}
    assert status["device"] == "fail" and "no CUDA devices" in report["rows"][1]["detail"]
    assert status["command: revalidate"] == "fail" and status["command: gate"] == "ok"


def test_every_check_passing_is_exit_code_0(monkeypatch, tmp_path):
    kernels = [{"kernel": "sum", "buffer_bytes": 2**28, "gb_per_s_median": 40.0, "gb_per_s_best": 41.0,
                "rel_iqr_pct": 1.0}]  # fmt: skip
    answers = {
        "harness.checks.doctor:device_child": {"platform": "cpu", "device_kind": "cpu", "device_count": 1},
        "harness.roofline.probes:calibrate_child": {"kernels": kernels},
        "harness.capacity.aot:compile_child": {"fits": True, "compile_s": 1.0, "peak_bytes": 2**20},
        "harness.checks.doctor:eval_shape_child": {"weights_bytes": 2**30, "kv_bytes": 2**20, "output_bytes": 8},
    }
    monkeypatch.setattr(harness.isolate, "run_isolated", lambda target, payload, timeout_s: answers[target])
    result = CliRunner().invoke(app, ["doctor", "--no-e2b-compile", "--out", str(tmp_path)])
    report = (tmp_path / "doctor.json").read_text()
    assert '"broken": 0' in report and "40.0 GB/s" in report
    assert result.exit_code == 0, result.output
