"""Gemma 4 output parsing: fixtures from TensorSharp's Gemma4OutputParser description (seed 001).

Every fixture is also streamed split at every character boundary (and char by char): the folded
deltas must equal the non-streaming parse.
"""

from __future__ import annotations

import itertools
import json

import pytest

from g4bench.server.gemma_args import GemmaSyntaxError, gemma_to_json, parse_call_body
from g4bench.server.toolcalls import OutputParser, assemble, parse_output

Q = '<|"|>'


def ids():
    counter = itertools.count()
    return lambda: f"call_{next(counter)}"


# (model output, content, reasoning, [(name, arguments as a Python value)])
FIXTURES = [
    ("Hello there.", "Hello there.", None, []),
    (
        "<|tool_call>call:read_invoice{invoice_id:INV-472}<tool_call|>",
        None,
        None,
        [("read_invoice", {"invoice_id": "INV-472"})],
    ),
    (
        "<|tool_call>call:open_file{path:src/main.py}<tool_call|>",
        None,
        None,
        [("open_file", {"path": "src/main.py"})],
    ),
    (
        "<|tool_call>call:fetch{ids:[INV-1, INV-2]}<tool_call|>",
        None,
        None,
        [("fetch", {"ids": ["INV-1", "INV-2"]})],
    ),
    (
        f"<|tool_call>call:get_weather{{location:{Q}Paris, France{Q},unit:celsius,days:3}}<tool_call|>",
        None,
        None,
        [("get_weather", {"location": "Paris, France", "unit": "celsius", "days": 3})],
    ),
    (
        "<|tool_call>call:mix{a:[1, 2.5, -3e2, true, null, x1],b:{c:{d:[[1],[k]]}},e:false}<tool_call|>",
        None,
        None,
        [("mix", {"a": [1, 2.5, -300.0, True, None, "x1"], "b": {"c": {"d": [[1], ["k"]]}}, "e": False})],
    ),
    (
        "Let me check both.\n<|tool_call>call:a{x:1}<tool_call|><|tool_call>call:b{y:two}<tool_call|>",
        "Let me check both.\n",
        None,
        [("a", {"x": 1}), ("b", {"y": "two"})],
    ),
    (
        '<|tool_call>call:a{}<tool_call|>\n<|tool_call>call:b{s:<|"|>{not: parsed}<|"|>}<tool_call|>\n',
        None,
        None,
        [("a", {}), ("b", {"s": "{not: parsed}"})],
    ),
    (
        "<|channel>thought\nThe user wants weather.<channel|>It is sunny.",
        "It is sunny.",
        "The user wants weather.",
        [],
    ),
    (
        "<|channel>thought\nNeed data.<channel|><|tool_call>call:lookup{q:rain}<tool_call|>",
        None,
        "Need data.",
        [("lookup", {"q": "rain"})],
    ),
    ("<|tool_call>call:broken{a:[1,2}<tool_call|>", "<|tool_call>call:broken{a:[1,2}<tool_call|>", None, []),
    ("ok <|tool_call>call:half{a:1", "ok <|tool_call>call:half{a:1", None, []),
    (
        "<|tool_call>not a call<tool_call|> then text",
        "<|tool_call>not a call<tool_call|> then text",
        None,
        [],
    ),
    ("<|channel>thought\nunfinished thinking", None, "unfinished thinking", []),
    ("a < b and c <| d <channel|> e", "a < b and c <| d  e", None, []),
    ("<|channel>thoughtful<channel|>x", "x", "thoughtful", []),
    (
        "<|channel>thought\n<|tool_call> inside thought<channel|>done",
        "done",
        "<|tool_call> inside thought",
        [],
    ),
    (
        '<|tool_call>call:j{"quoted key":"json \\"str\\"",n:-0.5}<tool_call|>',
        None,
        None,
        [("j", {"quoted key": 'json "str"', "n": -0.5})],
    ),
    (
        f'<|tool_call>call:echo{{s:{Q}a<tool_call|>b{Q},j:"x<tool_call|>\\"y"}}<tool_call|>',
        None,
        None,
        [("echo", {"s": "a<tool_call|>b", "j": 'x<tool_call|>"y'})],
    ),
]


def check(parsed, content, reasoning, calls):
    assert parsed.content == content
    assert parsed.reasoning_content == reasoning
    got = [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in parsed.tool_calls]
    assert got == calls
    assert all(c["type"] == "function" and c["id"].startswith("call_") for c in parsed.tool_calls)


@pytest.mark.parametrize(("text", "content", "reasoning", "calls"), FIXTURES)
def test_non_streaming(text, content, reasoning, calls):
    check(parse_output(text), content, reasoning, calls)


@pytest.mark.parametrize(("text", "content", "reasoning", "calls"), FIXTURES)
def test_streaming_equals_non_streaming_at_every_split(text, content, reasoning, calls):
    whole = parse_output(text, id_factory=ids())
    for cut in range(len(text) + 1):
        p = OutputParser(id_factory=ids())
        deltas = p.feed(text[:cut]) + p.feed(text[cut:]) + p.finish()
        assert assemble(deltas) == whole, cut
    p = OutputParser(id_factory=ids())
    deltas = [d for ch in text for d in p.feed(ch)] + p.finish()
    assert assemble(deltas) == whole
    check(whole, content, reasoning, calls)


def test_stream_holds_back_partial_markers_and_indexes_calls():
    p = OutputParser(id_factory=ids())
    assert p.feed("Hi <|tool") == [{"content": "Hi "}]
    assert p.feed("_call>call:f{a:1}<tool_") == []
    first = p.feed("call|><|tool_call>call:g{}<tool_call|>")
    assert first == [
        {
            "tool_calls": [
                {
                    "index": 0,
                    "id": "call_0",
                    "type": "function",
                    "function": {"name": "f", "arguments": '{"a": 1}'},
                }
            ]
        },
        {
            "tool_calls": [
                {"index": 1, "id": "call_1", "type": "function", "function": {"name": "g", "arguments": "{}"}}
            ]
        },
    ]
    assert p.feed("<chan") == []
    assert p.finish() == [{"content": "<chan"}]


def test_reasoning_primed_by_prompt():
    parsed = parse_output("still thinking<channel|>answer", in_reasoning=True)
    assert (parsed.reasoning_content, parsed.content) == ("still thinking", "answer")
    assert parse_output("<|channel>thought\nx<channel|>y").message() == {
        "role": "assistant",
        "content": "y",
        "reasoning_content": "x",
    }


def test_gemma_args_errors_name_the_problem():
    with pytest.raises(GemmaSyntaxError, match="expected ':'"):
        gemma_to_json("{a 1}")
    with pytest.raises(GemmaSyntaxError, match="unterminated"):
        gemma_to_json(f"{{a:{Q}x}}")
    with pytest.raises(GemmaSyntaxError, match="call:<name>"):
        parse_call_body("get{a:1}")
    with pytest.raises(GemmaSyntaxError, match="after the arguments"):
        parse_call_body("call:f{a:1} trailing")
    assert gemma_to_json("{a:[1,],b:{},}") == '{"a": [1], "b": {}}'
