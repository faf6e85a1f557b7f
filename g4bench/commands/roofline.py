"""`g4bench roofline` (placeholder: owned by the issue that builds it; replace whole file)."""

from __future__ import annotations

import typer


def roofline() -> None:
    """Not built yet."""
    raise typer.Exit(code=2)
