"""One flag per concept: every command's visible options against options.CONCEPTS, the hidden
aliases of renamed flags (they warn and still work), help without absolute paths, one target list."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import typer
import typer.main
from typer.testing import CliRunner

from g4bench.cli import app
from g4bench.commands.options import CONCEPTS, TARGETS, parse_floor, target_hardware

ROOT = Path(__file__).resolve().parents[2]


def _commands() -> dict[str, Any]:
    """The app's commands as click sees them (typer vendors click: typer._click, so no isinstance on click's)."""
    return dict(typer.main.get_command(app).commands)  # type: ignore[attr-defined]


def _options(cmd: Any, *, hidden: bool) -> dict[str, Any]:
    return {
        name: p
        for p in cmd.params
        if p.param_type_name == "option" and p.hidden == hidden
        for name in (*p.opts, *p.secondary_opts)
    }


def test_the_walk_sees_every_command_and_its_options():
    cmds = _commands()
    assert {"serve", "serve-load", "plan", "capacity", "revalidate", "generate", "verify"} <= set(cmds)
    assert "--input-len" in _options(cmds["serve-load"], hidden=False)  # params are exposed, not empty
    assert all(_options(c, hidden=False) or c.params for c in cmds.values())


def test_no_command_shows_a_second_name_for_a_concept():
    synonyms = {s: (concept, name) for concept, (name, syns) in CONCEPTS.items() for s in syns}
    offenders = [
        f"{cmd_name} {opt} (a {synonyms[opt][0]}: use {synonyms[opt][1]})"
        for cmd_name, cmd in _commands().items()
        for opt in _options(cmd, hidden=False)
        if opt in synonyms
    ]
    assert not offenders, offenders


def test_every_hidden_option_is_a_known_renamed_spelling():
    allowed = {s for _, syns in CONCEPTS.values() for s in syns} | {"--config"}  # verify's old --config
    hidden = {
        f"{n} {o}" for n, c in _commands().items() for o in _options(c, hidden=True) if o not in allowed
    }
    assert not hidden


@pytest.mark.parametrize("name", sorted(_commands()))
def test_help_has_no_absolute_path_and_one_default_style(name):
    cmd = _commands()[name]
    text = CliRunner().invoke(app, [name, "--help"], terminal_width=400).output
    assert str(ROOT) not in text and "/work/" not in text and str(Path.home()) not in text
    assert not re.search(r"\(default [^:]", text), "write defaults as '(default: X)'"
    model = _options(cmd, hidden=False).get("--model")
    if model is not None:
        assert "small" in (model.help or ""), f"{name} --model help lacks 'small'"


@pytest.mark.parametrize(
    ("args", "old", "new"),
    [
        (
            ["generate", "--model", "tiny-a", "--prompt-tokens", "0", "--max-tokens", "2"],
            "--prompt-tokens",
            "--input-len",
        ),
        (["verify", "--config", "tiny-a", "--prompt-len", "0"], "--prompt-len", "--input-len"),
        (["capacity", "--kv", "fp4"], "--kv", "--kv-dtype"),
        (
            ["revalidate", "--floor-pct", "200", "--config", "ple-bf16/kv-bf16/donated"],
            "--floor-pct",
            "--floor",
        ),
        (["engine-steps", "--slots", "0"], "--slots", "--max-slots"),
        (["constraint-cost", "--max-tokens", "1"], "--max-tokens", "--output-len"),
    ],
)
def test_a_renamed_flag_warns_and_its_value_is_used(args, old, new):
    """Each case gives the old spelling a value the command rejects, so a rejection proves the value arrived."""
    result = CliRunner().invoke(app, args)
    assert f"{old} is renamed {new}" in result.stderr
    assert result.exit_code == 2, result.output


def test_serve_old_model_name_flag_reaches_the_launch_spec(monkeypatch):
    seen = {}

    def fake_run_server(spec, api_key=None):
        seen["name"] = spec.served_model_name
        return 0

    monkeypatch.setattr("g4bench.server.launch.run_server", fake_run_server)
    result = CliRunner().invoke(app, ["serve", "--model", "tiny-a", "--served-model-name", "m1"])
    assert result.exit_code == 0, result.output
    assert seen["name"] == "m1" and "--served-model-name is renamed --model-name" in result.stderr
    result = CliRunner().invoke(app, ["serve", "--model", "tiny-a", "--model-name", "m2"])
    assert seen["name"] == "m2" and "renamed" not in result.stderr


def test_one_floor_syntax():
    assert parse_floor("2%") == pytest.approx(0.02) == parse_floor("0.02") == parse_floor("2")
    assert parse_floor(None) is None
    with pytest.raises(typer.BadParameter, match="--floor"):
        parse_floor("two")
    with pytest.raises(typer.BadParameter, match="100%"):
        parse_floor("150%")


def test_one_target_list_maps_onto_the_hardware_files():
    assert {"h100", "h200", "tpu-v5p", "tpu-v6e", "tpu-v5e", "local"} <= set(TARGETS)
    for t in TARGETS:
        assert (ROOT / "configs" / "hardware" / f"{target_hardware(t)}.toml").is_file(), t
    with pytest.raises(typer.BadParameter, match="h100"):
        target_hardware("a100")


def test_capacity_on_a_gpu_target_without_the_cuda_plugin_says_what_to_install(monkeypatch):
    import harness.capacity.main as capacity_main

    monkeypatch.setattr(capacity_main, "has_cuda_plugin", lambda: False)
    result = CliRunner().invoke(
        app, ["capacity", "--target", "h100", "--model", "tiny-a", "--out", "/nonexistent/x"]
    )
    assert result.exit_code == 2
    assert "jax-cuda12-plugin[with-cuda]==" in result.stderr and "--target local" in result.stderr
