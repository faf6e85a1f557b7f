"""The split decode step for grammars and logprobs: masks on a worker thread, masked sampling, logprob rows.

The scheduler hands this class the batches in which some request has a grammar
(`GenerationParams.constraint`) or asked for logprobs; every other batch runs the engine's fused
`decode` and never reaches it (requests without either pay nothing). One decode step here:

    masks.submit()                      worker thread: each constrained slot's next bitmask
    engine.decode_logits(...)           dispatched at once (JAX is asynchronous): the forward runs
    masks.wait()                        meanwhile; the host then waits for whichever ends last
    engine.sample_logits(..., bitmask)  the mask applied on the device before the sampler
    engine.logprobs(logits, chosen, k)  only the chosen ids' logprobs and the top k come back

The matchers have consumed the tokens being fed before `decode` is called (the scheduler advances
them, failing a request whose token its grammar refuses). A request's first token is sampled at the
end of its prefill; `first_token` re-samples it from the prefill's logits under its first mask,
computed synchronously, and then attaches its matcher to the pipeline for the decode steps.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from g4bench.engine.grammar import TokenConstraint, bitmask_words
from g4bench.engine.logprobs import TokenLogprob
from g4bench.engine.mask_pipeline import MaskPipeline
from g4bench.engine.mixed import Piece


class AgentStep:
    """Grammar masks and logprobs around one engine (see the module docstring)."""

    def __init__(self, engine, max_slots: int, vocab_size: int) -> None:
        self.engine, self.max_slots, self.vocab_size = engine, max_slots, vocab_size
        self.masks: MaskPipeline | None = None  # created with the first constrained request

    def decode(
        self,
        tokens: np.ndarray,
        positions: np.ndarray,
        active: np.ndarray,
        logprobs: dict[int, int],
        pieces: Sequence[Piece] = (),
    ) -> tuple[np.ndarray, dict[int, TokenLogprob], dict[int, int]]:
        """One step for every slot -> (next ids i32[S], {slot: logprob row} for `logprobs` {slot: k},
        {slot: first token} of `pieces`). With pieces the forward is the engine's mixed step
        (`Engine.step(..., decode_logits=True)`), so prefill rides along in the same call."""
        masks = self.masks if self.masks is not None and self.masks.active else None
        if masks is not None:
            masks.submit()
        first: dict[int, int] = {}
        try:
            if pieces:
                logits, first = self.engine.step(tokens, positions, active, pieces, decode_logits=True)
            else:
                logits = self.engine.decode_logits(tokens, positions, active)
        finally:
            bitmask = masks.wait() if masks is not None else None
        out = self.engine.sample_logits(logits, positions, np.arange(self.max_slots), bitmask)
        return out, self._rows(logits, out, {slot: (slot, k) for slot, k in logprobs.items()}), first

    def first_token(
        self,
        slot: int,
        position: int,
        token: int,
        constraint: TokenConstraint | None,
        logprobs: int | None,
        logits=None,
    ) -> tuple[int, TokenLogprob | None]:
        """The first token of a request whose prefill just sampled `token` from position `position`:
        under its grammar's first mask when it has one (its matcher then joins the pipeline).
        `logits` [1, V]: the prefill's last logits (None: the engine's `last_logits`, the chunk
        policy's prefill call; the mixed step passes `engine.piece_logits(slot)`)."""
        logits = self.engine.last_logits if logits is None else logits
        if constraint is not None:
            bitmask = np.empty((1, bitmask_words(self.vocab_size)), np.int32)
            constraint.fill_bitmask(bitmask[0])
            token = int(self.engine.sample_logits(logits, np.array([position]), np.array([slot]), bitmask)[0])
            if self.masks is None:
                self.masks = MaskPipeline(self.max_slots, self.vocab_size)
            self.masks.attach(slot, constraint)
        if logprobs is None:
            return token, None
        return token, self._rows(logits, np.array([token]), {slot: (0, logprobs)})[slot]

    def release(self, slot: int) -> None:
        """The slot's request ended: its matcher leaves the pipeline."""
        if self.masks is not None:
            self.masks.detach(slot)

    def close(self) -> None:
        if self.masks is not None:
            self.masks.close()

    def _rows(
        self, logits, chosen: np.ndarray, wanted: dict[int, tuple[int, int]]
    ) -> dict[int, TokenLogprob]:
        """{slot: TokenLogprob} for `wanted` {slot: (row in logits, top k)}."""
        if not wanted:
            return {}
        picked, top_ids, top_lps = self.engine.logprobs(logits, chosen, max(k for _, k in wanted.values()))
        rows = {}
        for slot, (i, k) in wanted.items():
            top = tuple((int(t), float(lp)) for t, lp in zip(top_ids[i][:k], top_lps[i][:k], strict=True))
            rows[slot] = TokenLogprob(int(chosen[i]), float(picked[i]), top)
        return rows
