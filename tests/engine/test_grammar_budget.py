"""Budget-aware grammars on the byte vocabulary with a random "model" (uniform over allowed ids).

Every walk stops at EOS or at its budget, as the scheduler does (the last token is never advanced);
each output must parse and validate, however unbounded the schema. Numbers stay within what a
float64 / int64 holds; a budget below the shortest valid output is refused up front."""

from __future__ import annotations

import json

import jsonschema
import numpy as np
import pytest

from g4bench.engine.grammar import (
    BYTE_EOS,
    GrammarError,
    bitmask_words,
    byte_vocab,
    compile_grammar,
    unpack_bitmask,
)
from g4bench.engine.grammar_budget import (
    INT_DIGITS,
    MANTISSA_DIGITS,
    NumberLexer,
    budgeted,
    closing_plan,
    request_growth,
    schema_growth,
)
from g4bench.server.toolcalls import parse_output
from tests.server.agent_schemas import SCHEMAS

V = 300
VOCAB = byte_vocab(V)
NUM, INT, STR = {"type": "number"}, {"type": "integer"}, {"type": "string"}
FREE = [
    {"type": "object", "properties": {"x": NUM}, "required": ["x"]},
    {"type": "object", "properties": {"n": INT, "s": STR}, "required": ["n", "s"]},
    {"type": "object", "properties": {"xs": {"type": "array", "items": NUM}}, "required": ["xs"]},
    {"type": "object", "properties": {"a": {"type": "object", "properties": {"b": {"type": "array", "items": {
        "type": "object", "properties": {"k": STR, "v": NUM}, "required": ["k", "v"]}}}, "required": ["b"]}},
     "required": ["a"]},
]  # fmt: skip
TOOLS = [
    {"type": "function", "function": {"name": "move", "parameters": {"type": "object", "properties": {
        "x": NUM, "y": NUM}, "required": ["x", "y"]}}},
    {"type": "function", "function": {"name": "tag", "parameters": {"type": "object", "properties": {
        "labels": {"type": "array", "items": STR}}, "required": ["labels"]}}},
]  # fmt: skip


def walk(matcher, budget: int, rng, bias: np.ndarray | None = None) -> bytes:
    """Sample like the scheduler: fill, sample, stop at EOS or `budget` tokens, advance otherwise."""
    words = np.empty(bitmask_words(V), np.int32)
    out = []
    for k in range(budget):
        matcher.fill_bitmask(words)
        ids = np.flatnonzero(unpack_bitmask(words, V))
        assert len(ids), f"empty mask after {bytes(t - 3 for t in out)!r}"
        p = None if bias is None else bias[ids] / bias[ids].sum()
        token = int(rng.choice(ids, p=p))
        if token == BYTE_EOS:
            break
        out.append(token)
        if k < budget - 1:
            matcher.advance(token)
    return bytes(t - 3 for t in out)


def schema_matcher(schema: dict, budget: int):
    fmt = {"type": "json_schema", "json_schema": {"schema": schema, "strict": True}}
    grammar = compile_grammar(fmt)
    assert grammar is not None
    return budgeted(VOCAB.matcher(grammar), budget, request_growth(fmt, None, None))


# digits and number punctuation 30x likelier than other bytes: the walk tries to run numbers away
DIGITY = np.ones(V)
DIGITY[[b + 3 for b in b"0123456789.eE-+"]] = 30.0


@pytest.mark.parametrize("budget", [24, 40, 80, 200])
@pytest.mark.parametrize("i", range(len(FREE)))
def test_unbounded_schemas_always_close_within_the_budget(i, budget):
    rng = np.random.default_rng(1000 * i + budget)
    valid = refused = 0
    for _ in range(10):
        try:
            m = schema_matcher(FREE[i], budget)
        except GrammarError as exc:
            assert "max_tokens" in str(exc)
            refused += 1
            continue
        text = walk(m, budget, rng, DIGITY)
        jsonschema.validate(json.loads(text), FREE[i])
        valid += 1
    assert valid + refused == 10 and (valid == 10 or budget < 40)


