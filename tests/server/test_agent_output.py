"""AgentOutput: ids -> choice updates (deltas + logprobs), markers as special tokens, UTF-8 split
across ids, logprob rows never lost or duplicated."""

from __future__ import annotations

import itertools
import json

import pytest

from g4bench.engine.grammar import byte_vocab, hf_vocab
from g4bench.engine.logprobs import TokenLogprob
from g4bench.server.agent_output import AgentOutput, pieces_from_vocab

VOCAB = byte_vocab(512)
PIECE = pieces_from_vocab(VOCAB)


def ids_of(text: str) -> list[int]:
    return [b + 3 for b in text.encode()]


def call_ids():
    counter = itertools.count()
    return lambda: f"call_{next(counter)}"


def test_tool_call_stream_with_logprobs():
    text = "<|channel>thought\nhmm é<channel|>Sure.<|tool_call>call:f{a:1}<tool_call|>"
    ids = ids_of(text) + [1]  # EOS at the end
    out = AgentOutput(PIECE, top_logprobs=1, id_factory=call_ids())
    updates = []
    for i, t in enumerate(ids):
        updates += out.push(t, TokenLogprob(t, -0.01 * i, ((t, -0.01 * i),)))
    updates += out.finish()
    entries = out.logprobs_all(updates)["content"]
    assert [e["logprob"] for e in entries] == [-0.01 * i for i in range(len(ids))]  # each token exactly once
    deltas = [u["delta"] for u in updates if u["delta"]]
    assert "".join(d.get("reasoning_content", "") for d in deltas) == "hmm é"
    assert {"reasoning_content": "é"} in deltas  # the two bytes of é surface as one character
    assert "".join(d.get("content", "") for d in deltas) == "Sure."
    assert deltas[-1] == {"tool_calls": [
        {"index": 0, "id": "call_0", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}]}  # fmt: skip
    assert updates[-1] == {
        "delta": {},
        "logprobs": {
            "content": [
                {
                    "token": "",
                    "logprob": -0.01 * (len(ids) - 1),
                    "bytes": [],
                    "top_logprobs": [{"token": "", "logprob": -0.01 * (len(ids) - 1), "bytes": []}],
                }
            ]
        },
    }  # fmt: skip  EOS: no text
    result = out.result()
    assert (result.reasoning_content, result.content) == ("hmm é", "Sure.")
    assert out.finish_reason("stop") == "tool_calls" and out.finish_reason("length") == "length"


def test_without_logprobs_and_plain_text():
    out = AgentOutput(PIECE)
    updates = [u for t in ids_of("hi <there") for u in out.push(t)] + out.finish()
    assert all(u["logprobs"] is None for u in updates)
    assert out.result().content == "hi <there" and out.finish_reason("stop") == "stop"
    assert out.logprobs_all(updates) is None
    with pytest.raises(ValueError, match="no logprob row"):
        AgentOutput(PIECE, top_logprobs=0).push(5)


def test_special_token_markers_reach_the_parser(tmp_path):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    specials = [
        "<pad>",
        "<eos>",
        "<bos>",
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
        vocab_size=300, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(["call:lookup city Paris"] * 10, trainer)
    tok.save(str(tmp_path / "tokenizer.json"))
    vocab = hf_vocab(str(tmp_path / "tokenizer.json"), eos_ids=[1])
    ids = tok.encode('<|tool_call>call:lookup{city:<|"|>Paris<|"|>}<tool_call|>').ids
    assert 3 in ids and 5 in ids  # markers are single special ids
    assert tok.decode(ids) == "call:lookup{city:Paris}"  # what skip_special_tokens would leave
    out = AgentOutput(pieces_from_vocab(vocab))
    for t in ids:
        out.push(t)
    out.finish()
    (call,) = out.result().tool_calls
    assert json.loads(call["function"]["arguments"]) == {"city": "Paris"}
