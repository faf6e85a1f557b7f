"""Grammar-constrained decoding on the synthetic byte vocabulary, with a random-logits "model".

The fake model draws standard-normal logits over the whole vocabulary each step; the sampler keeps
only the ids the matcher allows and samples at temperature 1. Every output must parse and validate
against its schema (jsonschema), and `tool_choice` outputs must parse as Gemma tool calls whose
arguments validate against the tool's parameters.
"""

from __future__ import annotations

import json

import jax.numpy as jnp
import jsonschema
import numpy as np
import pytest

from g4bench.engine.grammar import (
    BYTE_EOS,
    GrammarError,
    GrammarViolation,
    apply_bool_mask,
    apply_token_bitmask,
    bitmask_words,
    byte_vocab,
    compile_grammar,
    hf_vocab,
    unpack_bitmask,
)
from g4bench.server.toolcalls import parse_output

S = {"type": "string", "maxLength": 24}
SCHEMAS: list[dict] = [
    {"type": "object", "properties": {"name": S}, "required": ["name"], "additionalProperties": False},
    {
        "type": "object",
        "properties": {"n": {"type": "integer", "minimum": -5, "maximum": 5}},
        "required": ["n"],
    },
    {
        "type": "object",
        "properties": {"x": {"type": "number", "minimum": 0.5, "maximum": 99.5}},
        "required": ["x"],
    },
    {
        "type": "object",
        "properties": {"unit": {"enum": ["celsius", "fahrenheit", "kelvin"]}},
        "required": ["unit"],
    },
    {
        "type": "object",
        "properties": {"tags": {"type": "array", "items": S, "maxItems": 4}},
        "required": ["tags"],
    },
    {
        "type": "object",
        "properties": {"ids": {"type": "array", "items": {"type": "integer"}, "minItems": 1, "maxItems": 3}},
        "required": ["ids"],
        "additionalProperties": False,
    },
    {
        "type": "object",
        "properties": {
            "user": {
                "type": "object",
                "properties": {"id": {"type": "integer", "minimum": 1}, "email": S},
                "required": ["id"],
                "additionalProperties": False,
            },
            "active": {"type": "boolean"},
        },
        "required": ["user", "active"],
        "additionalProperties": False,
    },
    {
        "type": "object",
        "properties": {"a": S, "b": {"type": "integer"}, "c": {"type": "boolean"}},
        "required": [],
    },
    {"type": "array", "items": {"type": "number", "minimum": -1, "maximum": 1}, "maxItems": 5},
    {
        "type": "object",
        "properties": {"kind": {"const": "invoice"}, "total": {"type": "number", "minimum": 0}},
        "required": ["kind", "total"],
        "additionalProperties": False,
    },  # fmt: skip
    {
        "type": "object",
        "properties": {
            "matrix": {
                "type": "array",
                "items": {"type": "array", "items": {"type": "integer"}, "maxItems": 3},
                "maxItems": 3,
            }
        },
        "required": ["matrix"],
        "additionalProperties": False,
    },  # fmt: skip
    {
        "type": "object",
        "properties": {"v": {"anyOf": [{"type": "integer"}, S, {"type": "null"}]}},
        "required": ["v"],
    },
    {
        "type": "object",
        "properties": {"zip": {"type": "string", "pattern": "^[0-9]{5}$"}},
        "required": ["zip"],
    },
    {
        "type": "object",
        "properties": {"p": {"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 1}},
        "required": ["p"],
        "additionalProperties": False,
    },  # fmt: skip
    {
        "type": "object",
        "properties": {
            "items": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {"sku": S, "qty": {"type": "integer", "minimum": 1, "maximum": 99}},
                    "required": ["sku", "qty"],
                    "additionalProperties": False,
                },
                "maxItems": 3,
            }
        },
        "required": ["items"],
        "additionalProperties": False,
    },
    {
        "type": "object",
        "properties": {"status": {"type": "string", "enum": ["ok", "error"]}, "code": {"type": "integer"}},
        "required": ["status"],
        "additionalProperties": False,
    },  # fmt: skip
    {"type": "string", "maxLength": 40},
    {
        "type": "object",
        "properties": {"free": {"type": "string"}},
        "required": ["free"],
        "additionalProperties": False,
    },
    {
        "type": "object",
        "properties": {
            "a": {
                "type": "object",
                "properties": {
                    "b": {
                        "type": "object",
                        "properties": {"c": {"type": "array", "items": {"enum": [1, 2, 3]}, "maxItems": 4}},
                        "required": ["c"],
                    }
                },
                "required": ["b"],
            }
        },
        "required": ["a"],
    },  # fmt: skip
    {
        "type": "object",
        "properties": {
            "lat": {"type": "number", "minimum": -90, "maximum": 90},
            "lon": {"type": "number", "minimum": -180, "maximum": 180},
        },
        "required": ["lat", "lon"],
    },  # fmt: skip
    {
        "type": "object",
        "properties": {"when": {"type": "integer", "minimum": 0}, "note": S},
        "required": ["when"],
        "additionalProperties": False,
    },  # fmt: skip
    {"type": "object"},
]

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": SCHEMAS[3]
            | {"properties": {"unit": {"enum": ["celsius", "fahrenheit"]}, "city": S}, "required": ["city"]},
        },
    },  # fmt: skip
    {"type": "function", "function": {"name": "read_invoice", "parameters": SCHEMAS[14]}},
    {"type": "function", "function": {"name": "now"}},
]


