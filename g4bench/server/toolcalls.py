"""Gemma 4 model output -> OpenAI message fields: content, reasoning_content, tool_calls.

Gemma 4 frames its output with two structures (TensorSharp's Gemma4OutputParser, seed 001):

    <|channel>thought\\n ...reasoning... <channel|>      -> `reasoning_content` (vLLM's field)
    <|tool_call>call:NAME{ARGS}<tool_call|>             -> one entry of `tool_calls`
    anything else                                        -> `content`

`OutputParser` is incremental: `feed(text_delta)` returns a list of OpenAI-shaped streaming deltas
(``{"content": ...}``, ``{"reasoning_content": ...}``, ``{"tool_calls": [{"index": i, "id": ...,
"type": "function", "function": {"name": ..., "arguments": "<json>"}}]}``) and `finish()` flushes
what is held back. Text that could be the start of a marker (``<|tool`` at the end of a delta) is
held until the next delta decides it. A tool call is emitted whole, as one delta, when its closing
marker arrives (its `index` counts the calls of this response, so a streaming client pairs deltas by
index as OpenAI's do). A call whose body does not parse (`gemma_args`) — or that never closes — is
surfaced verbatim as content, never raised and never turned into an empty call.

`parse_output(text)` (non-streaming) runs the same parser over the whole text and `assemble(deltas)`
folds a delta stream into the same `ParsedOutput`, so streaming and non-streaming agree by
construction; tests check that for every split point of every fixture.

Thinking: the channel name (`thought`) and one following newline are dropped. A request whose prompt
already opened the channel (``<|channel>thought\\n`` primed by the template) starts the parser with
`in_reasoning=True`. A stray ``<channel|>`` with no open channel is dropped. An unclosed channel at
the end of the output is reasoning. The thinking budget is enforced while sampling, through the
token mask (`g4bench.engine.thinking.ThinkingCap`).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from g4bench.server.gemma_args import STRING_DELIM, GemmaSyntaxError, parse_call_body

THINK_OPEN, THINK_CLOSE = "<|channel>", "<channel|>"
TOOL_OPEN, TOOL_CLOSE = "<|tool_call>", "<tool_call|>"
CHANNEL_HEADER = "thought"
_CONTENT_MARKERS = (THINK_OPEN, THINK_CLOSE, TOOL_OPEN)


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


@dataclass
class ParsedOutput:
    """A whole response's message fields (None where empty, as OpenAI leaves them)."""

    content: str | None = None
    reasoning_content: str | None = None
    tool_calls: list[dict] = field(default_factory=list)

    def message(self) -> dict:
        """The OpenAI assistant message dict (tool_calls omitted when there are none)."""
        out: dict = {"role": "assistant", "content": self.content}
        if self.reasoning_content is not None:
            out["reasoning_content"] = self.reasoning_content
        if self.tool_calls:
            out["tool_calls"] = self.tool_calls
        return out


