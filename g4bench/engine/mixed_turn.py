"""The scheduler's loop turn under the mixed policy: decode rows and budgeted prefill pieces in one call.

`Scheduler.step` (scheduler.py) calls `_mixed_step` after cancellations and admission when the
engine runs the mixed policy (`EngineConfig.policy`, paged layouts). One turn:

1. the decode batch: every running request with a token to feed (as the chunk policy's decode);
2. the plan: walking the admitted prompts in admission order, each takes the next chunk of its
   prompt (at most `chunk_size` tokens) while the token budget lasts — `max_batched_tokens` minus
   one token per decode row, counted in piece rows of `engine.piece_tokens` (a prompt always
   advances by at least one row, so a full decode batch never starves prefill), and at most
   `SAMPLED_PER_STEP` prompts finishing (the call's first-token rows, mixed.py). A prompt not yet
   placed is placed now (`BlockCache.begin` matches its cached prefix), unless it shares whole
   blocks with a prompt still computing them: it then waits, and reuses those blocks once they
   are written, as a prompt admitted behind another does under the chunk policy;
3. one `engine.step(tokens, positions, active, pieces)` (or, with a grammar or logprobs in the
   decode batch, `AgentStep.decode(..., pieces)`, the same call with the decode logits left on the
   device for the masked sampler);
4. delivery: the decode tokens, then each piece's tokens recorded in its slot; a prompt's last
   piece delivers its first token (re-sampled under its first grammar mask, with logprobs, by
   `AgentStep.first_token` from `engine.piece_logits(slot)`).

An exception from the call fails the requests in it (decode and prefill), as a failed decode does;
the loop keeps running.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import numpy as np

from g4bench.engine.mixed import SAMPLED_PER_STEP, Piece, piece_rows

log = logging.getLogger("g4bench.engine.scheduler")


class MixedTurn:
    """`Scheduler`'s mixed-policy turn (a mixin: it uses the scheduler's queues, table and engine)."""

    # provided by Scheduler
    engine: Any
    table: Any
    agent: Any
    clock: Callable[[], float]
    paged: bool
    chunk_size: int
    max_batched_tokens: int
    _prefilling: Any

    if TYPE_CHECKING:

        def _decode_batch(self) -> tuple[list, bool]: ...
        def _decode_inputs(self, batch: list) -> tuple[np.ndarray, np.ndarray, np.ndarray]: ...
        def _wanted_logprobs(self, batch: list) -> dict[int, int]: ...
        def _run_decode(self, batch: list, split: bool) -> None: ...
        def _deliver_decode(self, batch: list, out: np.ndarray, rows: dict) -> None: ...
        def _deliver(self, req: Any, token: int, now: float, row: Any = None) -> None: ...
        def _finish(self, req: Any, reason: str, error: str | None = None, keep: bool = True) -> None: ...

    def _mixed_step(self) -> None:
        batch, split = self._decode_batch()
        plan = self._plan_pieces(len(batch))
        if not plan:
            if batch:
                self._run_decode(batch, split)
            return
        pieces = [self._piece(req, n) for req, n in plan]
        try:
            tokens, positions, active = self._decode_inputs(batch)
            for req, n in plan:
                self.table.prepare(req.slot, req.prefilled, n)
            if split:
                wanted = self._wanted_logprobs(batch)
                out, rows, first = self.agent.decode(tokens, positions, active, wanted, pieces)
            else:
                out, first = self.engine.step(tokens, positions, active, pieces)
                rows = {}
        except Exception as exc:
            log.exception(
                "mixed step failed; failing its %d decode and %d prefill requests", len(batch), len(plan)
            )
            for r in [*batch, *(req for req, _ in plan)]:
                self._finish(r, "error", error=f"engine step failed: {exc}", keep=False)
            return
        if batch:
            self._deliver_decode(batch, out, rows)
        for (req, n), piece in zip(plan, pieces, strict=True):
            self._after_piece(req, n, piece, first)

    def _plan_pieces(self, decode_rows: int) -> list[tuple[Any, int]]:
        """[(request, tokens of its next chunk)] for this call, in admission order (see the module
        docstring, item 2)."""
        piece = self.engine.piece_tokens
        rows_left = max(1, (self.max_batched_tokens - decode_rows) // piece)
        plan: list[tuple[Any, int]] = []
        finishing = 0
        for req in list(self._prefilling):
            if rows_left <= 0:
                break
            if self.paged and not req.placed:
                if self._waits_for_shared_blocks(req):
                    continue
                reuse = self.table.begin(req.slot, req.prompt, req.params.max_tokens)
                if reuse is None:
                    break  # not enough free or evictable blocks yet: running requests will free some
                req.placed, req.prefilled, req.reused = True, reuse, reuse
            n = min(self.chunk_size, len(req.prompt) - req.prefilled, rows_left * piece)
            if req.prefilled + n == len(req.prompt):
                if finishing == SAMPLED_PER_STEP:
                    continue  # this call's first-token rows are taken: it finishes in the next one
                finishing += 1
            plan.append((req, n))
            rows_left -= piece_rows(n, piece)
        return plan

    def _waits_for_shared_blocks(self, req: Any) -> bool:
        """Whether an unplaced prompt shares whole blocks with a placed prompt that has not yet
        written them (placing it now would compute them twice)."""
        bs = self.table.bs
        head = req.prompt[:bs]
        for other in self._prefilling:
            if other is req or not other.placed or len(other.prompt) < bs or other.prompt[:bs] != head:
                continue
            common = next(
                (i for i, (a, b) in enumerate(zip(req.prompt, other.prompt, strict=False)) if a != b),
                min(len(req.prompt), len(other.prompt)),
            )
            shared = min(common, len(req.prompt) - 1) // bs * bs  # match() leaves ≥ 1 token to compute
            if shared and other.prefilled < shared:
                return True
        return False

    def _piece(self, req: Any, n: int) -> Piece:
        tokens = req.prompt[req.prefilled : req.prefilled + n]
        sampling = None
        if req.prefilled + n == len(req.prompt):
            req.suppressing = req.params.min_tokens > 0
            sampling = replace(req.params.sampling, suppress_eos=req.suppressing)
        return Piece(req.slot, tokens, req.prefilled, sampling)

    def _after_piece(self, req: Any, n: int, piece: Piece, first: dict[int, int]) -> None:
        """Record the piece's tokens; a prompt's last piece delivers the request's first token."""
        self.table.extend(req.slot, piece.tokens)
        req.prefilled += n
        if piece.sampling is None:
            return
        self._prefilling.remove(req)
        token, row = first[req.slot], None
        p = req.params
        if p.constraint is not None or p.logprobs is not None:
            try:
                logits = self.engine.piece_logits(req.slot)
                token, row = self.agent.first_token(
                    req.slot, req.prefilled - 1, token, p.constraint, p.logprobs, logits=logits
                )
            except Exception as exc:
                log.exception("first token failed for request %d", req.id)
                self._finish(req, "error", error=f"first token failed: {exc}", keep=False)
                return
        self._deliver(req, int(token), self.clock(), row)