@pytest.mark.parametrize("budget", [30, 60])
def test_bounded_schemas_close_too(budget):
    rng = np.random.default_rng(budget)
    for schema in SCHEMAS:
        try:
            m = schema_matcher(schema, budget)
        except GrammarError:
            continue
        jsonschema.validate(json.loads(walk(m, budget, rng)), schema)


def test_forced_close_is_recorded_and_the_plan_is_what_gets_written():
    m = schema_matcher(FREE[2], 24)
    for b in b'{"xs":[1,2,3':
        m.advance(b + 3)
    assert not m.forced
    text = b'{"xs":[1,2,3' + walk(m, 24 - 12, np.random.default_rng(0), DIGITY)
    assert m.forced and len(text) <= 24
    assert json.loads(text)["xs"][:2] == [1, 2]


def test_too_small_a_budget_is_refused_naming_the_shortest_output():
    schema = {"type": "object", "properties": {"name": STR, "when": {"type": "object", "properties": {
        "day": INT}, "required": ["day"]}}, "required": ["name", "when"]}  # fmt: skip
    shortest = len(b'{"name":"","when":{"day":0}}')
    with pytest.raises(GrammarError, match=f"max_tokens \\({shortest - 1}\\).*shortest takes {shortest}"):
        schema_matcher(schema, shortest - 1)
    m = schema_matcher(schema, shortest)
    assert json.loads(walk(m, shortest, np.random.default_rng(0))) == {"name": "", "when": {"day": 0}}


def test_closing_plan_prefers_closing_strings_and_containers():
    fmt = {"type": "json_object"}
    grammar = compile_grammar(fmt)
    assert grammar is not None
    m = VOCAB.matcher(grammar)
    for b in b'{"a":[{"b":"xy':
        m.advance(b + 3)
    m2 = budgeted(m, 100, request_growth(fmt, None, None))
    assert bytes(t - 3 for t in closing_plan(m2.inner, m2.tables)) == b'"}]}'


@pytest.mark.parametrize("parallel", [True, False])
def test_forced_tool_calls_close_within_the_budget(parallel):
    grammar = compile_grammar(None, TOOLS, "required", parallel_tool_calls=parallel)
    assert grammar is not None
    growth = request_growth(None, TOOLS, "required")
    rng = np.random.default_rng(7)
    for budget in (50, 80, 120):
        for _ in range(6):
            m = budgeted(VOCAB.matcher(grammar), budget, growth)
            parsed = parse_output(walk(m, budget, rng, DIGITY).decode())
            assert parsed.tool_calls, parsed
            for call in parsed.tool_calls:
                args = json.loads(call["function"]["arguments"])
                jsonschema.validate(args, TOOLS[[t["function"]["name"] for t in TOOLS].index(call["function"]["name"])]["function"]["parameters"])  # fmt: skip


def test_numbers_fit_float64_and_int64():
    """With a budget far away and digits 30x likelier, numbers stop at the digit bounds."""
    schema = {"type": "object", "properties": {"xs": {"type": "array", "items": NUM}, "ns": {"type": "array", "items": INT}},
              "required": ["xs", "ns"]}  # fmt: skip
    rng = np.random.default_rng(3)
    for _ in range(5):
        value = json.loads(walk(schema_matcher(schema, 300), 300, rng, DIGITY))
        for x in value["xs"]:
            assert np.isfinite(x)
        for n in value["ns"]:
            assert -(2**63) <= n < 2**63
    lexer = NumberLexer()
    lexer.feed(b'{"a":"123456789012345678901234",')
    assert lexer.mantissa == -1  # digits inside a string are not a number
    lexer.feed(b'"b":-12345678901234567')
    assert lexer.mantissa == MANTISSA_DIGITS and INT_DIGITS > MANTISSA_DIGITS - 1
    lexer.feed(b"e-4")
    assert lexer.exponent == 1


def test_growth_bound_covers_entering_a_subschema():
    row = {"type": "object", "properties": {"k": STR, "v": NUM}, "required": ["k", "v"]}
    schema = {"type": "object", "properties": {"rows": {"type": "array", "items": row}}, "required": ["rows"]}
    assert schema_growth(schema) >= len(b'{"k":"","v":0}')
