"""Host-side token masks for a batch of slots, computed while the device is busy.

Timeline of one constrained decode step (the scheduler hook this class is built for):

    host:   tokens_t back ──advance(t)──submit()──────────────wait()──dispatch sample(mask)──
    device:                  dispatch forward(t) ─── runs ────────────┘        runs ───────┘
                                           (mask for t+1 computed here, in a worker thread)

The decode step is split in two jitted calls: `forward` (token t -> logits, stays on the device)
and `sample(logits, bitmask)`. As soon as token t is on the host, the scheduler dispatches
`forward` (JAX returns at once), calls `advance(tokens)` for the constrained slots and `submit()`,
which fills the int32[S, W] bitmask in a worker thread (llguidance computes masks without the GIL).
`wait()` returns the filled bitmask; the scheduler passes it to `sample`. The host waits for
max(forward, mask) instead of their sum. A step with no constrained slot skips all of this and
calls the unmasked sampler: requests without a grammar pay nothing.

Rows of slots without a matcher are all -1 (every id allowed), so one masked sampler serves a
mixed batch. Two buffers alternate so the array handed to the device for step t is never
overwritten while step t+1's mask is being computed.
"""

from __future__ import annotations

import time
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np

from g4bench.engine.grammar import TokenConstraint, bitmask_words


class MaskPipeline:
    """Per-slot matchers of one batch and their next-step bitmask, computed off the main thread."""

    def __init__(self, slots: int, vocab_size: int) -> None:
        self.slots = slots
        self.vocab_size = vocab_size
        self._matchers: dict[int, TokenConstraint] = {}
        shape = (slots, bitmask_words(vocab_size))
        self._buffers = [np.full(shape, -1, np.int32), np.full(shape, -1, np.int32)]
        self._next = 0
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="g4bench-mask")
        self._pending: Future[np.ndarray] | None = None
        self.fill_s = 0.0  # worker time spent computing masks (all steps)
        self.wait_s = 0.0  # time `wait` blocked the caller (mask not ready when the device was)
        self.fills = 0  # masks computed (steps with a constrained slot)

    @property
    def active(self) -> bool:
        """Whether any slot is constrained (else the scheduler uses the unmasked sampler)."""
        return bool(self._matchers)

    def attach(self, slot: int, matcher: TokenConstraint) -> None:
        if matcher.vocab.vocab_size != self.vocab_size:
            raise ValueError(f"matcher vocab {matcher.vocab.vocab_size} != pipeline vocab {self.vocab_size}")
        self._require_idle()
        self._matchers[slot] = matcher

    def detach(self, slot: int) -> None:
        self._require_idle()
        self._matchers.pop(slot, None)

    def matcher(self, slot: int) -> TokenConstraint | None:
        return self._matchers.get(slot)

    def advance(self, tokens: dict[int, int]) -> None:
        """Feed each constrained slot the token it just produced (raises GrammarViolation)."""
        self._require_idle()
        for slot, token in tokens.items():
            m = self._matchers.get(slot)
            if m is not None:
                m.advance(token)

    def submit(self) -> Future[np.ndarray]:
        """Start computing every slot's next mask; returns the future of the int32[S, W] bitmask."""
        self._require_idle()
        buf = self._buffers[self._next]
        self._next ^= 1
        matchers = dict(self._matchers)
        self._pending = self._pool.submit(self._fill, buf, matchers)
        return self._pending

    def wait(self) -> np.ndarray:
        """The bitmask started by `submit` (re-raises what the worker raised)."""
        if self._pending is None:
            raise RuntimeError("wait() without submit()")
        future, self._pending = self._pending, None
        t = time.perf_counter()
        try:
            return future.result()
        finally:
            self.wait_s += time.perf_counter() - t

    def close(self) -> None:
        self._pool.shutdown(wait=True)

    def _fill(self, buf: np.ndarray, matchers: dict[int, TokenConstraint]) -> np.ndarray:
        t = time.perf_counter()
        buf.fill(-1)
        for slot, m in matchers.items():
            m.fill_bitmask(buf[slot])
        self.fill_s += time.perf_counter() - t
        self.fills += 1
        return buf

    def _require_idle(self) -> None:
        if self._pending is not None:
            raise RuntimeError("a mask computation is in flight: call wait() first")
