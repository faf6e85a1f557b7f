"""`g4bench generate --draft-model NAME --spec-k K`: refusals, and greedy identity end to end."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from g4bench.cli import app


@pytest.mark.parametrize("extra", [["--batch", "2"], ["--top-k", "5"], ["--spec-k", "0"]])
def test_unsupported_combinations_are_refused(extra):
    args = ["generate", "--model", "tiny-a", "--prompt-tokens", "8", "--draft-model", "tiny-a", *extra]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 2
    assert "--draft-model needs" in res.output


@pytest.mark.slow
def test_greedy_speculative_generate_reports_acceptance_and_identity():
    args = ["generate", "--model", "tiny-a", "--prompt-tokens", "12", "--max-tokens", "10", "--ignore-eos",
            "--draft-model", "tiny-b", "--spec-k", "2", "--ids"]  # fmt: skip
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    assert "identical to the plain run" in res.output
    assert "acceptance rate" in res.output
