"""Budget-aware grammars: a constrained reply that always closes within `max_tokens`, and JSON numbers
that a float64 / int64 can hold.

`BudgetedMatcher(matcher, budget)` wraps one request's `GrammarMatcher` (engine side, token ids only).
Data flow per step, inside `fill_bitmask` (the mask pipeline's worker thread):

    matcher.fill_bitmask(row)                      what the grammar allows
    row &= number_mask(lexer state)                no 18th mantissa digit, no 3rd exponent digit
    left = budget - tokens advanced                the tokens this reply may still write
    if left <= upper bound of closing + growth:    near the end: measure the closing exactly
        plan = closing_plan(matcher)               greedy shortest completion, single-byte ids
        if left <= len(plan) + growth:             closing mode (sticky): only plan[0] (or EOS
            row = {plan[0]}                        when the output is already complete)

`closing_plan` walks a copy of the matcher: at each position it tries bytes in a closing-first
order (``"`` ``}`` ``]`` ``,`` ``:`` ``0`` ``t`` ...; the grammar refuses any byte with no valid
completion, so the walk never dead-ends) until the grammar accepts. Its length is the closing cost
in tokens of this vocabulary (one single-byte token per byte; the model's own tokens can only be
as many or fewer). `growth` bounds how much one sampled token can raise that cost: the longest
shortest-instance of any sub-schema (`schema_growth`) times the most JSON punctuation bytes one
token of the vocabulary holds. So with `left > len(plan) + growth`, any token the grammar allows
leaves a reply that can still close in the tokens after it, and closing mode, once entered,
writes exactly the plan. `forced` records that the close was forced (the server reports
`finish_reason: "length"` then). `min_tokens(matcher)` is the cost from the start: a `max_tokens`
below it is refused before generating.

The plan is recomputed only while `left` is within `upper + growth` of it, where `upper` is the
last measured cost plus `growth` per token since: far from the end a step costs one AND of the
number mask.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np

from g4bench.engine.grammar import GrammarError, GrammarMatcher, GrammarVocab, bitmask_words

CLOSE_ORDER = b'"}],:0tfn{[<'  # tried first at every position of the closing walk
PUNCT = frozenset(b'{}[]":,\\')
MAX_PLAN = 4096  # a closing longer than this is a grammar bug, not a budget question
MANTISSA_DIGITS, EXPONENT_DIGITS = 17, 2  # float64 round-trips 17 digits; |exponent| <= 99
INT_DIGITS = 18  # any 18-digit integer fits an int64


@dataclass(frozen=True)
class VocabTables:
    """Per-vocabulary tables, built once: single-byte ids, digit counts, the bound number masks."""

    byte_ids: dict[int, int]  # byte -> an id whose text is that byte alone
    punct_per_token: int  # the most JSON punctuation bytes in one token
    no_digit: np.ndarray  # int32[W]: ids whose text has no digit
    no_dot: np.ndarray  # int32[W]: ids whose text has no '.', 'e' or 'E'
    order: np.ndarray  # int64[K]: the ids the closing walk tries, closing-first (CLOSE_ORDER)

    @staticmethod
    def build(vocab: GrammarVocab) -> VocabTables:
        byte_ids: dict[int, int] = {}
        n = vocab.vocab_size
        digit = np.zeros(n, bool)
        dot = np.zeros(n, bool)
        punct = 1
        for i, text in enumerate(vocab.token_bytes):
            if len(text) == 1:
                byte_ids.setdefault(text[0], i)
            if text:
                digit[i] = any(48 <= b <= 57 for b in text)
                dot[i] = any(b in b".eE" for b in text)
                punct = max(punct, sum(b in PUNCT for b in text))
        order = [byte_ids[b] for b in CLOSE_ORDER if b in byte_ids] + list(vocab.marker_ids.values())
        order += [i for b, i in sorted(byte_ids.items()) if b not in CLOSE_ORDER]
        return VocabTables(byte_ids, punct, _pack(~digit, n), _pack(~dot, n), np.array(order, np.int64))


def _pack(allowed: np.ndarray, n: int) -> np.ndarray:
    words = np.zeros(bitmask_words(n) * 32, bool)
    words[:n] = allowed
    return np.packbits(words, bitorder="little").view(np.int32).copy()


class NumberLexer:
    """Where the JSON text stands with respect to numbers: outside strings, the digits of the
    current number's mantissa and exponent (fed the text of each token)."""

    def __init__(self) -> None:
        self.in_string = self.escape = False
        self.mantissa = -1  # -1: not in a number; else digits so far
        self.exponent = -1  # -1: not in an exponent; else digits so far

    def feed(self, text: bytes) -> None:
        for b in text:
            if self.in_string:
                if self.escape:
                    self.escape = False
                elif b == 92:  # backslash
                    self.escape = True
                elif b == 34:
                    self.in_string = False
            elif b == 34:
                self.in_string, self.mantissa, self.exponent = True, -1, -1
            elif 48 <= b <= 57:
                if self.exponent >= 0:
                    self.exponent += 1
                else:
                    self.mantissa = max(self.mantissa, 0) + 1
            elif b in b"eE" and self.mantissa >= 0:
                self.exponent = 0
            elif b in b"+-.":
                if b == 45 and self.exponent < 0 and self.mantissa < 0:
                    self.mantissa = 0  # a leading minus starts a number
            else:
                self.mantissa = self.exponent = -1

    def limit(self, tables: VocabTables, out: np.ndarray) -> None:
        """AND into `out` the bans this position needs (no digit past the bound, no '.'/'e' that
        would need a digit the bound forbids)."""
        if self.exponent >= EXPONENT_DIGITS or (self.exponent < 0 and self.mantissa >= MANTISSA_DIGITS):
            np.bitwise_and(out, tables.no_digit, out=out)
        if self.exponent < 0 and self.mantissa >= MANTISSA_DIGITS:
            np.bitwise_and(out, tables.no_dot, out=out)


