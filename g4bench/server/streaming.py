"""From sampled ids to text deltas, and from the engine thread to asyncio.

Stop strings are handled here, on the text side, but *in the engine thread*: the scheduler calls
`AsyncSink.on_token` for every sampled token, which detokenizes incrementally (UTF-8 safe), looks
for stop strings and returns True the moment one is complete, so the request ends on exactly that
token (nothing past it is generated or fed, which keeps the slot's tokens reusable by the next
turn). Text that could still be the start of a stop string is held back until it cannot.

Every event is handed to the request's asyncio.Queue with `loop.call_soon_threadsafe`:
("token", id, text_delta, logprob row or None) per token, then ("done", RequestResult, text_tail). If the event loop is
gone, `call_soon_threadsafe` raises and the scheduler fails (and frees) the request.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from g4bench.engine.logprobs import TokenLogprob
from g4bench.engine.scheduler import RequestResult
from g4bench.server.tokenizer import Decoder, IncrementalDecoder


class TextAssembler:
    """Incremental detokenization plus stop strings (OpenAI semantics: the stop string is not
    returned). Stop strings count only once more than `min_tokens` tokens exist."""

    def __init__(self, tokenizer: Decoder, stop: Sequence[str] = (), min_tokens: int = 0) -> None:
        self._decoder = IncrementalDecoder(tokenizer)
        self._stop = [s for s in stop if s]
        self._min_tokens = min_tokens
        self._held = ""  # released to nobody yet: may be the start of a stop string
        self._count = 0
        self.stopped = False

    def push(self, token: int) -> tuple[str, bool]:
        """One token in; (text to release, whether a stop string just completed)."""
        self._count += 1
        if self.stopped:
            return "", True
        text = self._held + self._decoder.push(token)
        if not self._stop or self._count <= self._min_tokens:
            self._held = ""
            return text, False
        return self._scan(text)

    def finish(self) -> str:
        """Whatever is still held when the request ends (unless a stop string ended it)."""
        if self.stopped:
            return ""
        text = self._held + self._decoder.flush()
        self._held = ""
        if not self._stop:
            return text
        cut = self._first_stop(text)
        return text if cut is None else text[:cut]

    def _scan(self, text: str) -> tuple[str, bool]:
        cut = self._first_stop(text)
        if cut is not None:
            self.stopped = True
            self._held = ""
            return text[:cut], True
        keep = self._partial_suffix(text)
        self._held = text[len(text) - keep :] if keep else ""
        return text[: len(text) - keep], False

    def _first_stop(self, text: str) -> int | None:
        hits = [i for i in (text.find(s) for s in self._stop) if i >= 0]
        return min(hits) if hits else None

    def _partial_suffix(self, text: str) -> int:
        """Length of the longest suffix of `text` that is a proper prefix of some stop string."""
        best = 0
        for s in self._stop:
            for n in range(min(len(s) - 1, len(text)), best, -1):
                if text.endswith(s[:n]):
                    best = n
                    break
        return best


class AsyncSink:
    """A `RequestSink` that feeds one request's asyncio.Queue from the engine thread."""

    def __init__(self, loop: asyncio.AbstractEventLoop, text: TextAssembler) -> None:
        self.loop = loop
        self.text = text
        self.queue: asyncio.Queue[tuple] = asyncio.Queue()

    def on_token(self, token: int, logprob: TokenLogprob | None = None) -> bool:
        delta, stopped = self.text.push(token)
        self.loop.call_soon_threadsafe(self.queue.put_nowait, ("token", token, delta, logprob))
        return stopped

    def on_finish(self, result: RequestResult) -> None:
        tail = self.text.finish() if result.finish_reason in ("stop", "length") else ""
        self.loop.call_soon_threadsafe(self.queue.put_nowait, ("done", result, tail))
