"""Trace parsing (both formats, errors naming line and field), block-hash prompts, implied reuse."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.load.replay import SessionTask, request_spec, trace_workload
from harness.load.trace import (
    BlockTokens,
    TraceError,
    implied_block_reuse,
    load_trace,
    parse_trace,
)
from harness.load.workloads import TOKEN_HI, TOKEN_LO, WorkloadConfig

ROOT = Path(__file__).resolve().parents[3]


def lines(*rows: object) -> list[str]:
    return [r if isinstance(r, str) else json.dumps(r) for r in rows]


def test_mooncake_rows_parse_sorted_with_unknown_keys_ignored() -> None:
    t = parse_trace(lines({"timestamp": 900, "input_length": 600, "output_length": 4, "hash_ids": [1, 2]}, "",
                          {"timestamp": 100, "input_length": 10, "output_length": 2, "extra": "kept out"}))  # fmt: skip
    assert t.format == "mooncake" and t.num_requests == 2
    assert [r.timestamp_ms for r in t.requests] == [100, 900] and [r.index for r in t.requests] == [0, 1]
    assert t.requests[0].hash_ids == () and t.requests[1].line == 1  # the source line travels along
    assert t.notes and "timestamp order" in t.notes[0]
    assert t.span_s == 0.9 and t.max_context == 604


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ('{"timestamp": 1, "input_length": 5', "t.jsonl:2: not JSON"),
        ("[1, 2]", "t.jsonl:2: a line must be a JSON object"),
        ({"input_length": 5, "output_length": 1}, "t.jsonl:2: timestamp: missing"),
        ({"timestamp": -1, "input_length": 5, "output_length": 1}, "t.jsonl:2: timestamp: must be a number of ms ≥ 0"),
        ({"timestamp": 0, "input_length": 0, "output_length": 1}, "t.jsonl:2: input_length: must be an integer ≥ 1, got 0"),
        ({"timestamp": 0, "input_length": 5, "output_length": True}, "t.jsonl:2: output_length: must be an integer"),
        ({"timestamp": 0, "input_length": 5, "output_length": 1, "hash_ids": ["a"]}, "t.jsonl:2: hash_ids: must be a list of integers"),
        ({"timestamp": 0, "input_length": 513, "output_length": 1, "hash_ids": [1, 2, 3]},
         "t.jsonl:2: hash_ids: 3 blocks of 512 tokens, but input_length 513 fills only 2"),
        ({"session_id": "x", "turns": [{"input_length": 1, "output_length": 1}]}, "t.jsonl:2: turns: unexpected"),
    ],
)  # fmt: skip
def test_bad_mooncake_line_names_line_and_field(row: object, message: str) -> None:
    good = {"timestamp": 0, "input_length": 5, "output_length": 1}
    with pytest.raises(TraceError) as e:
        parse_trace(lines(good, row), "t.jsonl")
    assert str(e.value).startswith(message), str(e.value)


def session(**kw: object) -> dict:
    return {"session_id": "a", "start_ms": 0, "turns": [{"input_length": 8, "output_length": 2}]} | kw


@pytest.mark.parametrize(
    ("row", "message"),
    [
        (session(turns=[]), "s.jsonl:1: turns: must be a non-empty list"),
        (session(stat_ms=3), "s.jsonl:1: stat_ms: unknown key"),
        (session(turns=[{"input_length": 8, "output_length": 2, "think": 1}]), "s.jsonl:1: turns[0].think: unknown key"),
        (session(turns=[{"input_length": 8, "output_length": 0}]), "s.jsonl:1: turns[0]: output_length: must be an integer ≥ 1"),
        (session(turns=[{"input_length": 8, "output_length": 2, "think_ms": 5}]), "s.jsonl:1: turns[0].think_ms: the first turn"),
        (session(turns=[{"input_length": 8, "output_length": 2}, {"output_length": 2}]),
         "s.jsonl:1: turns[1].input_length: a later turn adds"),
        (session(turns=[{"input_length": 8, "output_length": 2}, {"input_length": 1, "output_length": 2, "think_ms": "x"}]),
         "s.jsonl:1: turns[1]: think_ms: must be a number"),
        (session(turns=[{"output_length": 2}]), "s.jsonl:1: turns[0].input_length: the first prompt is empty"),
    ],
)  # fmt: skip
def test_bad_session_line_names_line_and_field(row: dict, message: str) -> None:
    with pytest.raises(TraceError) as e:
        parse_trace(lines(row), "s.jsonl")
    assert str(e.value).startswith(message), str(e.value)


def test_session_trace_errors_on_a_request_line_and_a_repeated_id() -> None:
    with pytest.raises(TraceError, match=r"s.jsonl:2: turns: missing \(this is a session trace"):
        parse_trace(lines(session(), {"timestamp": 0, "input_length": 5, "output_length": 1}), "s.jsonl")
    with pytest.raises(TraceError, match=r"s.jsonl:3: session_id: 'a' repeats"):
        parse_trace(lines(session(), session(session_id="b"), session()), "s.jsonl")
    with pytest.raises(TraceError, match="empty trace"):
        parse_trace(["", "  "], "s.jsonl")


def test_committed_traces_parse() -> None:
    moon = load_trace(ROOT / "configs/traces/mooncake-30.jsonl")
    assert moon.num_requests == 30 and 10 <= moon.span_s <= 16
    assert sum(len(r.hash_ids) > 1 for r in moon.requests) >= 10  # shared prefixes are there to see
    sess = load_trace(ROOT / "configs/traces/agent-sessions.jsonl")
    assert sess.format == "sessions" and sess.num_requests == sum(len(s.turns) for s in sess.sessions)


def test_same_hash_id_gives_the_same_512_tokens_across_requests_and_runs() -> None:
    t = parse_trace(lines({"timestamp": 0, "input_length": 1100, "output_length": 1, "hash_ids": [7, 8, 9]},
                          {"timestamp": 5, "input_length": 700, "output_length": 1, "hash_ids": [7, 3]},
                          {"timestamp": 9, "input_length": 1500, "output_length": 1, "hash_ids": [7, 8]}))  # fmt: skip
    blocks = BlockTokens(seed=0)
    a, b, c = (blocks.request_prompt(r) for r in t.requests)
    assert (len(a), len(b), len(c)) == (1100, 700, 1500)
    assert a[:512] == b[:512] == c[:512]  # block 7 leads all three
    assert a[512:1024] == c[512:1024] and a[512:1024] != b[512:1024]  # block 8 in a and c only
    assert a[1024:] == blocks(9)[:76]  # a partial last block is that block cut short
    assert c[1024:] != b[512:700] and len(set(map(tuple, (a[1024:], c[1024:1100])))) == 2  # unique tails
    assert all(TOKEN_LO <= i < TOKEN_HI for i in a + b + c)
    assert BlockTokens(seed=0).request_prompt(t.requests[0]) == a  # the same in every run
    assert BlockTokens(seed=1)(7) != blocks(7)  # the workload seed changes every block


def test_implied_reuse_repeated_blocks_and_prefix() -> None:
    rows = implied_block_reuse([([1, 2], 1024), ([1, 3], 1024), ([3, 1], 900), ([1, 2], 700)])
    assert rows[0] == {"prompt": 1024, "repeated": 0, "prefix": 0}
    assert rows[1] == {"prompt": 1024, "repeated": 512, "prefix": 512}  # block 1 leads both
    assert rows[2] == {"prompt": 900, "repeated": 900, "prefix": 0}  # both seen, but not as a leading run
    assert rows[3] == {"prompt": 700, "repeated": 700, "prefix": 700}  # a shorter repeat of request 0
    # a partial block only reuses the tokens an earlier prompt had of it
    part = implied_block_reuse([([5, 6], 600), ([5, 6], 1024)])
    assert part[1] == {"prompt": 1024, "repeated": 600, "prefix": 600}


def test_mooncake_request_spec_in_both_transports() -> None:
    t = parse_trace(lines({"timestamp": 0, "input_length": 520, "output_length": 6, "hash_ids": [4, 5]}))
    blocks = BlockTokens()
    tok = request_spec(t.requests[0], WorkloadConfig(kind="trace", api="tokens", model="m"), blocks)
    assert tok.endpoint == "/v1/completions" and tok.body["prompt"] == blocks.request_prompt(t.requests[0])
    assert tok.body["max_tokens"] == tok.body["min_tokens"] == 6 and tok.body["ignore_eos"] is True
    chat = request_spec(t.requests[0], WorkloadConfig(kind="trace", api="chat", model="m"), blocks)
    text = chat.body["messages"][0]["content"]
    assert chat.endpoint == "/v1/chat/completions" and len(text) == 520
    assert [ord(ch) + 3 for ch in text] == tok.body["prompt"]  # the same block ids, as characters


def test_session_task_resends_history_with_the_real_reply() -> None:
    from harness.load.client import RequestRecord

    t = parse_trace(lines({"session_id": "x", "prefix_hash_ids": [9], "turns": [
        {"input_length": 10, "output_length": 3},
        {"tool_result_length": 4, "input_length": 2, "output_length": 3, "think_ms": 100}]}))  # fmt: skip
    wl = trace_workload(t, "tokens", "m", 0)
    assert (wl.kind, wl.turns) == ("sessions", 2)
    task = SessionTask(t.sessions[0], wl, BlockTokens())
    s0 = task.spec(0)
    assert s0.input_len == 522 and s0.prompt_ids is not None and s0.prompt_ids[:512] == BlockTokens()(9)
    assert (s0.task_id, s0.turn, s0.request_id) == (0, 0, "s0-0")
    rec = RequestRecord("s0-0", s0.endpoint, ok=True, output_ids=[50, 51, 52])
    assert task.observe(rec) is None
    s1 = task.spec(1)
    assert s1.prompt_ids is not None and s1.prompt_ids[:525] == s0.prompt_ids + [50, 51, 52]
    assert s1.input_len == 522 + 3 + 4 + 2
    assert task.observe(RequestRecord("s0-1", s1.endpoint, ok=True)) is not None  # no ids: cannot go on
    chat = SessionTask(t.sessions[0], trace_workload(t, "chat", "m", 0), BlockTokens())
    chat.spec(0)
    chat.observe(RequestRecord("s0-0", "/v1/chat/completions", ok=True, text="abc"))
    roles = [m["role"] for m in chat.spec(1).body["messages"]]
    assert roles == ["system", "user", "assistant", "user"]