def closing_plan(matcher: GrammarMatcher, tables: VocabTables) -> list[int]:
    """The single-byte ids of a shortest-first completion from the matcher's state ([] when the
    output is already complete). Raises GrammarError if none is found within MAX_PLAN bytes.
    Per position: one mask of a copy of the matcher, the first allowed id in `tables.order`."""
    m = matcher._m.deep_copy()
    plan: list[int] = []
    while not m.is_accepting():
        bits = np.unpackbits(np.frombuffer(m.compute_bitmask(), np.uint8), bitorder="little")
        allowed = tables.order[bits[tables.order] == 1]
        if not len(allowed):
            raise GrammarError("the grammar has no completion from here (no single-byte continuation)")
        token = int(allowed[0])
        if not m.consume_token(token):
            raise GrammarError(f"the grammar refused its own allowed id {token}: {m.get_error()}")
        plan.append(token)
        if len(plan) > MAX_PLAN:
            raise GrammarError(f"the shortest completion is longer than {MAX_PLAN} tokens")
    return plan


def min_tokens(matcher: GrammarMatcher, tables: VocabTables) -> int:
    """The tokens of the shortest completion from the matcher's state (the start, for a fresh one)."""
    return len(closing_plan(matcher, tables))


def schema_growth(schema: object, depth: int = 0) -> int:
    """An upper bound, in bytes, on how much one byte of output can raise the closing cost inside
    `schema`: entering a sub-schema (a key chosen, a value or an item begun) adds at most its
    longest shortest-instance plus the longest key and separators. The schema itself is not
    counted: its own shortest instance is already the cost from the start. Schemas it cannot
    bound ($ref, patterns) count as 64 bytes."""
    if not isinstance(schema, dict) or depth > 32:
        return 64
    keys = [len(json.dumps(k)) for k in (schema.get("properties") or {})]
    here = max(keys, default=0) + 4
    return max([here, *(max(_min_len(s) + here, schema_growth(s, depth + 1)) for s in _subschemas(schema))])


def _subschemas(schema: dict) -> list:
    out = list((schema.get("properties") or {}).values())
    for key in ("items", "additionalProperties", "not"):
        if isinstance(schema.get(key), dict):
            out.append(schema[key])
    for key in ("anyOf", "oneOf", "allOf", "prefixItems"):
        out += [s for s in schema.get(key) or [] if isinstance(s, dict)]
    return out


def _min_len(schema: object) -> int:
    """A generous upper bound on the compact length of the shortest instance of `schema`."""
    if not isinstance(schema, dict):
        return 64
    if "const" in schema:
        return len(json.dumps(schema["const"]))
    if "enum" in schema:
        return max(len(json.dumps(v)) for v in schema["enum"]) if schema["enum"] else 4
    if "$ref" in schema or "pattern" in schema or "format" in schema:
        return 64
    branches = schema.get("anyOf") or schema.get("oneOf")
    if branches:
        return max(_min_len(b) for b in branches)
    kind = schema.get("type", "object" if "properties" in schema else None)
    kinds = kind if isinstance(kind, list) else [kind]
    return max(_min_len_of(k, schema) for k in kinds)


