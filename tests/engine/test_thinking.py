"""ThinkingCap: the thought channel's budget forced through the mask, and a grammar armed after it."""

from __future__ import annotations

import json

import numpy as np

from g4bench.engine.grammar import BYTE_EOS, byte_vocab, compile_grammar
from g4bench.engine.thinking import ThinkingCap, budget_for_max_tokens
from g4bench.server.toolcalls import parse_output

VOCAB = byte_vocab(512)
TOK = VOCAB


def run(cap: ThinkingCap, want: bytes, steps: int, rng: np.random.Generator) -> str:
    """Feed `want` byte by byte while the mask allows it, else a random allowed id; stop at EOS.
    (`want` avoids the letters of ``<channel|>`` after a forced close, which would match them.)"""
    ids: list[int] = []
    wanted = [b + 3 for b in want]
    for _ in range(steps):
        allowed = np.flatnonzero(cap.next_mask())
        token = wanted.pop(0) if wanted and wanted[0] in allowed else int(rng.choice(allowed))
        if token == BYTE_EOS:
            break
        cap.advance(token)
        ids.append(token)
    return TOK.decode(ids)


def test_budget_closes_at_first_line_break_past_budget():
    cap = ThinkingCap(VOCAB, budget=10)
    text = run(cap, b"<|channel>thought\nabc\n999 xyz", 40, np.random.default_rng(0))
    # the 10th token after <|channel> is the "b" of "abc"; the first line end after it closes the channel
    assert text.startswith("<|channel>thought\nabc\n<channel|>999 xyz")
    assert cap.state == "after" and cap.next_mask().all()


def test_hard_stop_at_twice_the_budget():
    cap = ThinkingCap(VOCAB, budget=5)
    text = run(cap, b"<|channel>" + b"x" * 30, 30, np.random.default_rng(0))
    assert text.startswith("<|channel>" + "x" * 10 + "<channel|>")


def test_model_closing_itself_and_no_budget():
    cap = ThinkingCap(VOCAB, budget=None, in_channel=True)
    text = run(cap, b"a" * 50 + b"<channel|>done", 70, np.random.default_rng(0))
    assert text.startswith("a" * 50 + "<channel|>done") and cap.state == "after"
    assert budget_for_max_tokens(256) == 64 and budget_for_max_tokens(40) == 10


def test_grammar_arms_after_primed_channel_closes():
    grammar = compile_grammar({"type": "json_schema", "json_schema": {"schema": {
        "type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 9}}, "required": ["n"],
        "additionalProperties": False}}})  # fmt: skip
    rng = np.random.default_rng(4)
    for _ in range(10):
        cap = ThinkingCap(VOCAB, budget=6, in_channel=True, then=VOCAB.matcher(grammar))
        text = run(cap, b"", 200, rng)  # random thought, forced close, then JSON
        parsed = parse_output(text, in_reasoning=True)
        assert parsed.reasoning_content is not None and 0 <= json.loads(parsed.content)["n"] <= 9
        assert cap.is_done()


def test_grammar_without_thinking_enforces_from_first_token():
    cap = ThinkingCap(VOCAB, budget=64, then=VOCAB.matcher(compile_grammar({"type": "json_object"})))
    mask = cap.next_mask()
    assert np.flatnonzero(mask).tolist() == [ord("{") + 3]  # so '<' (of <|channel>) is excluded
