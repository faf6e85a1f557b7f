"""Option parsing and naming shared by every command: one list parser and one target list (from
harness/args.py, shared with the harness's own instruments), one floor syntax, and the hidden
aliases that keep renamed flags working (with a warning) for one release.

Names (tests/commands/test_option_names.py walks every command against `CONCEPTS`):
prompt length `--input-len`, output length `--output-len`, model id clients send `--model-name`,
practical floor `--floor` ('2%' or 0.02), KV dtype `--kv-dtype`, seed `--seed`, model `--model`.
A renamed flag stays as a hidden option built by `renamed(...)`: it warns on stderr and the command
takes its value through `alias(...)`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, TypeVar

import typer

# Re-exported: the commands take every shared option helper from this one module.
from harness.args import TARGET_HELP as TARGET_HELP
from harness.args import TARGETS as TARGETS
from harness.args import ProfileOption as ProfileOption
from harness.args import TargetOption as TargetOption
from harness.args import int_list as int_list
from harness.args import str_list as str_list
from harness.args import target_hardware as target_hardware

T = TypeVar("T")

# concept -> (the one allowed name, synonyms no command may show)
CONCEPTS: dict[str, tuple[str, tuple[str, ...]]] = {
    "prompt length": (
        "--input-len",
        ("--prompt-len", "--prompt-tokens", "--prompt-length", "--input-tokens"),
    ),
    "output length": ("--output-len", ("--max-tokens", "--decode-steps", "--max-new-tokens", "--gen-len")),
    "model id clients send": ("--model-name", ("--served-model-name", "--model-id")),
    "practical floor": ("--floor", ("--floor-pct", "--floor-percent")),
    "KV cache dtype": ("--kv-dtype", ("--kv", "--kv-cache-dtype")),
    "random seed": ("--seed", ("--random-seed", "--rng-seed")),
    "engine slots": ("--max-slots", ("--slots", "--num-slots")),
}

# The packaged goodput objectives; help shows the checkout-relative path, never this host's absolute one.
SLO_DEFAULT = Path(__file__).resolve().parents[2] / "configs" / "slo" / "agent.toml"
SLO_DEFAULT_HELP = "configs/slo/agent.toml in the checkout"

MODEL_HELP = "e2b | e4b | small | a tiny-* preset | a config .json | a checkpoint DIR"


def _warn(old: str, new: str):
    def callback(value: Any) -> Any:
        if value is not None:
            typer.echo(f"warning: {old} is renamed {new}; {old} goes away in the next release", err=True)
        return value

    return callback


def renamed(old: str, new: str) -> Any:
    """A hidden option spelled `old` that warns and stands for `new` (declare it with a None default)."""
    return typer.Option(old, hidden=True, help=f"Renamed: use {new}.", callback=_warn(old, new))


def alias(new_value: T, old_value: T | None) -> T:
    """The value of a renamed option: the old spelling's when given, else the new one's."""
    return new_value if old_value is None else old_value


def parse_floor(text: str | None, option: str = "--floor") -> float | None:
    """``"2%"`` → 0.02, ``"0.02"`` → 0.02, ``"2"`` → 0.02 (a bare number ≥ 1 is percent); None stays None."""
    if text is None:
        return None
    raw = text.strip()
    try:
        value = float(raw[:-1]) / 100 if raw.endswith("%") else float(raw)
    except ValueError as exc:
        raise typer.BadParameter(f"{option} takes '2%' or 0.02, got {text!r}") from exc
    if not raw.endswith("%") and value >= 1:
        value /= 100
    if not 0 <= value < 1:
        raise typer.BadParameter(f"{option} must be in [0%, 100%), got {text!r}")
    return value
