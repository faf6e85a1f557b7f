"""The scheduler's decode under speculative decoding (`Scheduler(engine, spec=SpecDecoder(...))`).

`Scheduler.step` calls `_spec_step` in place of the decode call, then the chunk policy's prefill
step (speculation runs the chunk policy: a verify call needs every position's logits, which the
mixed step's pieces do not return). One turn:

1. the running requests with a token to feed split in two. Those with a grammar or logprobs decode
   as without speculation (`_run_decode`, the split step: masks, logprob rows); the others are
   one speculative round;
2. each speculative request becomes a `SpecRow`: its context (the slot's recorded tokens and the
   token to feed), k capped so the round never writes past its last position
   (`max_tokens − outputs − 1`; 0 leaves a plain decode row in the same call), and the rows of the
   round where EOS is still banned (`min_tokens`). Paged: the blocks for k + 1 positions are held;
3. `SpecDecoder.round` (spec_batch.py): draft, one verify call, acceptance;
4. delivery: the fed token is recorded, then the emitted tokens are handed over one by one, each
   recorded once the next one follows it (its K/V was written by this verify), until the request
   ends. So a slot's recorded tokens stay exactly those with valid K/V, and a finished
   conversation stays resident as without speculation.

Observers get `on_step` per round and `on_spec(drafted, accepted, rows)` (the server's /metrics).
An exception from the round fails its requests, as a failed decode does.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from g4bench.engine.spec_batch import SpecDecoder, SpecRow

log = logging.getLogger("g4bench.engine.scheduler")


class SpecTurn:
    """`Scheduler`'s speculative decode (a mixin: it uses the scheduler's table, queues and engine)."""

    # provided by Scheduler
    spec: SpecDecoder | None
    table: Any
    paged: bool
    max_slots: int
    steps: int
    clock: Callable[[], float]
    _running: dict[int, Any]

    if TYPE_CHECKING:

        def _advance_constraints(self, batch: list) -> list: ...
        def _run_decode(self, batch: list, split: bool) -> None: ...
        def _deliver(self, req: Any, token: int, now: float, row: Any = None) -> None: ...
        def _finish(self, req: Any, reason: str, error: str | None = None, keep: bool = True) -> None: ...
        def _notify(self, hook: str, *args: Any) -> None: ...

    def _spec_step(self) -> None:
        assert self.spec is not None
        plain: list[Any] = []
        batch: list[Any] = []
        for r in self._running.values():
            if r.next_token is not None:
                masked = r.params.constraint is not None or r.params.logprobs is not None
                (plain if masked else batch).append(r)
        plain = self._advance_constraints(plain)
        if plain:
            self._run_decode(plain, True)
        if not batch:
            return
        try:
            rows = [self._spec_row(r) for r in batch]
            outcomes = self.spec.round(rows)
        except Exception as exc:
            log.exception("speculative round failed; failing its %d requests", len(batch))
            for r in batch:
                self._finish(r, "error", error=f"speculative decode failed: {exc}", keep=False)
            return
        self.steps += 1
        self._notify("on_step", len(batch), self.max_slots)
        self._notify(
            "on_spec", sum(o.drafted for o in outcomes), sum(o.kept for o in outcomes), len(outcomes)
        )
        now = self.clock()
        for r, o in zip(batch, outcomes, strict=True):
            self.table.extend(r.slot, [r.next_token])
            r.next_token = None
            for i, token in enumerate(o.emitted):
                if i:
                    self.table.extend(r.slot, [o.emitted[i - 1]])
                self._deliver(r, int(token), now)
                if r.id not in self._running:
                    break  # it ended here: the rest of the round's tokens are dropped

    def _spec_row(self, r: Any) -> SpecRow:
        assert self.spec is not None and r.slot is not None
        context = [*self.table.slots[r.slot].tokens, r.next_token]
        p = r.params
        k = max(0, min(self.spec.k, p.max_tokens - len(r.output) - 1))
        if self.paged:
            self.table.prepare(r.slot, len(context) - 1, k + 1)
        # the token of verify row j is output number len(output) + j: EOS is banned below min_tokens
        banned = max(0, p.min_tokens - len(r.output))
        return SpecRow(r.slot, r.id, context, k, p.sampling, eos_banned_rows=banned)