@pytest.fixture(scope="module")
def vocab():
    return byte_vocab(512)


def generate(vocab, grammar: str, rng: np.random.Generator, max_tokens: int = 6000) -> str:
    """Random logits, masked, sampled at temperature 1 until EOS; the bytes decoded as the tokenizer would."""
    matcher = vocab.matcher(grammar)
    words = np.empty(bitmask_words(vocab.vocab_size), np.int32)
    ids: list[int] = []
    for _ in range(max_tokens):
        matcher.fill_bitmask(words)
        allowed = np.flatnonzero(unpack_bitmask(words, vocab.vocab_size))
        logits = rng.standard_normal(vocab.vocab_size)[allowed]
        p = np.exp(logits - logits.max())
        token = int(allowed[rng.choice(len(allowed), p=p / p.sum())])
        if token == BYTE_EOS:
            return vocab.decode(ids)
        matcher.advance(token)
        ids.append(token)
    raise AssertionError(f"no EOS within {max_tokens} tokens: {byte_vocab(512).decode(ids)[:200]!r}")


def test_json_schema_outputs_all_validate(vocab):
    rng = np.random.default_rng(13)
    done = 0
    for schema in SCHEMAS:
        grammar = compile_grammar({"type": "json_schema", "json_schema": {"name": "s", "schema": schema}})
        for _ in range(10):
            jsonschema.validate(json.loads(generate(vocab, grammar, rng)), schema)
            done += 1
    assert len(SCHEMAS) >= 20 and done >= 200


def test_json_object_and_strict(vocab):
    rng = np.random.default_rng(1)
    grammar = compile_grammar({"type": "json_object"})
    for _ in range(10):
        assert isinstance(json.loads(generate(vocab, grammar, rng)), dict)
    strict = {"type": "json_schema", "json_schema": {"schema": SCHEMAS[0], "strict": True}}
    assert isinstance(json.loads(generate(vocab, compile_grammar(strict), rng)), dict)
    assert compile_grammar(None) is None and compile_grammar({"type": "text"}) is None
    with pytest.raises(GrammarError, match="unsupported response_format"):
        compile_grammar({"type": "yaml"})
    unenforceable = {"type": "object", "not": {"required": ["x"]}}
    vocab.matcher(
        compile_grammar({"type": "json_schema", "json_schema": {"schema": unenforceable}})
    )  # lenient
    with pytest.raises(GrammarError, match="Unimplemented keys"):
        vocab.matcher(
            compile_grammar({"type": "json_schema", "json_schema": {"schema": unenforceable, "strict": True}})
        )


def test_tool_choice_required_gives_valid_calls(vocab):
    rng = np.random.default_rng(7)
    grammar = compile_grammar(None, TOOLS, "required")
    params = {t["function"]["name"]: t["function"].get("parameters", {"type": "object"}) for t in TOOLS}
    names = set()
    for _ in range(30):
        text = generate(vocab, grammar, rng)
        parsed = parse_output(text)
        assert parsed.content is None and parsed.tool_calls, text
        for call in parsed.tool_calls:
            names.add(call["function"]["name"])
            jsonschema.validate(json.loads(call["function"]["arguments"]), params[call["function"]["name"]])
    assert names == set(params)


def test_single_call_when_not_parallel(vocab):
    rng = np.random.default_rng(11)
    grammar = compile_grammar(None, TOOLS, "required", parallel_tool_calls=False)
    assert grammar.startswith("start: call\n")
    for _ in range(10):
        assert len(parse_output(generate(vocab, grammar, rng)).tool_calls) == 1


