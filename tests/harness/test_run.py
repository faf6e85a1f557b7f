"""The shared run-folder lifecycle (harness/run.py), and roofline driven through it with fake children.

Fake children are functions of this file, started in fresh processes by `run_isolated` as
``<this file>:<function>`` targets; they return canned results, so no engine or jax is needed.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from rich.console import Console

from harness.capacity.main import CapacityError
from harness.results import RecordError, read_records, validate_record
from harness.revalidate.main import CPU_DEFAULTS as REVALIDATE_CPU
from harness.revalidate.main import RevalidateError
from harness.roofline.main import CPU_DEFAULTS as ROOFLINE_CPU
from harness.roofline.main import RooflineError, RooflineRequest, run_roofline
from harness.run import CHILD_TIMEOUT_S, CPU_LAYERS, RequestError, finish, open_run, probe

HERE = Path(__file__).resolve()
DEVICE = {"platform": "cpu", "device_kind": "fake cpu", "device_count": 1}


def echo_child(payload: dict) -> dict:
    import sys

    print("child says hello", file=sys.stderr)
    return {"echo": payload["x"], "device": DEVICE}


def sleepy_child(payload: dict) -> dict:
    time.sleep(60)
    return {}


def broken_child(payload: dict) -> dict:
    raise RuntimeError("no jax here")


def fake_calibrate(payload: dict) -> dict:
    kernels = [
        {
            "kernel": "sum",
            "gb_per_s_median": 40.0,
            "gb_per_s_best": 41.0,
            "rel_iqr_pct": 1.0,
            "buffer_bytes": 2**20,
        },
        {
            "kernel": "copy",
            "gb_per_s_median": 90.0,
            "gb_per_s_best": 91.0,
            "rel_iqr_pct": 1.0,
            "buffer_bytes": 2**20,
        },  # read + write: never picked
    ]
    return {"kernels": kernels, "device_memory_bytes": 2**30, "fractions": [0.1], "reps": 3, "device": DEVICE}


def fake_step(payload: dict) -> dict:
    ms = 2.0 * payload["case"]["ctx"] / 64  # time doubles with the context
    return {
        "step_ms_samples": [ms, ms * 1.01, ms * 0.99],
        "weights_bytes": 1000,
        "kv_bytes": 100 * payload["case"]["ctx"],
        "compile_s": 0.5,
        "device": DEVICE,
    }


def _open(tmp_path: Path, **kw):
    args = dict(
        out=None, results_root=tmp_path, short_name="demo", argv=["g4bench", "demo", "--x", "a b"],
        settings={"x": 1, "batches": [1, 2]}, identity={"x": 1}, device=DEVICE, timeout_s=60.0,
        mem_limit_bytes=None,
    )  # fmt: skip
    return open_run(**(args | kw))


def test_open_run_writes_the_folder_command_and_env(tmp_path):
    run = _open(tmp_path, env_extra={"sweep": "grid.toml"})
    assert run.path.parent == tmp_path and run.path.name.endswith("-demo") and run.run_id == run.path.name
    assert (run.path / "logs").is_dir()
    assert (run.path / "command.txt").read_text() == "g4bench demo --x 'a b'\n"
    env = json.loads((run.path / "env.json").read_text())
    assert env["settings"] == {"x": 1, "batches": [1, 2]} and env["sweep"] == "grid.toml"
    assert env["device_kind"] == "fake cpu" and env["platform"] == "cpu"
    again = _open(tmp_path, out=run.path, resume=True, argv=["g4bench", "demo", "--resume"])
    assert again.path == run.path
    assert (run.path / "command.txt").read_text().splitlines() == [
        "g4bench demo --x 'a b'",
        "g4bench demo --resume",
    ]


def test_records_carry_their_own_config_hash_and_device(tmp_path):
    run = _open(tmp_path, device=None)
    a = run.record("serve-load", "a", {"c": 1}, DEVICE, median_ttft_ms=3.0)
    b = run.record("serve-load", "b", {"c": 2})
    assert a["env"]["config_hash"] != b["env"]["config_hash"] != run.base_env["config_hash"]
    assert a["env"]["device_kind"] == "fake cpu" and b["env"]["device_kind"] is None
    assert a["run_id"] == run.run_id
    run.append(a)
    with pytest.raises(RecordError):
        run.append({**b, "kind": "bogus"})
    assert [r["name"] for r in read_records(run.path)] == ["a"], "an invalid record never reaches the file"
    finish(run, read_records(run.path), Console(quiet=True))
    assert (run.path / "summary.csv").read_text().splitlines()[1].startswith("1,serve-load,a,")


def test_children_log_to_the_folder_and_obey_its_timeout(tmp_path):
    run = _open(tmp_path)
    result = run.child(f"{HERE}:echo_child", {"x": 7}, "point/with spaces")
    assert result["echo"] == 7
    assert "child says hello" in (run.path / "logs" / "point_with_spaces.log").read_text()
    quick = _open(tmp_path, timeout_s=1.0)
    assert quick.child(f"{HERE}:sleepy_child", {}, "sleepy")["failure"]["kind"] == "timeout"


def test_probe_failure_is_a_request_error():
    with pytest.raises(RequestError, match="could not start jax"):
        probe(f"{HERE}:broken_child")
    assert probe(f"{HERE}:fake_probe")["device_kind"] == "fake cpu"


def fake_probe(payload: dict) -> dict:
    return dict(DEVICE)


def test_policies_live_in_one_place():
    import jax

    from g4bench.engine.loading import default_format

    assert jax.default_backend() == "cpu"
    assert default_format().layers == CPU_LAYERS  # the harness measures what the engine serves on CPU
    assert REVALIDATE_CPU.layers == ROOFLINE_CPU["layers"] == CPU_LAYERS
    assert issubclass(RevalidateError, RequestError) and issubclass(RooflineError, RequestError)
    assert issubclass(CapacityError, RequestError)
    from harness.revalidate.main import SweepSettings
    from harness.roofline.main import RooflineSettings

    assert SweepSettings.__dataclass_fields__["timeout_s"].default == CHILD_TIMEOUT_S
    assert RooflineSettings.__dataclass_fields__["timeout_s"].default == CHILD_TIMEOUT_S


def test_roofline_runs_through_the_lifecycle(tmp_path, monkeypatch):
    """Probe, folder, children, records, summary and the bandwidth figure, with fake children."""
    import harness.roofline.main

    monkeypatch.setattr("harness.run.probe", lambda target="": dict(DEVICE))
    monkeypatch.setattr(harness.roofline.main, "CALIBRATE_TARGET", f"{HERE}:fake_calibrate")
    monkeypatch.setattr(harness.roofline.main, "STEP_TARGET", f"{HERE}:fake_step")
    out = tmp_path / "run"
    request = RooflineRequest(model="tiny-a", batches=(1,), ctxs=(64, 256), samples=3, breakdown=False)
    outcome = run_roofline(
        request=request, out=out, argv=["g4bench", "roofline"], console=Console(quiet=True)
    )
    records = read_records(out)
    assert [r["name"] for r in records] == [
        "calibration",
        "decode/b1/ctx64/paged/ring",  # the default: the served step
        "decode/b1/ctx256/paged/ring",
        "kv-slope/b1",
    ]
    for rec in records:
        validate_record(rec)
    assert records[0]["calibrated_gb_per_s"] == 40.0 and records[0]["calibration_kernel"] == "sum"
    step = records[1]
    assert step["step_ms_median"] == pytest.approx(2.0) and step["env"]["device_kind"] == "fake cpu"
    assert step["fraction_of_calibrated"] == pytest.approx(step["achieved_gb_per_s"] / 40.0)
    assert not outcome.failures
    assert (out / "summary.csv").is_file() and (out / "plots" / "bandwidth.png").is_file()
    assert json.loads((out / "env.json").read_text())["settings"]["ctxs"] == [64, 256]
    assert (out / "logs" / "decode-b1-ctx256.log").is_file()
