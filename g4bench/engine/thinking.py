"""The thought channel on the mask path: a thinking budget, and a grammar armed after the channel.

Gemma 4 reasons inside ``<|channel>thought\\n ... <channel|>``. TensorSharp (seed 001) measured two
rules that `ThinkingCap` enforces through the same per-step bitmask as grammars (so the scheduler
needs no token substitution and greedy / sampled decoding both obey it):

- Budget: counted from ``<|channel>`` (or from the first token when the prompt primed the channel,
  `in_channel=True`). Past `budget` tokens the channel is closed at the first token that ends a
  line; at `2 * budget` it is closed regardless. Closing means the next steps' masks allow only the
  tokens spelling ``<channel|>`` (one special token in a real vocabulary, its 10 bytes in the byte
  vocabulary). `budget_for_max_tokens` is the thinking-off cap: a quarter of max_tokens, at most 64.
  ``budget=None`` never forces a close.
- Grammar after the channel: `then` (a `GrammarMatcher`) is dormant while the channel is open and
  enforces from the first token after ``<channel|>`` - TensorSharp's "JSON grammar arms after the
  thought channel closes". With thinking on, the template primes ``<|channel>thought\n`` and the
  cap starts `in_channel=True`; with thinking off a grammar enforces from the first token (which
  excludes ``<|channel>``), and without a grammar a channel the model opens itself is watched for
  and capped.

State: "before" (no channel yet, no grammar) -> "inside" -> "closing" (forced marker ids) -> "after".
"""

from __future__ import annotations

import numpy as np

from g4bench.engine.grammar import GrammarVocab, TokenConstraint, bitmask_words, unpack_bitmask

THINK_OPEN, THINK_CLOSE = b"<|channel>", b"<channel|>"


def budget_for_max_tokens(max_tokens: int) -> int:
    return max(1, min(64, max_tokens // 4))


def _spelling(vocab: GrammarVocab, marker: bytes) -> list[int]:
    """Ids that write `marker`: its special token, else one id per byte (byte vocabulary)."""
    token = vocab.marker_ids.get(marker.decode())
    if token is not None:
        return [token]
    by_bytes = {b: i for i, b in enumerate(vocab.token_bytes) if len(b) == 1}
    return [by_bytes[bytes([b])] for b in marker]


class ThinkingCap:
    """Per-request mask source for the thought channel (see the module docstring)."""

    def __init__(
        self,
        vocab: GrammarVocab,
        budget: int | None,
        *,
        in_channel: bool = False,
        then: TokenConstraint | None = None,
    ) -> None:
        self.vocab = vocab
        self.budget = budget
        self.then = then
        # With a grammar and no primed channel the grammar rules from the first token.
        self.state = "inside" if in_channel else ("after" if then is not None else "before")
        self.count = 0  # tokens generated inside the channel
        self._tail = b""
        self._close = _spelling(vocab, THINK_CLOSE)
        self._forced: list[int] = []

    def fill_bitmask(self, out: np.ndarray) -> None:
        if out.shape != (bitmask_words(self.vocab.vocab_size),):
            raise ValueError(
                f"bitmask must be int32[{bitmask_words(self.vocab.vocab_size)}], got {out.shape}"
            )
        if self.state == "closing":
            out.fill(0)
            token = self._forced[0]
            out[token // 32] = np.uint32(1 << (token % 32)).view(np.int32)
        elif self.state == "after" and self.then is not None:
            self.then.fill_bitmask(out)
        else:
            out.fill(-1)

    def next_mask(self) -> np.ndarray:
        words = np.empty(bitmask_words(self.vocab.vocab_size), np.int32)
        self.fill_bitmask(words)
        return unpack_bitmask(words, self.vocab.vocab_size)

    def advance(self, token: int) -> None:
        if self.state == "closing":
            if token != self._forced[0]:
                raise ValueError(
                    f"token {token} while closing the thought channel (expected {self._forced[0]})"
                )
            self._forced.pop(0)
            if not self._forced:
                self.state = "after"
            return
        if self.state == "after":
            if self.then is not None:
                self.then.advance(token)
            return
        piece = self.vocab.token_bytes[token] or self._marker_bytes(token)
        self._tail = (self._tail + piece)[-len(THINK_OPEN) :]
        if self.state == "before":
            if self._tail.endswith(THINK_OPEN):
                self.state = "inside"
            return
        self.count += 1
        if self._tail.endswith(THINK_CLOSE):
            self.state = "after"
        elif self.budget is not None and (
            self.count >= 2 * self.budget or (self.count >= self.budget and piece.endswith(b"\n"))
        ):
            self.state, self._forced = "closing", list(self._close)

    def _marker_bytes(self, token: int) -> bytes:
        for marker, marker_id in self.vocab.marker_ids.items():
            if marker_id == token:
                return marker.encode()
        return b""

    def is_done(self) -> bool:
        """The grammar after the channel finished (never, without a grammar)."""
        return self.state == "after" and self.then is not None and self.then.is_done()
