"""The tool-call agent workload's pieces: forced calls in each request, results of the configured
size appended as tool messages, parse/validation rates, streaming delta folding."""

from __future__ import annotations

import json

from harness.load.client import RequestRecord
from harness.load.tool_workload import (
    TOOLS,
    ToolWorkloadConfig,
    check_calls,
    fold_tool_call_deltas,
    make_tool_tasks,
)


def call(cid: str, name: str, args: dict | str) -> dict:
    arguments = args if isinstance(args, str) else json.dumps(args)
    return {"id": cid, "type": "function", "function": {"name": name, "arguments": arguments}}


def reply_record(calls: list[dict], text: str = "") -> RequestRecord:
    """A streamed reply's record: each call as one `delta.tool_calls` entry with its index."""
    rec = RequestRecord("r", "/v1/chat/completions", text=text)
    rec.tool_call_deltas = [{"index": i, **c} for i, c in enumerate(calls)]
    return rec


def test_turns_force_calls_and_append_results_of_the_configured_size():
    (task,), stats = make_tool_tasks(ToolWorkloadConfig(turns=3, tool_result_tokens=200, named=True), 1)
    first = task.next_spec()
    assert first.endpoint == "/v1/chat/completions" and first.body["tools"] == TOOLS
    assert first.body["tool_choice"] == {"type": "function", "function": {"name": "get_weather"}}
    reply = [
        call("c0", "get_weather", {"city": "Oslo"}),
        call("c1", "get_weather", {"city": "Rome", "unit": "celsius"}),
    ]
    assert task.observe(reply_record(reply)) is None
    second = task.next_spec()
    msgs = second.body["messages"]
    assert [m["role"] for m in msgs] == ["user", "assistant", "tool", "tool"]
    assert msgs[1]["tool_calls"] == reply and msgs[1]["content"] is None
    assert [m["tool_call_id"] for m in msgs[2:]] == ["c0", "c1"]
    assert all(
        len(m["content"]) == 200 and json.loads(m["content"])["tool"] == "get_weather" for m in msgs[2:]
    )
    assert second.body["tool_choice"]["function"]["name"] == "search_docs"
    task.observe(reply_record([call("c2", "search_docs", {"query": "x", "limit": 99})]))
    task.next_spec()
    task.observe(reply_record([], text="no call"))
    assert task.next_spec() is None
    assert stats.summary() == {"replies": 3, "call_rate": 2 / 3, "parse_rate": 2 / 3, "valid_rate": 1 / 3,
                               "first_errors": ["search_docs: 99 is greater than the maximum of 20",
                                                "reply has no tool_calls"]}  # fmt: skip


def test_check_calls_verdicts():
    assert check_calls([call("a", "read_file", {"path": "x.py", "count": 5})]).valid
    bad_json = check_calls([call("a", "read_file", "{path:")])
    assert not bad_json.parsed and "not JSON" in bad_json.error
    unknown = check_calls([call("a", "rm_rf", {})])
    assert unknown.parsed and not unknown.valid and "unknown function" in unknown.error


def test_required_choice_and_determinism():
    cfg = ToolWorkloadConfig(seed=4)
    a, _ = make_tool_tasks(cfg, 2)
    b, _ = make_tool_tasks(cfg, 2)
    assert a[1].next_spec().body == b[1].next_spec().body
    assert a[0].next_spec().body["tool_choice"] == "required"
    assert a[0].next_spec().body["messages"] != a[1].next_spec().body["messages"]


def test_fold_streaming_deltas_by_index():
    deltas = [
        {"index": 0, "id": "c0", "type": "function", "function": {"name": "get_weather", "arguments": ""}},
        {"index": 1, "id": "c1", "type": "function", "function": {"name": "read_file", "arguments": '{"pa'}},
        {"index": 0, "function": {"arguments": '{"city": "Oslo"}'}},
        {"index": 1, "function": {"arguments": 'th": "a"}'}},
    ]
    assert fold_tool_call_deltas(deltas) == [
        call("c0", "get_weather", {"city": "Oslo"}),
        call("c1", "read_file", {"path": "a"}),
    ]


def test_forced_calls_fit_max_tokens_and_validate_under_the_grammar():
    """Random logits (a synthetic model's noise) under the workload's own tool grammar: every reply is
    one valid call well inside max_tokens, so the workload's valid_rate can be 100%."""
    import numpy as np

    from g4bench.engine.grammar import BYTE_EOS, byte_vocab, compile_grammar
    from g4bench.server.toolcalls import parse_output

    cfg = ToolWorkloadConfig()
    vocab, rng = byte_vocab(512), np.random.default_rng(0)
    tok = vocab
    grammar = compile_grammar(None, TOOLS, "required", parallel_tool_calls=False)
    longest = 0
    for _ in range(100):
        matcher, ids = vocab.matcher(grammar), []
        for _ in range(cfg.max_tokens):
            allowed = np.flatnonzero(matcher.next_mask())
            token = int(rng.choice(allowed))
            if token == BYTE_EOS:
                break
            matcher.advance(token)
            ids.append(token)
        else:
            raise AssertionError("call did not end within max_tokens")
        longest = max(longest, len(ids))
        check = check_calls(parse_output(tok.decode(ids)).tool_calls)
        assert check.valid and check.calls == 1, check
    assert longest < cfg.max_tokens
