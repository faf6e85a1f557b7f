"""serve-load's --trace / --find-max / --prefill-policy usage errors: exit 2 before any server starts."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from g4bench.cli import app


def run(*args: str):
    return CliRunner().invoke(app, ["serve-load", *args])


def test_a_bad_trace_line_is_named(tmp_path: Path) -> None:
    trace = tmp_path / "t.jsonl"
    trace.write_text('{"timestamp": 0, "input_length": 5, "output_length": 1}\n{"timestamp": 1, "input_length": 5}\n')
    res = run("--trace", str(trace))
    assert res.exit_code == 2 and "t.jsonl:2: output_length: missing" in res.output


@pytest.mark.parametrize(("args", "message"), [
    (("--trace", "configs/traces/mooncake-30.jsonl", "--find-max", "agents"), "replays its own schedule"),
    (("--find-max", "rate"), "needs --search-bounds"),
    (("--find-max", "agents", "--search-bounds", "4,2"), "0 < LO ≤ HI"),
    (("--find-max", "agents", "--duration", "5"), "measures its own levels"),
    (("--prefill-policy", "eager"), "--prefill-policy takes mixed or chunk"),
    (("--prefill-policy", "chunk", "--url", "http://127.0.0.1:9"), "for the self-started server"),
])  # fmt: skip
def test_usage_errors(args: tuple[str, ...], message: str) -> None:
    res = run(*args)
    assert res.exit_code == 2 and message in res.output, res.output
