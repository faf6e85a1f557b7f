"""Option parsing shared by every command: one list parser, so `--batch 1,8,32` means the same everywhere."""

from __future__ import annotations

import typer


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
