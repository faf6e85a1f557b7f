"""One chat request's generated ids -> OpenAI choice updates: delta (content / reasoning_content /
tool_calls) plus the logprobs of the tokens behind it; the server's streaming and non-streaming
chat paths share it (app.py feeds it the stop-string-checked text of each token, `push_text`).

    ids ──piece(id) bytes──> UTF-8 incremental decoder ──text──> OutputParser ──deltas──┐
    logprob rows (TokenLogprob) ── held until a delta goes out ────────────────────────┴─> updates

Text comes from `piece(id) -> bytes`, not from `Tokenizer.decode`, because the markers the parser
needs (``<|tool_call>``, ``<channel|>``) are special tokens in a real vocabulary and
`decode(skip_special_tokens=True)` drops them; `pieces_from_vocab` builds `piece` from the
engine's `GrammarVocab` (bytes per id, the markers spelled out, other special ids empty).

An update is ``{"delta": {...}, "logprobs": {"content": [...]} | None}`` - the shape of one
streaming chunk's choice. Logprob rows are attached to the next update that carries text, so a
token held back as a possible marker reports its logprob with the text it became; whatever is left
at the end goes out with the last update. `finish_reason(engine_reason)` is ``"tool_calls"`` when
the response carried calls and the engine stopped on its own (OpenAI's convention).
"""

from __future__ import annotations

import codecs
from collections.abc import Callable

from g4bench.engine.grammar import GrammarVocab
from g4bench.engine.logprobs import TokenLogprob, chat_logprobs
from g4bench.server.toolcalls import OutputParser, ParsedOutput, assemble


def pieces_from_vocab(vocab: GrammarVocab) -> Callable[[int], bytes]:
    """id -> the bytes it writes into the text the parser reads (markers included)."""
    markers = {i: m.encode() for m, i in vocab.marker_ids.items()}

    def piece(token: int) -> bytes:
        return markers.get(token) or (
            vocab.token_bytes[token] if 0 <= token < len(vocab.token_bytes) else b""
        )

    return piece


class AgentOutput:
    """Ids (and optional logprob rows) in, OpenAI choice updates out; `result()` for non-streaming."""

    def __init__(
        self,
        piece: Callable[[int], bytes],
        *,
        in_reasoning: bool = False,
        top_logprobs: int | None = None,
        id_factory: Callable[[], str] | None = None,
    ) -> None:
        self._piece = piece
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._parser = OutputParser(
            in_reasoning=in_reasoning, **({"id_factory": id_factory} if id_factory else {})
        )
        self._top = top_logprobs  # None: logprobs not requested
        self._rows: list[TokenLogprob] = []
        self._deltas: list[dict] = []

    def push(self, token: int, row: TokenLogprob | None = None) -> list[dict]:
        return self.push_text(self._utf8.decode(self._piece(token)), row)

    def push_text(self, text: str, row: TokenLogprob | None = None) -> list[dict]:
        """One token's text, already decoded (the server's stop-string-aware assembler)."""
        if self._top is not None:
            if row is None:
                raise ValueError("logprobs were requested but no logprob row came with the token")
            self._rows.append(row)
        return self._updates(self._parser.feed(text))

    def tail(self, text: str) -> list[dict]:
        """Text released when the request ended (held back for a stop string): no token of its own."""
        return self._updates(self._parser.feed(text))

    def finish(self) -> list[dict]:
        deltas = self._parser.feed(self._utf8.decode(b"", final=True)) + self._parser.finish()
        updates = self._updates(deltas)
        if self._rows:  # tokens whose text never surfaced (e.g. EOS): report them on an empty delta
            updates.append({"delta": {}, "logprobs": self._take_logprobs()})
        return updates

    def result(self) -> ParsedOutput:
        """The whole message so far (call after `finish` for the final one)."""
        return assemble(self._deltas)

    def finish_reason(self, engine_reason: str) -> str:
        return "tool_calls" if engine_reason == "stop" and self.result().tool_calls else engine_reason

    def logprobs_all(self, updates: list[dict]) -> dict | None:
        """Non-streaming ``choices[0].logprobs``: the updates' entries concatenated."""
        if self._top is None:
            return None
        return {"content": [e for u in updates if u["logprobs"] for e in u["logprobs"]["content"]]}

    def _updates(self, deltas: list[dict]) -> list[dict]:
        self._deltas.extend(deltas)
        updates = []
        for delta in deltas:
            updates.append({"delta": delta, "logprobs": self._take_logprobs() if self._rows else None})
        return updates

    def _take_logprobs(self) -> dict:
        rows, self._rows = self._rows, []
        return chat_logprobs(rows, self._piece, self._top or 0)
