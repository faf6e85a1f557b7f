"""`g4bench plan` sizes the agent regime by default: 8 agents (users run 2-8), 20 turns, 500-token start."""

import typer.main

from g4bench.cli import app


def test_plan_defaults_are_the_agent_regime():
    params = {p.name: p.default for p in typer.main.get_command(app).commands["plan"].params}
    assert params["agents"] == 8 and 2 <= params["agents"] <= 8
    assert params["workload"] == "agent" and params["turns"] == 20 and params["input_len"] == 500
