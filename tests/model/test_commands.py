"""`g4bench verify` and `g4bench generate` through typer's CliRunner on tiny-a."""

from __future__ import annotations

import sys

import pytest
from typer.testing import CliRunner

from g4bench.cli import app

runner = CliRunner()


def test_generate_batch_ids_on_stdout_timings_on_stderr():
    """Two copies of a text prompt (synthetic tokenizer + BOS) in two slots: the same greedy ids twice on
    stdout; prefill, decode and compile figures on stderr."""
    args = ["generate", "--model", "tiny-a", "--prompt", "hi there", "--output-len", "4", "--batch", "2"]
    result = runner.invoke(app, [*args, "--ids", "--ignore-eos"])
    assert result.exit_code == 0, result.output
    rows = [[int(x) for x in line.split()] for line in result.stdout.splitlines()]
    assert len(rows) == 2 and rows[0] == rows[1] and len(rows[0]) == 4
    assert all(0 <= t < 512 for t in rows[0])
    for text in (
        "prompt 9 tokens × batch 2",
        "prefill:",
        "decode: 3 steps",
        "tok/s aggregate at batch 2",
        "compile",
    ):
        assert text in result.stderr


@pytest.mark.parametrize(
    "args",
    [
        ["--model", "tiny-a"],  # neither --prompt nor --input-len
        ["--model", "tiny-a", "--prompt", "x", "--input-len", "3"],
        ["--model", "tiny-a", "--prompt", "x", "--kv-dtype", "fp8"],
        ["--model", "no-such-model", "--prompt", "x"],
    ],
)
def test_generate_bad_input_exits_2(args):
    result = runner.invoke(app, ["generate", *args])
    assert result.exit_code == 2, result.output


@pytest.mark.parity
def test_verify_config_passes():
    pytest.importorskip("transformers")
    result = runner.invoke(app, ["verify", "--model", "tiny-a", "--input-len", "20", "--output-len", "3"])
    assert result.exit_code == 0, result.output
    for text in ("prefill 0..18", "decode 3 (pos 22)", "PASS", "greedy agreement 4/4"):
        assert text in result.stderr


def test_verify_beyond_tolerance_exits_1(monkeypatch):
    """The exit code follows the report (a stub report: the real comparison is tested above)."""
    import numpy as np

    import harness.checks.verify as hv

    def fake(config, **kwargs):
        return hv.VerifyReport(
            checkpoint=str(config), reference_dtype="float64", prompt=[2, 5, 6],
            prefill_err=np.array([1e-6, 2e-6, 3e-3]), decode_err=np.array([1e-6]), ours=[7, 8],
            ref_argmax=[7, 8], ref_gap=[1.0, 1.0], tolerance=kwargs["tolerance"],
        )  # fmt: skip

    monkeypatch.setattr(hv, "verify_config", fake)
    result = runner.invoke(app, ["verify", "--model", "tiny-a"])
    assert result.exit_code == 1, result.output
    assert "FAIL" in result.stderr and "3.00e-03" in result.stderr
    assert runner.invoke(app, ["verify", "--model", "tiny-a", "--tolerance", "1e-2"]).exit_code == 0


def test_verify_without_parity_extra_says_how_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)  # `import torch` now raises ModuleNotFoundError
    result = runner.invoke(app, ["verify", "--model", "tiny-a"])
    assert result.exit_code == 2, result.output
    assert "pip install 'g4bench[parity]'" in result.stderr


@pytest.mark.parametrize(
    "args",
    [
        [],  # neither --checkpoint nor --model
        ["--model", "tiny-a", "--checkpoint", "/nonexistent"],
        ["--model", "tiny-a", "--reference-dtype", "float16"],
        ["--checkpoint", "/nonexistent/dir"],
    ],
)
def test_verify_bad_input_exits_2(args):
    result = runner.invoke(app, ["verify", *args])
    assert result.exit_code == 2, result.output
