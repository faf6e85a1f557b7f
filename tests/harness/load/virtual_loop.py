"""An asyncio event loop on virtual time: `loop.time()` starts at 0 and jumps to the next timer
whenever every task is waiting, so `asyncio.sleep(5)` returns at once with the clock 5 s later.

Pacing code runs on it unchanged (it waits with asyncio.sleep and reads the clock it is given), so
a test asserts exact send times with no wall-clock dependence. A loop with nothing scheduled and
nothing to do would wait forever on real I/O; here that is a test bug and raises.
"""

from __future__ import annotations

import asyncio
import selectors
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


class _Selector(selectors.DefaultSelector):
    def __init__(self, loop: VirtualTimeLoop) -> None:
        super().__init__()
        self.loop = loop

    def select(self, timeout: float | None = None) -> list:
        ready = super().select(0)
        if ready:
            return ready
        if timeout is None:
            raise RuntimeError("virtual loop: every task waits and no timer is set (a deadlock)")
        self.loop.now += timeout  # nothing to do before the next timer: jump to it
        return []


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    def __init__(self) -> None:
        self.now = 0.0
        super().__init__(_Selector(self))

    def time(self) -> float:
        return self.now


def run_virtual(coro: Coroutine[Any, Any, T]) -> T:
    loop = VirtualTimeLoop()
    try:
        return loop.run_until_complete(coro)
    finally:
        loop.close()
