"""Rich tables for logs 80 columns wide: names fold, figures never cut.

rich shrinks every column of a table wider than the console and cuts cells to "…"; a piped log
(CI, `nohup`, `| tee`) is 80 columns. `fitted_table` gives the name columns
the slack and keeps every other column at its content's full width.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def fitted_table(title: str, header: Sequence[str], cells: Sequence[Sequence[str]], folding: int = 1) -> Any:
    """A table whose first `folding` columns (names) fold onto further lines while every other column
    keeps its full width, so figures are never cut to "…" in an 80-column log."""
    from rich import box
    from rich.table import Table
    from rich.text import Text

    table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
    for i, col in enumerate(header[:folding]):
        table.add_column(col, overflow="fold", ratio=2 if i == 0 else 1)  # the name takes most slack
    for i, col in enumerate(header[folding:], folding):
        width = max([len(col), *(Text.from_markup(row[i]).cell_len for row in cells)])
        table.add_column(col, justify="left" if col == "verdict" else "right", no_wrap=True, min_width=width)
    for row in cells:
        table.add_row(*row)
    return table
