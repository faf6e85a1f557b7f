"""Which tokens each engine slot holds, and where a new prompt should go (prefix reuse, LRU).

The scheduler owns one `SlotTable`. For every slot it records `tokens`: exactly the tokens whose
K/V the engine has written at positions 0..len-1 (prompt chunks and every token fed to a decode
step; the token that ended a request is never fed, so it is never here). A slot is *busy* while a
request owns it; otherwise it is *idle*: empty, or *resident* with a finished (or cancelled)
conversation that a later request may continue.

`plan()` picks, for a new prompt, the slot to run it in and how many prompt tokens it can skip:

1. Every slot's common prefix with the prompt is measured, capped at len(prompt) - 1 (the last
   prompt token must be computed to get the logits for the first output token), and kept only
   if `can_resume(len(slot.tokens), common)` (a ring KV cache forgets old positions, so it can only
   continue from its exact end).
2. The longest usable prefix wins. An idle slot whose whole sequence is the prefix (an agent's next
   turn) is taken over in place. An idle slot that shares only part of its sequence, or a busy
   slot, is copied into another idle slot (`copy_slot`) so its own conversation stays intact,
   if the prefix is at least `copy_min` tokens; otherwise a partial idle match is taken over.
3. Without a usable prefix the prompt goes to an empty slot, else to the least recently used idle
   slot (its resident sequence is evicted).

Reuse is token-exact: a slot's tokens are compared id by id, never by hash.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np


@dataclass
class Slot:
    tokens: list[int] = field(default_factory=list)  # ids at positions 0..len-1 of this slot's KV
    owner: int | None = None  # request id while busy
    last_used: int = 0  # LRU clock value of the last release


@dataclass(frozen=True)
class Plan:
    slot: int  # where the request runs
    reuse: int  # prompt tokens already in place after the (optional) copy: prefill starts here
    copy_from: int | None = None  # copy this slot's KV into `slot` first


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix of two id sequences."""
    n = min(len(a), len(b))
    if n == 0:
        return 0
    diff = np.flatnonzero(np.asarray(a[:n], np.int64) != np.asarray(b[:n], np.int64))
    return int(diff[0]) if diff.size else n


class SlotTable:
    """Per-slot token bookkeeping and placement; used only by the scheduler's engine thread."""

    def __init__(self, num_slots: int, copy_min: int = 16) -> None:
        self.slots = [Slot() for _ in range(num_slots)]
        self.copy_min = copy_min
        self._clock = 0

    def idle(self) -> list[int]:
        return [i for i, s in enumerate(self.slots) if s.owner is None]

    def busy(self) -> list[int]:
        return [i for i, s in enumerate(self.slots) if s.owner is not None]

    def resident(self) -> list[int]:
        return [i for i, s in enumerate(self.slots) if s.owner is None and s.tokens]

    def plan(self, prompt: Sequence[int], can_resume: Callable[[int, int], bool]) -> Plan | None:
        """Where to run `prompt`, or None when every slot is busy."""
        idle = self.idle()
        if not idle:
            return None
        candidates = []  # (reuse, idle, slot), best first
        for i, s in enumerate(self.slots):
            reuse = min(common_prefix(s.tokens, prompt), len(prompt) - 1)
            if reuse > 0 and can_resume(len(s.tokens), reuse):
                candidates.append((reuse, s.owner is None, i))
        for reuse, is_idle, i in sorted(candidates, reverse=True):
            others = [j for j in idle if j != i]
            if is_idle:
                whole = reuse == len(self.slots[i].tokens)
                if not whole and reuse >= self.copy_min and others:
                    return Plan(slot=self._victim(others), reuse=reuse, copy_from=i)
                return Plan(slot=i, reuse=reuse)
            if reuse >= self.copy_min:
                return Plan(slot=self._victim(idle), reuse=reuse, copy_from=i)
        return Plan(slot=self._victim(idle), reuse=0)

    def _victim(self, candidates: list[int]) -> int:
        """An empty slot if any, else the least recently used one."""
        empty = [i for i in candidates if not self.slots[i].tokens]
        if empty:
            return empty[0]
        return min(candidates, key=lambda i: self.slots[i].last_used)

    def acquire(self, plan: Plan, request_id: int) -> None:
        """Give `plan.slot` to a request; its tokens become the reused prefix (the caller copies KV)."""
        dst = self.slots[plan.slot]
        src = self.slots[plan.copy_from] if plan.copy_from is not None else dst
        dst.tokens = list(src.tokens[: plan.reuse])
        dst.owner = request_id

    def extend(self, slot: int, tokens: Sequence[int]) -> None:
        """Record tokens whose K/V the engine just wrote at the end of `slot`."""
        self.slots[slot].tokens.extend(tokens)

    def release(self, slot: int, keep: bool = True) -> None:
        """Free a slot at once; its tokens stay resident for reuse unless `keep` is False."""
        s = self.slots[slot]
        s.owner = None
        self._clock += 1
        s.last_used = self._clock
        if not keep:
            s.tokens = []