def _partial_marker(text: str, markers: Iterable[str]) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of one of `markers`."""
    best = 0
    for marker in markers:
        for n in range(min(len(marker) - 1, len(text)), best, -1):
            if text.endswith(marker[:n]):
                best = n
                break
    return best


class OutputParser:
    """Text deltas in, OpenAI streaming deltas out (see the module docstring)."""

    def __init__(self, *, in_reasoning: bool = False, id_factory: Callable[[], str] = new_call_id) -> None:
        self._buf = ""
        self._state = "reasoning_header" if in_reasoning else "content"
        self._calls = 0
        self._new_id = id_factory

    def feed(self, text: str) -> list[dict]:
        self._buf += text
        out: list[dict] = []
        while self._step(out, final=False):
            pass
        return out

    def finish(self) -> list[dict]:
        """Flush at end of generation: held text goes to its channel, an unclosed call to content."""
        out: list[dict] = []
        while self._step(out, final=True):
            pass
        if self._buf:
            key = "reasoning_content" if self._state.startswith("reasoning") else "content"
            _emit(out, key, self._buf)
            self._buf = ""
        return out

    def _step(self, out: list[dict], final: bool) -> bool:
        """Consume what the buffer decides; True when progress was made and another step may follow."""
        buf = self._buf
        if self._state == "content":
            hits = [(buf.find(m), m) for m in _CONTENT_MARKERS if m in buf]
            if hits:
                pos, marker = min(hits)
                _emit(out, "content", buf[:pos])
                self._buf = buf[pos + len(marker) :]
                if marker == THINK_OPEN:
                    self._state = "reasoning_header"
                elif marker == TOOL_OPEN:
                    self._state = "tool"
                return True
            keep = 0 if final else _partial_marker(buf, _CONTENT_MARKERS)
            _emit(out, "content", buf[: len(buf) - keep])
            self._buf = buf[len(buf) - keep :]
            return False
        if self._state == "reasoning_header":
            header = CHANNEL_HEADER + "\n"
            if not final and len(buf) < len(header) and header.startswith(buf):
                return False  # could still be the header
            if buf.startswith(header):
                self._buf = buf[len(header) :]
            elif buf == CHANNEL_HEADER or (
                buf.startswith(CHANNEL_HEADER) and buf[len(CHANNEL_HEADER)].isspace()
            ):
                self._buf = buf[len(CHANNEL_HEADER) :]
            self._state = "reasoning"
            return True
        if self._state == "reasoning":
            pos = buf.find(THINK_CLOSE)
            if pos >= 0:
                _emit(out, "reasoning_content", buf[:pos])
                self._buf = buf[pos + len(THINK_CLOSE) :]
                self._state = "content"
                return True
            keep = 0 if final else _partial_marker(buf, (THINK_CLOSE,))
            _emit(out, "reasoning_content", buf[: len(buf) - keep])
            self._buf = buf[len(buf) - keep :]
            return False
        # "tool": wait for the closing marker (not one inside a string value), then parse the call
        pos = _call_end(buf)
        if pos < 0:
            if final:
                _emit(out, "content", TOOL_OPEN + buf)
                self._buf = ""
                self._state = "content"
            return False
        body, self._buf, self._state = buf[:pos], buf[pos + len(TOOL_CLOSE) :], "content"
        try:
            name, arguments = parse_call_body(body)
        except GemmaSyntaxError:
            _emit(out, "content", TOOL_OPEN + body + TOOL_CLOSE)
            return True
        call = {"index": self._calls, "id": self._new_id(), "type": "function",
                "function": {"name": name, "arguments": arguments}}  # fmt: skip
        self._calls += 1
        out.append({"tool_calls": [call]})
        return True


def _call_end(buf: str) -> int:
    """Position of the first ``<tool_call|>`` outside ``<|"|>...<|"|>`` and JSON ``"..."`` strings, or -1."""
    i, quote = 0, None  # quote: the delimiter of the string we are inside, if any
    while i < len(buf):
        if quote is None and buf.startswith(TOOL_CLOSE, i):
            return i
        if quote != '"' and buf.startswith(STRING_DELIM, i):
            quote = None if quote == STRING_DELIM else STRING_DELIM
            i += len(STRING_DELIM)
            continue
        c = buf[i]
        if quote == '"' and c == "\\":
            i += 2
            continue
        if quote != STRING_DELIM and c == '"':
            quote = None if quote == '"' else '"'
        i += 1
    return -1


def _emit(out: list[dict], key: str, text: str) -> None:
    """Append a text delta, merging with the previous delta of the same kind."""
    if not text:
        return
    if out and set(out[-1]) == {key}:
        out[-1][key] += text
    else:
        out.append({key: text})


def assemble(deltas: Iterable[dict]) -> ParsedOutput:
    """Fold streaming deltas into the whole message; content that is only whitespace beside tool
    calls becomes None (what vLLM returns for a pure tool-call turn)."""
    content, reasoning, calls = [], [], {}
    for d in deltas:
        content.append(d.get("content") or "")
        reasoning.append(d.get("reasoning_content") or "")
        for c in d.get("tool_calls", []):
            calls[c["index"]] = {k: v for k, v in c.items() if k != "index"}
    text, thought = "".join(content), "".join(reasoning)
    if calls and not text.strip():
        text = ""
    return ParsedOutput(
        content=text or None,
        reasoning_content=thought or None,
        tool_calls=[calls[i] for i in sorted(calls)],
    )


def parse_output(
    text: str, *, in_reasoning: bool = False, id_factory: Callable[[], str] = new_call_id
) -> ParsedOutput:
    """Non-streaming: the whole generated text -> content / reasoning_content / tool_calls."""
    parser = OutputParser(in_reasoning=in_reasoning, id_factory=id_factory)
    return assemble(parser.feed(text) + parser.finish())
