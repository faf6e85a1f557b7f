"""Live progress on stderr (rich): one bar per concurrency level, with failures and running TTFT.

The runner calls `level_start(conc, expected_requests)` before a level and `record(rec)` after every
request; both run on the event loop thread, so no locking is needed.
"""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from harness.load.client import RequestRecord


class LiveProgress:
    def __init__(self, console: Console) -> None:
        self.progress = Progress(
            TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
            TextColumn("{task.fields[info]}"), console=console, transient=False,
        )  # fmt: skip
        self.task: Any = None
        self.failed = 0
        self.ttfts: list[float] = []

    def __enter__(self) -> LiveProgress:
        self.progress.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.progress.__exit__(*exc)

    def level_start(self, conc: int, expected: int | None, label: str | None = None) -> None:
        self.failed, self.ttfts = 0, []
        self.task = self.progress.add_task(label or f"c={conc}", total=expected, info="")

    def record(self, rec: RequestRecord) -> None:
        if rec.ok and rec.chunk_times:
            self.ttfts.append(rec.chunk_times[0] * 1e3)
        self.failed += not rec.ok
        ttft = sorted(self.ttfts)[len(self.ttfts) // 2] if self.ttfts else None
        info = f"TTFT p50 {ttft:.0f} ms" if ttft is not None else ""
        if self.failed:
            info += f"  [red]{self.failed} failed[/red]"
        self.progress.update(self.task, advance=1, info=info)
