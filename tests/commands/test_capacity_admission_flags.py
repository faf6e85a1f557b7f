"""`g4bench capacity --agents/--agent-ctx` reach the admission table's grid; a bad list is a usage error."""

from typer.testing import CliRunner

from g4bench.cli import app


def test_admission_grid_comes_from_the_flags(monkeypatch):
    import harness.capacity.main

    seen = {}

    def fake_run_capacity(request, **kwargs):
        seen["request"] = request
        raise harness.capacity.main.CapacityError("stop here")

    monkeypatch.setattr(harness.capacity.main, "run_capacity", fake_run_capacity)
    res = CliRunner().invoke(app, ["capacity", "--agents", "2,4,8", "--agent-ctx", "500,8000"])
    assert res.exit_code == 2 and "stop here" in res.output
    assert seen["request"].agents == (2, 4, 8) and seen["request"].agent_ctx == (500, 8000)
    bad = CliRunner().invoke(app, ["capacity", "--agents", "two"])
    assert bad.exit_code == 2 and "--agents takes comma-separated integers" in bad.output
