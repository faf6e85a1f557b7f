"""The prepared device check: its accelerator command lines parse, and its dry run passes on the CPU.

The dry run is the whole check at tiny sizes (doctor, revalidate, roofline, capacity bisection,
serve + serve-load), each step a fresh `g4bench` process, so the suite catches a renamed flag
before an accelerator's minutes are spent on it. It takes about 2 minutes on a quiet 2-core host;
no test asserts that (a loaded host took 258 s); the steps' budgets, tripled here, bound a hang.
"""

import json
import time
from pathlib import Path

import pytest
import typer.main

from g4bench.cli import app
from g4bench.commands.device_steps import steps


@pytest.mark.parametrize("dry_run", [False, True])
def test_every_step_command_line_parses(tmp_path: Path, dry_run: bool):
    from harness.load import burst

    group = typer.main.get_command(app)
    burst_app = typer.Typer()
    burst_app.command()(burst.main)
    plan = steps(tmp_path, dry_run)
    assert [s.name for s in plan] == ["doctor", "revalidate", "roofline", "capacity", "serve-load", "burst"]
    assert [s.name for s in plan if s.optional] == ["burst"]
    for step in plan:
        # parses and validates every option without running the command
        if step.module == "g4bench.cli":
            group.commands[step.argv[0]].make_context(step.argv[0], list(step.argv[1:]))
        else:
            assert step.module == "harness.load.burst"
            typer.main.get_command(burst_app).make_context("burst", list(step.argv))
        assert str(tmp_path / step.name) in step.argv, f"{step.name} must write its own run folder"
    if not dry_run:
        assert sum(s.budget_s for s in plan if not s.optional) < 8 * 60


def test_dry_run_passes_on_the_cpu(tmp_path: Path):
    from g4bench.commands.device_steps import run_check

    outcome = run_check(tmp_path, dry_run=True, time_scale=3.0)  # budgets bound a hang, not speed
    logs = {r.name: Path(r.log).read_text()[-2000:] for r in outcome.failed}
    assert not outcome.failed, logs
    summary = json.loads((tmp_path / "device-check.json").read_text())
    assert [s["status"] for s in summary["steps"]] == ["ok"] * 5  # the optional burst step not among them
    doctor = json.loads((tmp_path / "doctor" / "doctor.json").read_text())
    assert doctor["broken"] == 0 and doctor["facts"]["device"]["platform"] == "cpu"
    records = {
        name: [json.loads(line) for line in (tmp_path / name / "results.jsonl").read_text().splitlines()]
        for name in ("revalidate", "roofline", "capacity", "serve-load")
    }
    assert all(records.values()), {k: len(v) for k, v in records.items()}
    for name in ("revalidate", "roofline"):
        assert not any("failure" in r for r in records[name]), name
    # the bisection's oversized probes are recorded OOMs; the ceiling it found is not
    ceilings = [r for r in records["capacity"] if r.get("record") == "ceiling"]
    assert ceilings and ceilings[0]["max_batch"] > 0 and "failure" not in ceilings[0]


def test_the_optional_burst_step_runs_when_named(tmp_path: Path):
    """`--step burst` at tiny sizes: both policies' servers start and the figures are written."""
    from g4bench.commands.device_steps import run_check

    outcome = run_check(tmp_path, dry_run=True, only=["burst"], time_scale=3.0)
    assert [r.name for r in outcome.results] == ["burst"]
    assert not outcome.failed, Path(outcome.results[0].log).read_text()[-2000:]
    figures = json.loads((tmp_path / "burst" / "burst.json").read_text())["policies"]
    assert set(figures) == {"mixed", "chunk"}
    for f in figures.values():
        assert "failure" not in f and len(f["rounds"]) == 1 and len(f["burst_ttft_ms"]) == 8
        assert f["last_over_lone"] > 0 and f["max_gap_over_median"] > 0


def test_a_failed_step_is_recorded_and_the_check_goes_on(tmp_path: Path, monkeypatch):
    import g4bench.commands.device_steps as dc

    seen = []

    def fake_step(step, out, env):
        seen.append((step.name, step.budget_s, env["XLA_PYTHON_CLIENT_PREALLOCATE"]))
        status = "timeout" if step.name == "revalidate" else "ok"
        return dc.StepResult(step.name, list(step.argv), step.budget_s, status=status, rc=0)

    monkeypatch.setattr(dc, "run_step", fake_step)
    outcome = dc.run_check(tmp_path, dry_run=False, only=["revalidate", "roofline"], time_scale=2.0)
    budgets = {s.name: s.budget_s for s in steps(tmp_path, False)}
    assert seen == [
        ("revalidate", 2 * budgets["revalidate"], "false"),
        ("roofline", 2 * budgets["roofline"], "false"),
    ]
    assert [r.name for r in outcome.failed] == ["revalidate"]
    summary = json.loads((tmp_path / "device-check.json").read_text())
    assert summary["time_scale"] == 2.0 and [s["status"] for s in summary["steps"]] == ["timeout", "ok"]


def test_a_timed_out_step_takes_its_own_session_children_with_it():
    """Measuring children start their own sessions; a killed step must not leave them on the device."""
    import subprocess
    import sys

    import psutil

    from g4bench.commands.device_steps import _kill_tree

    code = (
        "import subprocess, sys, time; "
        "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'], start_new_session=True); "
        "time.sleep(120)"
    )
    step = subprocess.Popen([sys.executable, "-c", code], start_new_session=True)
    parent = psutil.Process(step.pid)
    for _ in range(200):  # bounded: the grandchild appears within a second or two
        kids = parent.children(recursive=True)
        if kids:
            break
        time.sleep(0.05)
    assert kids, "the step never started its child"
    _kill_tree(step.pid)
    step.wait(timeout=30)
    assert not any(k.is_running() and k.status() != psutil.STATUS_ZOMBIE for k in kids)


def test_the_check_writes_under_results_not_into_the_references(tmp_path: Path, monkeypatch):
    from g4bench.commands.device_check import check_folder

    monkeypatch.chdir(tmp_path)
    made = check_folder(None, dry_run=True)
    assert made.parent == Path("results") and made.name.endswith("device-check-dry") and made.is_dir()
    assert check_folder(None, dry_run=False).name.endswith("device-check")
    assert check_folder(Path("results/reference/h100"), dry_run=False) == Path("results/reference/h100")
    with pytest.raises(ValueError, match="outside results/reference"):
        check_folder(Path("results/reference/h100"), dry_run=True)