def test_named_tool_choice_and_errors(vocab):
    rng = np.random.default_rng(3)
    grammar = compile_grammar(None, TOOLS, {"type": "function", "function": {"name": "get_weather"}})
    for _ in range(5):
        calls = parse_output(generate(vocab, grammar, rng)).tool_calls
        assert {c["function"]["name"] for c in calls} == {"get_weather"}
    assert compile_grammar(None, TOOLS, "auto") is None and compile_grammar(None, TOOLS, "none") is None
    with pytest.raises(GrammarError, match="not among the tools"):
        compile_grammar(None, TOOLS, {"type": "function", "function": {"name": "nope"}})
    with pytest.raises(GrammarError, match="at least one tool"):
        compile_grammar(None, [], "required")


def test_mask_bans_off_grammar_ids_and_advance_checks(vocab):
    matcher = vocab.matcher(compile_grammar({"type": "json_object"}))
    mask = matcher.next_mask()
    assert mask.shape == (512,)
    assert mask[ord("{") + 3] and not mask[ord("[") + 3] and not mask[300] and not mask[BYTE_EOS]
    with pytest.raises(GrammarViolation, match="not allowed"):
        matcher.advance(ord("x") + 3)


def test_done_after_complete_value(vocab):
    matcher = vocab.matcher(
        compile_grammar({"type": "json_schema", "json_schema": {"schema": {"enum": ["ab"]}}})
    )
    for b in b'"ab"':
        assert not matcher.is_done()
        matcher.advance(b + 3)
    assert matcher.is_done() and matcher.is_accepting()
    assert np.flatnonzero(matcher.next_mask()).tolist() == [BYTE_EOS]


def test_device_bitmask_matches_host_unpack():
    rng = np.random.default_rng(0)
    for vocab_size in (512, 1000, 262_144):
        words = rng.integers(-(2**31), 2**31, size=(3, bitmask_words(vocab_size)), dtype=np.int64).astype(
            np.int32
        )
        words[1] = -1  # an unconstrained row
        logits = rng.standard_normal((3, vocab_size)).astype(np.float32)
        out = np.asarray(apply_token_bitmask(jnp.asarray(logits), jnp.asarray(words)))
        expect = np.where(unpack_bitmask(words, vocab_size), logits, -np.inf)
        np.testing.assert_array_equal(out, expect)
        np.testing.assert_array_equal(out[1], logits[1])
        unpacked = jnp.asarray(unpack_bitmask(words, vocab_size))
        np.testing.assert_array_equal(np.asarray(apply_bool_mask(jnp.asarray(logits), unpacked)), expect)


def test_full_size_byte_vocab_masks_unused_ids():
    vocab = byte_vocab(262_144)
    mask = vocab.matcher(compile_grammar({"type": "json_object"})).next_mask()
    assert mask.shape == (262_144,) and np.flatnonzero(mask).tolist() == [ord("{") + 3]


def test_hf_vocab_uses_single_token_markers(tmp_path):
    """A BPE tokenizer.json whose vocabulary has Gemma's markers as special tokens: the tool grammar
    forces those ids (not their spelling in bytes), and the decoded call parses."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    specials = [
        "<pad>",
        "<eos>",
        "<bos>",
        "<turn|>",
        "<|tool_call>",
        "<tool_call|>",
        '<|"|>',
        "<|channel>",
        "<channel|>",
    ]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(['{"city": "Paris", "unit": "celsius"} call:get_weather'] * 20, trainer)
    tok.save(str(tmp_path / "tokenizer.json"))
    vocab = hf_vocab(str(tmp_path / "tokenizer.json"), eos_ids=[1, 3])
    assert vocab.marker_ids["<|tool_call>"] == 4 and vocab.marker_ids["<tool_call|>"] == 5
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": SCHEMAS[0]}}]
    grammar = compile_grammar(None, tools, "required", vocab=vocab)
    matcher = vocab.matcher(grammar)
    assert np.flatnonzero(matcher.next_mask()).tolist() == [4]
    rng = np.random.default_rng(2)
    words = np.empty(bitmask_words(vocab.vocab_size), np.int32)
    ids: list[int] = []
    for _ in range(2000):
        matcher.fill_bitmask(words)
        token = int(rng.choice(np.flatnonzero(unpack_bitmask(words, vocab.vocab_size))))
        if token in (1, 3):
            break
        matcher.advance(token)
        ids.append(token)
    else:
        raise AssertionError("no EOS within 2000 tokens")
    calls = parse_output(tok.decode(ids, skip_special_tokens=False)).tool_calls
    assert len(calls) >= 1 and all(c["function"]["name"] == "get_weather" for c in calls)
    for c in calls:
        jsonschema.validate(json.loads(c["function"]["arguments"]), SCHEMAS[0])
