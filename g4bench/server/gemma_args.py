"""Gemma 4 tool-call argument syntax -> JSON text.

Gemma writes a call as ``<|tool_call>call:NAME{ARGS}<tool_call|>`` where ARGS is JSON-like but not
JSON (TensorSharp's Gemma4OutputParser, seed 001):

- keys are bare (``{city:Paris}``); quoted keys are accepted too;
- strings are wrapped in the ``<|"|>`` token (``<|"|>Paris, France<|"|>``), taken verbatim, no escapes;
  ordinary JSON strings (``"..."``) are accepted as well;
- the model often writes a string bare when it looks like an identifier: ``{invoice_id:INV-472}``,
  ``{path:src/main.py}``, ``{ids:[INV-1, INV-2]}``. Every bare value that is not a JSON number,
  ``true``, ``false`` or ``null`` is quoted (inside arrays too); numbers stay numbers;
- objects and arrays nest; a trailing comma before ``}`` / ``]`` is tolerated.

`parse_call_body("call:get_weather{city:Paris}")` returns ``("get_weather", '{"city": "Paris"}')``;
anything it cannot read raises `GemmaSyntaxError` naming the position, so the caller can surface the
call verbatim as content instead of inventing an empty call.
"""

from __future__ import annotations

import json
import re

STRING_DELIM = '<|"|>'
_NUMBER = re.compile(r"-?(?:0|[1-9]\d*)(?:\.\d+)?(?:[eE][+-]?\d+)?")
_NAME = re.compile(r"\s*call:([A-Za-z_][A-Za-z0-9_.\-]*)")
_BARE_KEY = re.compile(r"[^\s:{}\[\],\"]+")
_LITERALS = {"true": True, "false": False, "null": None}


class GemmaSyntaxError(ValueError):
    """The text is not a well-formed Gemma tool call / argument list."""


def parse_call_body(body: str) -> tuple[str, str]:
    """``call:NAME{ARGS}`` (the text between the tool-call markers) -> (name, arguments as JSON)."""
    m = _NAME.match(body)
    if m is None:
        raise GemmaSyntaxError(f"tool call does not start with 'call:<name>': {body[:40]!r}")
    reader = _Reader(body, m.end())
    reader.skip_ws()
    if reader.peek() != "{":
        raise GemmaSyntaxError(f"tool call {m.group(1)!r}: expected '{{' after the name at {reader.pos}")
    args = reader.value()
    reader.skip_ws()
    if reader.pos != len(body):
        raise GemmaSyntaxError(
            f"tool call {m.group(1)!r}: unexpected text after the arguments at {reader.pos}"
        )
    return m.group(1), json.dumps(args, ensure_ascii=False)


def gemma_to_json(text: str) -> str:
    """A Gemma-syntax value (usually an object) -> compact JSON text."""
    reader = _Reader(text, 0)
    value = reader.value()
    reader.skip_ws()
    if reader.pos != len(text):
        raise GemmaSyntaxError(
            f"unexpected text after the value at {reader.pos}: {text[reader.pos :][:20]!r}"
        )
    return json.dumps(value, ensure_ascii=False)


def bare_value(token: str) -> object:
    """A bare scalar: a JSON number / true / false / null as such, anything else as a string."""
    if token in _LITERALS:
        return _LITERALS[token]
    if _NUMBER.fullmatch(token):
        return json.loads(token)
    return token


class _Reader:
    """Recursive-descent reader over `text` from `pos`; each method leaves `pos` after what it read."""

    def __init__(self, text: str, pos: int) -> None:
        self.text = text
        self.pos = pos

    def peek(self) -> str:
        return self.text[self.pos] if self.pos < len(self.text) else ""

    def skip_ws(self) -> None:
        while self.pos < len(self.text) and self.text[self.pos].isspace():
            self.pos += 1

    def fail(self, what: str) -> GemmaSyntaxError:
        return GemmaSyntaxError(f"{what} at {self.pos}: {self.text[self.pos :][:20]!r}")

    def value(self) -> object:
        self.skip_ws()
        c = self.peek()
        if c == "{":
            return self.mapping()
        if c == "[":
            return self.array()
        if self.text.startswith(STRING_DELIM, self.pos) or c == '"':
            return self.string()
        return self.bare()

    def mapping(self) -> dict:
        self.pos += 1  # '{'
        out: dict = {}
        while True:
            self.skip_ws()
            if self.peek() == "}":
                self.pos += 1
                return out
            key = self.key()
            self.skip_ws()
            if self.peek() != ":":
                raise self.fail(f"expected ':' after key {key!r}")
            self.pos += 1
            out[key] = self.value()
            self.skip_ws()
            c = self.peek()
            if c == ",":
                self.pos += 1
            elif c != "}":
                raise self.fail("expected ',' or '}' in an object")

    def array(self) -> list:
        self.pos += 1  # '['
        out: list = []
        while True:
            self.skip_ws()
            if self.peek() == "]":
                self.pos += 1
                return out
            out.append(self.value())
            self.skip_ws()
            c = self.peek()
            if c == ",":
                self.pos += 1
            elif c != "]":
                raise self.fail("expected ',' or ']' in an array")

    def key(self) -> str:
        if self.text.startswith(STRING_DELIM, self.pos) or self.peek() == '"':
            return self.string()
        m = _BARE_KEY.match(self.text, self.pos)
        if m is None:
            raise self.fail("expected a key")
        self.pos = m.end()
        return m.group(0)

    def string(self) -> str:
        if self.text.startswith(STRING_DELIM, self.pos):
            start = self.pos + len(STRING_DELIM)
            end = self.text.find(STRING_DELIM, start)
            if end < 0:
                raise self.fail('unterminated <|"|> string')
            self.pos = end + len(STRING_DELIM)
            return self.text[start:end]
        try:
            value, end = json.JSONDecoder().raw_decode(self.text, self.pos)
        except json.JSONDecodeError as exc:
            raise self.fail(f"bad JSON string ({exc.msg})") from exc
        self.pos = end
        return value

    def bare(self) -> object:
        start = self.pos
        while self.pos < len(self.text) and self.text[self.pos] not in ",}]{[":
            self.pos += 1
        token = self.text[start : self.pos].strip()
        if not token:
            self.pos = start
            raise self.fail("expected a value")
        return bare_value(token)
