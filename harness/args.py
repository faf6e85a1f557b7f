"""Command-line values shared by the `g4bench` commands and the harness's own `python -m` instruments
(harness.sim.burst, harness.sim.prefix_share): one comma-separated list syntax, one target list, and
the options that name a simulated target.
A bad value is a usage error (typer.BadParameter) naming the option and what was given.

The CLI reaches these through g4bench/commands/options.py, which re-exports them beside its naming
rules; the harness imports them from here, so nothing below the CLI imports it (tests/test_layers.py).
"""

from __future__ import annotations

from typing import Annotated

import typer

# Every hardware target a command may be asked for; `target_hardware` maps it onto configs/hardware.
TARGETS = ("local", "tpu-v5e", "tpu-v5p", "tpu-v6e", "h100", "h200")
TARGET_HELP = "local (this host) | tpu-v5e | tpu-v5p | tpu-v6e | h100 | h200"
_HARDWARE = {"local": "cpu", "h100": "nvidia-h100", "h200": "nvidia-h200"}

# What a simulating command line names: the target, its step-time profile, the model on it.
TargetOption = Annotated[str, typer.Option(help=f"{TARGET_HELP}.")]
ProfileOption = Annotated[
    str | None, typer.Option(help="Step-time profile id or path (default: the target's).")
]
ModelOption = Annotated[str | None, typer.Option(help="Model (default: the target's).")]


def target_hardware(target: str) -> str:
    """The configs/hardware id of a `--target` value; an unknown target is a usage error listing them."""
    if target not in TARGETS:
        raise typer.BadParameter(f"--target takes one of {', '.join(TARGETS)}; got {target!r}")
    return _HARDWARE.get(target, target)


def int_list(text: str | None, option: str, minimum: int = 1) -> tuple[int, ...] | None:
    """``"1,8,32"`` → (1, 8, 32); None stays None; anything else is a usage error naming `option`."""
    if text is None:
        return None
    try:
        values = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError as exc:
        raise typer.BadParameter(f"{option} takes comma-separated integers, got {text!r}") from exc
    if not values:
        raise typer.BadParameter(f"{option} is empty")
    if min(values) < minimum:
        raise typer.BadParameter(f"{option} values must be >= {minimum}, got {text!r}")
    return values


def str_list(text: str | None) -> tuple[str, ...] | None:
    """``"bf16, int8"`` → ("bf16", "int8"); None or empty stays None."""
    values = tuple(v.strip() for v in text.split(",") if v.strip()) if text else ()
    return values or None