def _min_len_of(kind: str | None, schema: dict) -> int:
    if kind == "object":
        props = schema.get("properties") or {}
        req = [k for k in schema.get("required") or [] if isinstance(k, str)]
        return 2 + sum(len(json.dumps(k)) + 2 + _min_len(props.get(k, {})) for k in req)
    if kind == "array":
        n = int(schema.get("minItems") or 0)
        return 2 + n * (_min_len(schema.get("items", {})) + 1)
    if kind == "string":
        return 2 + 4 * int(schema.get("minLength") or 0)  # 4: a \uXXXX-free UTF-8 character at most
    if kind in ("number", "integer"):
        bounds = [
            schema.get(k)
            for k in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf")
        ]
        return 2 + max([len(repr(b)) for b in bounds if isinstance(b, int | float)] + [1])
    if kind in ("boolean", "null"):
        return 5
    return 2  # any value: 0


class BudgetedMatcher:
    """A `GrammarMatcher` that never lets a reply outgrow `budget` tokens (see the module docstring)."""

    def __init__(self, matcher: GrammarMatcher, budget: int, growth: int, tables: VocabTables) -> None:
        self.inner, self.vocab, self.budget, self.tables = matcher, matcher.vocab, budget, tables
        self.growth = growth * tables.punct_per_token
        self.used = 0
        self.forced = False  # closing mode was entered: the reply is closed by the plan
        self.plans = 0  # closing walks computed (diagnostics)
        self._lexer = NumberLexer()
        self._plan: list[int] = []  # the greedy completion from the current state, when fresh
        self._plan_fresh = False
        self.min_tokens = min_tokens(matcher, tables)
        self._upper = self.min_tokens  # an upper bound on the closing cost now
        if self.min_tokens > budget:
            raise GrammarError(
                f"max_tokens ({budget}) is too small for any output this grammar allows: the shortest "
                f"takes {self.min_tokens} tokens"
            )

    def fill_bitmask(self, out: np.ndarray) -> None:
        left = self.budget - self.used
        if not self.forced and left <= self._upper + 2 * self.growth:
            plan = self._plan if self._plan_fresh else closing_plan(self.inner, self.tables)
            self.plans += not self._plan_fresh
            self._plan, self._plan_fresh = plan, True
            self._upper = len(plan)
            if left <= len(plan) + self.growth:
                self.forced = True
        if self.forced:
            out.fill(0)
            ids = self._plan[:1] or sorted(self.vocab.tokenizer.eos_tokens)
            for i in ids:
                out[i // 32] |= np.int32(np.uint32(1 << (i % 32)).view(np.int32))
            return
        self.inner.fill_bitmask(out)
        self._lexer.limit(self.tables, out)

    def advance(self, token: int) -> None:
        self.inner.advance(token)
        self.used += 1
        self._upper += self.growth
        self._lexer.feed(self.vocab.token_bytes[token] if 0 <= token < len(self.vocab.token_bytes) else b"")
        if self._plan_fresh:
            # the greedy walk is deterministic: from the next state it continues with plan[1:]
            follows = bool(self._plan) and token == self._plan[0]
            if self.forced and not follows and self._plan:
                raise RuntimeError(f"closing mode sampled {token}, not the planned {self._plan[0]}")
            self._plan, self._plan_fresh = self._plan[1:], follows

    def is_done(self) -> bool:
        return self.inner.is_done()

    def is_accepting(self) -> bool:
        return self.inner.is_accepting()


def request_growth(response_format: dict | None, tools: list[dict] | None, tool_choice: object) -> int:
    """`schema_growth` of what `compile_grammar` constrains for these OpenAI request fields."""
    from g4bench.engine.grammar import TOOL_CLOSE, TOOL_OPEN, _forced_tools

    forced = _forced_tools(tools or [], tool_choice) if isinstance(tool_choice, str | dict) else []
    if forced:
        bound = 0
        for fn in forced:
            params = fn.get("parameters") or {}
            name = len(str(fn.get("name", "")))
            bound = max(bound, name + _min_len(params) + schema_growth(params))
        return bound + len(TOOL_OPEN) + len(TOOL_CLOSE) + len("call:")
    spec = (response_format or {}).get("json_schema")
    schema = spec.get("schema", {}) if isinstance(spec, dict) else {}
    return schema_growth(schema if isinstance(schema, dict) else {})


def budgeted(matcher: GrammarMatcher, budget: int, growth: int) -> BudgetedMatcher:
    """`matcher` bounded to `budget` tokens (GrammarError when no output fits), tables cached per vocab."""
    tables = _TABLES.get(id(matcher.vocab))
    if tables is None or tables[0] is not matcher.vocab:
        tables = (matcher.vocab, VocabTables.build(matcher.vocab))
        _TABLES[id(matcher.vocab)] = tables
    return BudgetedMatcher(matcher, budget, growth, tables[1])


_TABLES: dict[int, tuple[GrammarVocab, VocabTables]] = {}
