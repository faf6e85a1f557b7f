"""Engine watchdog: notices a dead or stalled engine thread and fails fast instead of hanging.

An asyncio task polls the scheduler every `interval_s`:

- dead: the engine thread is gone or recorded an error (`Scheduler.alive` is False);
- stalled: warm-up is done but the thread's `heartbeat` is older than `stall_s` (it beats at every
  loop turn and every `HEARTBEAT_S` while idle, so only a call into the engine that never returns,
  or a thread wedged elsewhere, lets it age).

On the first of either it trips, once and for good: `failure` is set (the server then answers
/health and every new request with 503), `on_trip(reason)` runs — the server answers every waiting
request with 503 at once — and, when given, `on_exit(reason)` (the `serve` command uses it to stop
uvicorn and exit non-zero, so a supervisor restarts the process). A stalled engine thread is never
killed (Python cannot): its requests are abandoned, and the process is meant to be restarted.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from g4bench.engine.scheduler import Scheduler

log = logging.getLogger(__name__)


class EngineWatchdog:
    def __init__(
        self,
        scheduler: Scheduler,
        stall_s: float,
        on_trip: Callable[[str], None],
        on_exit: Callable[[str], None] | None = None,
        interval_s: float = 0.1,
    ) -> None:
        if stall_s <= 0 or interval_s <= 0:
            raise ValueError(f"stall_s and interval_s must be > 0, got {stall_s}, {interval_s}")
        self.scheduler, self.stall_s, self.interval_s = scheduler, stall_s, interval_s
        self.on_trip, self.on_exit = on_trip, on_exit
        self.failure: str | None = None
        self._task: asyncio.Task | None = None

    def check(self) -> str | None:
        """Why the engine cannot serve now (None while it can, or is still warming up)."""
        s = self.scheduler
        if not s.alive:
            return "the engine loop died"
        age = time.monotonic() - s.heartbeat
        if s.ready and age > self.stall_s:
            return f"the engine made no progress for {age:.1f} s (stall limit {self.stall_s:g} s)"
        return None

    def trip(self, reason: str) -> None:
        if self.failure is not None:
            return
        self.failure = reason
        log.error("engine watchdog: %s; failing every waiting request, /health is 503", reason)
        self.on_trip(reason)
        if self.on_exit is not None:
            self.on_exit(reason)

    async def _run(self) -> None:
        while self.failure is None:
            reason = self.check()
            if reason is not None:
                self.trip(reason)
                return
            await asyncio.sleep(self.interval_s)

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="g4bench-watchdog")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
