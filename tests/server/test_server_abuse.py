"""The abuse suite: well over 100 bad or edge inputs against a real uvicorn server on 127.0.0.1.

Every case states what it sends and what must come back. Nothing may answer >= 500; every 4xx
must carry an OpenAI error body whose message names the problem (the field, or the limit) and
never echoes the client's input; edge inputs that ask for nothing unusual must succeed. Before
and after the suite the same greedy request gives the same output, and no slot or queue entry is
left behind.
"""

from __future__ import annotations

import json
import socket

import httpx
import pytest

from g4bench.server.protocol import UNSUPPORTED
from g4bench.server.settings import ServerSettings
from tests.server.conftest import DEADLINE_S, wait_until

CHAT, COMP = "/v1/chat/completions", "/v1/completions"
SECRET = "zq-SECRET-INPUT-zq"  # planted in bad inputs: must never come back in an error body


def chat(**kw):
    return {"model": "fake", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, **kw}


def comp(**kw):
    return {"model": "fake", "prompt": "hi", "max_tokens": 3, **kw}


def raw(text: str) -> bytes:
    return text.encode()


# (name, url, body (dict -> JSON, bytes -> as is), expected status, words the error message must
# contain (any one of them, case-insensitive), expected `param` or None when not field-specific)
CASES: list[tuple] = [
    # ---- JSON itself -------------------------------------------------------------------------
    ("truncated JSON", CHAT, raw('{"model": "fake", "messages": ['), 400, ["malformed JSON"], None),
    ("not JSON", COMP, raw("model=fake&prompt=hi"), 400, ["malformed JSON"], None),
    ("empty body", COMP, b"", 400, ["malformed JSON"], None),
    ("array body", CHAT, raw("[1, 2]"), 400, ["JSON object"], None),
    ("string body", CHAT, raw('"hello"'), 400, ["JSON object"], None),
    ("number body", COMP, raw("42"), 400, ["JSON object"], None),
    ("null body", COMP, raw("null"), 400, ["JSON object"], None),
    ("invalid UTF-8", COMP, b'{"model": "fake", "prompt": "\xff\xfe"}', 400, ["UTF-8"], None),
    ("NaN temperature", CHAT, raw('{"model":"fake","messages":[],"temperature":NaN}'), 400, ["NaN"], None),
    ("Infinity", COMP, raw('{"model":"fake","prompt":"a","temperature":Infinity}'), 400, ["Infinity"], None),
    ("-Infinity", COMP, raw('{"model":"fake","prompt":"a","top_p":-Infinity}'), 400, ["Infinity"], None),
    ("1e999", COMP, raw('{"model":"fake","prompt":"a","temperature":1e999}'), 400, ["range"], None),
    (
        "5000-digit int",
        COMP,
        raw('{"model":"fake","prompt":"a","max_tokens":' + "9" * 5000 + "}"),
        400,
        ["digits"],
        None,
    ),
    (
        "deep nesting",
        COMP,
        raw('{"model":"fake","prompt":' + "[" * 100_000 + "]" * 100_000 + "}"),
        400,
        ["nested"],
        None,
    ),
    ("trailing garbage", COMP, raw('{"model":"fake","prompt":"a"} xyz'), 400, ["malformed JSON"], None),
    (
        "duplicate keys",
        COMP,
        raw('{"model":"fake","prompt":"a","max_tokens":0,"max_tokens":2}'),
        200,
        [],
        None,
    ),
    # ---- lone surrogates (used to be a 500 echoing the prompt) ----------------------------------
    (
        "surrogate in prompt",
        COMP,
        raw('{"model":"fake","prompt":"ab\\ud800cd' + SECRET + '"}'),
        400,
        ["surrogate"],
        "prompt",
    ),
    (
        "low surrogate in prompt",
        COMP,
        raw('{"model":"fake","prompt":"\\udc00"}'),
        400,
        ["surrogate"],
        "prompt",
    ),
    (
        "surrogate in message",
        CHAT,
        raw('{"model":"fake","messages":[{"role":"user","content":"a\\ud83d"}]}'),
        400,
        ["surrogate"],
        "messages",
    ),
    (
        "surrogate in content part",
        CHAT,
        raw('{"model":"fake","messages":[{"role":"user","content":[{"type":"text","text":"\\ud800"}]}]}'),
        400,
        ["surrogate"],
        "messages",
    ),
    (
        "surrogate in stop",
        COMP,
        raw('{"model":"fake","prompt":"a","stop":["\\ud800"]}'),
        400,
        ["surrogate"],
        "stop",
    ),
    ("surrogate in model", COMP, raw('{"model":"\\ud800","prompt":"a"}'), 400, ["surrogate"], "model"),
    (
        "surrogate in unknown field",
        COMP,
        raw('{"model":"fake","prompt":"a","user":"\\ud800"}'),
        400,
        ["surrogate"],
        None,
    ),
    (
        "surrogate in a key",
        COMP,
        raw('{"model":"fake","prompt":"a","\\ud800' + SECRET + '":1}'),
        400,
        ["surrogate"],
        None,
    ),
    (
        "valid pair is fine",
        COMP,
        raw('{"model":"fake","prompt":"a\\ud83d\\ude00","max_tokens":2}'),
        200,
        [],
        None,
    ),
    # ---- model ------------------------------------------------------------------------------------
    ("unknown model", COMP, comp(model=SECRET), 404, ["does not exist"], "model"),
    ("missing model", COMP, {"prompt": "a"}, 400, ["model"], "model"),
    ("model not a string", COMP, comp(model=42), 400, ["model"], "model"),
    ("null model", CHAT, chat(model=None), 400, ["model"], "model"),
    # ---- messages ---------------------------------------------------------------------------------
    ("no messages", CHAT, {"model": "fake"}, 400, ["messages"], "messages"),
    ("empty messages", CHAT, chat(messages=[]), 400, ["messages"], "messages"),
    ("messages a string", CHAT, chat(messages="hi"), 400, ["messages"], "messages"),
    ("bad role", CHAT, chat(messages=[{"role": SECRET, "content": "a"}]), 400, ["role"], "messages.0.role"),
    ("missing role", CHAT, chat(messages=[{"content": "a"}]), 400, ["role"], "messages.0.role"),
    ("content a number", CHAT, chat(messages=[{"role": "user", "content": 42}]), 400, ["content"], None),
    (
        "image part",
        CHAT,
        chat(messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]),
        400,
        ["content"],
        None,
    ),
    (
        "text part without text",
        CHAT,
        chat(messages=[{"role": "user", "content": [{"type": "text"}]}]),
        400,
        ["text"],
        None,
    ),
    ("message not an object", CHAT, chat(messages=["hi"]), 400, ["messages"], None),
    ("null content (edge)", CHAT, chat(messages=[{"role": "user", "content": None}]), 200, [], None),
    (
        "content parts (edge)",
        CHAT,
        chat(
            messages=[
                {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}
            ]
        ),
        200,
        [],
        None,
    ),
    (
        "all roles (edge)",
        CHAT,
        chat(
            messages=[
                {"role": r, "content": "x"} for r in ("system", "developer", "user", "assistant", "tool")
            ]
        ),
        200,
        [],
        None,
    ),
    (
        "unicode content (edge)",
        CHAT,
        chat(messages=[{"role": "user", "content": "héllo 世界 😀 \u0000"}]),
        200,
        [],
        None,
    ),
    (
        "messages too long",
        CHAT,
        chat(messages=[{"role": "user", "content": "x" * 300}]),
        400,
        ["context length"],
        "messages",
    ),
    (
        "many messages too long",
        CHAT,
        chat(messages=[{"role": "user", "content": "abc"}] * 100),
        400,
        ["context length"],
        "messages",
    ),
    # ---- prompt -------------------------------------------------------------------------------------
    ("no prompt", COMP, {"model": "fake"}, 400, ["prompt"], "prompt"),
    ("empty prompt", COMP, comp(prompt=""), 400, ["prompt"], "prompt"),
    ("empty id list", COMP, comp(prompt=[]), 400, ["prompt"], "prompt"),
    ("two prompts", COMP, comp(prompt=["a", "b"]), 400, ["one prompt"], "prompt"),
    ("empty nested list", COMP, comp(prompt=[[]]), 400, ["prompt"], "prompt"),
    ("float id", COMP, comp(prompt=[1.5]), 400, ["prompt"], None),
    ("negative id", COMP, comp(prompt=[5, -1]), 400, ["token ids"], "prompt"),
    ("id past vocab", COMP, comp(prompt=[5, 100_000]), 400, ["token ids"], "prompt"),
    ("id past int64", COMP, comp(prompt=[5, 2**70]), 400, ["digits"], None),
    ("prompt an object", COMP, comp(prompt={"x": 1}), 400, ["prompt"], None),
    ("prompt a number", COMP, comp(prompt=7), 400, ["prompt"], None),
    ("text too long", COMP, comp(prompt="a" * 300), 400, ["context length"], "prompt"),
    ("ids too long", COMP, comp(prompt=[5] * 300), 400, ["context length"], "prompt"),
    ("nested ids too long", COMP, comp(prompt=[[5] * 300]), 400, ["context length"], "prompt"),
    ("3 MB prompt", COMP, comp(prompt="a" * 3_000_000), 400, ["context length"], "prompt"),
    ("nested ids (edge)", COMP, comp(prompt=[[70, 71]]), 200, [], None),
    ("one-string list (edge)", COMP, comp(prompt=["abc"]), 200, [], None),
    ("longest prompt that fits (edge)", COMP, comp(prompt="a" * 252, max_tokens=3), 200, [], None),
    # ---- numbers ------------------------------------------------------------------------------------
    ("max_tokens 0", CHAT, chat(max_tokens=0), 400, ["max_tokens"], "max_tokens"),
    ("max_tokens -1", COMP, comp(max_tokens=-1), 400, ["max_tokens"], "max_tokens"),
    ("max_tokens string", CHAT, chat(max_tokens="ten"), 400, ["max_tokens"], "max_tokens"),
    ("max_tokens float", CHAT, chat(max_tokens=1.5), 400, ["max_tokens"], "max_tokens"),
    ("max_tokens bool", CHAT, chat(max_tokens=True), 400, ["max_tokens"], "max_tokens"),
    ("max_tokens 2**31", CHAT, chat(max_tokens=2**31), 400, ["max_tokens"], "max_tokens"),
    ("max_tokens 10**19", CHAT, chat(max_tokens=10**19), 400, ["max_tokens"], "max_tokens"),
    ("max_tokens past context", CHAT, chat(max_tokens=250), 400, ["context length"], "max_tokens"),
    (
        "max_completion_tokens 0",
        CHAT,
        chat(max_completion_tokens=0),
        400,
        ["max_completion_tokens"],
        "max_completion_tokens",
    ),
    (
        "max_completion_tokens 2**40",
        CHAT,
        chat(max_completion_tokens=2**40),
        400,
        ["max_completion_tokens"],
        "max_completion_tokens",
    ),
    ("max_tokens null (edge)", CHAT, chat(max_tokens=None, max_completion_tokens=2), 200, [], None),
    ("temperature -0.1", CHAT, chat(temperature=-0.1), 400, ["temperature"], "temperature"),
    ("temperature 2.5", CHAT, chat(temperature=2.5), 400, ["temperature"], "temperature"),
    ("temperature 1e308", CHAT, chat(temperature=1e308), 400, ["temperature"], "temperature"),
    ("temperature string", CHAT, chat(temperature="hot"), 400, ["temperature"], "temperature"),
    ("temperature bool", CHAT, chat(temperature=True), 400, ["temperature"], "temperature"),
    ("temperature 2 (edge)", CHAT, chat(temperature=2, seed=1), 200, [], None),
    ("top_p 0", COMP, comp(top_p=0), 400, ["top_p"], "top_p"),
    ("top_p 1.5", COMP, comp(top_p=1.5), 400, ["top_p"], "top_p"),
    ("top_p -1", COMP, comp(top_p=-1), 400, ["top_p"], "top_p"),
    ("top_p string", COMP, comp(top_p="x"), 400, ["top_p"], "top_p"),
    ("top_p tiny (edge)", COMP, comp(top_p=1e-300, temperature=1), 200, [], None),
    ("top_k -2", COMP, comp(top_k=-2), 400, ["top_k"], "top_k"),
    ("top_k 2**31", COMP, comp(top_k=2**31), 400, ["top_k"], "top_k"),
    ("top_k 2**63", CHAT, chat(top_k=2**63, stream=True), 400, ["top_k"], "top_k"),
    ("top_k float", COMP, comp(top_k=1.5), 400, ["top_k"], "top_k"),
    ("top_k string", COMP, comp(top_k="5"), 400, ["top_k"], "top_k"),
    ("top_k past vocab (edge)", COMP, comp(top_k=2**31 - 1, temperature=1), 200, [], None),
    ("top_k -1 (edge)", COMP, comp(top_k=-1, temperature=1), 200, [], None),
    ("seed 2**64", COMP, comp(seed=2**64), 400, ["seed"], "seed"),
    ("seed -2**64", COMP, comp(seed=-(2**64)), 400, ["seed"], "seed"),
    ("seed float", COMP, comp(seed=1.5), 400, ["seed"], "seed"),
    ("seed string", COMP, comp(seed="1"), 400, ["seed"], "seed"),
    ("seed negative (edge)", COMP, comp(seed=-5, temperature=1), 200, [], None),
    ("seed int64 max (edge)", COMP, comp(seed=2**63 - 1, temperature=1), 200, [], None),
    ("n 0", CHAT, chat(n=0), 400, ["n"], "n"),
    ("n 2", CHAT, chat(n=2), 400, ["n"], "n"),
    ("n -1", COMP, comp(n=-1), 400, ["n"], "n"),
    ("n 1 (edge)", COMP, comp(n=1), 200, [], None),
    ("min_tokens -1", COMP, comp(min_tokens=-1), 400, ["min_tokens"], "min_tokens"),
    ("min_tokens 2**31", COMP, comp(min_tokens=2**31), 400, ["min_tokens"], "min_tokens"),
    ("min_tokens > max_tokens", COMP, comp(min_tokens=5, max_tokens=2), 400, ["min_tokens"], "min_tokens"),
    ("min_tokens = max_tokens (edge)", COMP, comp(min_tokens=3, max_tokens=3), 200, [], None),
    # ---- other fields ------------------------------------------------------------------------------
    ("stream string", CHAT, chat(stream="yes"), 400, ["stream"], "stream"),
    ("stream int", CHAT, chat(stream=1), 400, ["stream"], "stream"),
    (
        "stream_options string",
        CHAT,
        chat(stream=True, stream_options="x"),
        400,
        ["stream_options"],
        "stream_options",
    ),
    (
        "include_usage string",
        CHAT,
        chat(stream=True, stream_options={"include_usage": "x"}),
        400,
        ["include_usage"],
        "stream_options.include_usage",
    ),
    ("five stops", COMP, comp(stop=["a", "b", "c", "d", "e"]), 400, ["stop"], "stop"),
    ("empty stop", COMP, comp(stop=[""]), 400, ["stop"], "stop"),
    ("empty stop string", COMP, comp(stop=""), 400, ["stop"], "stop"),
    ("stop too long", COMP, comp(stop=["x" * 300]), 400, ["stop"], "stop"),
    ("stop a number", COMP, comp(stop=42), 400, ["stop"], "stop"),
    ("stop list of numbers", COMP, comp(stop=[1]), 400, ["stop"], None),
    ("stop null (edge)", COMP, comp(stop=None), 200, [], None),
    ("ignore_eos string", COMP, comp(ignore_eos="true"), 400, ["ignore_eos"], "ignore_eos"),
    ("return_token_ids int", COMP, comp(return_token_ids=1), 400, ["return_token_ids"], "return_token_ids"),
    ("unknown field (edge)", COMP, comp(user="someone", metadata={"a": 1}), 200, [], None),
    # ---- HTTP ---------------------------------------------------------------------------------------
    ("GET on a POST route", COMP, "GET", 405, ["method"], None),
    ("unknown route", "/v1/nothing", comp(), 404, ["route"], None),
    ("8 MB prompt", COMP, comp(prompt="a" * 8_000_000), 413, ["body", "limit"], None),
    (
        "text/plain content type: 415 naming the header",
        COMP,
        "TEXT",
        415,
        ["content-type", "application/json"],
        "Content-Type",
    ),
    (
        "form-encoded body: 415 naming the header",
        COMP,
        "FORM",
        415,
        ["content-type", "application/json"],
        "Content-Type",
    ),
]

# Every unsupported field with a value that asks for something: a 400 naming it; with its no-op
# value: accepted.
ASKS = {
    "functions": [{"name": "f"}],
    "function_call": "auto",
    "guided_json": {"type": "object"},
    "guided_regex": "a+",
    "guided_choice": ["a"],
    "guided_grammar": "root ::= a",
    "prompt_logprobs": 1,
    "echo": True,
    "best_of": 2,
    "suffix": "tail",
    "presence_penalty": 0.5,
    "frequency_penalty": -0.5,
    "repetition_penalty": 1.2,
    "min_p": 0.1,
    "logit_bias": {"50": 100},
    "bad_words": ["x"],
}
assert set(ASKS) == set(UNSUPPORTED)
for _name, _value in ASKS.items():
    CASES.append((f"unsupported {_name}", CHAT, chat(**{_name: _value}), 400, [_name], _name))
    for _noop in (None, *UNSUPPORTED[_name]):
        CASES.append((f"{_name}={_noop!r} (edge)", COMP, comp(**{_name: _noop}), 200, [], None))
CASES.append(("logprobs true is not a count", COMP, comp(logprobs=True), 400, ["logprobs"], "logprobs"))
CASES.append(
    ("top_logprobs 21", CHAT, chat(logprobs=True, top_logprobs=21), 400, ["top_logprobs"], "top_logprobs")
)


@pytest.fixture
def server(fake_app, live_server):
    app, engine, sched = fake_app(max_slots=4, max_len=256, settings=ServerSettings(max_body_bytes=4_000_000))
    return live_server(app), engine, sched


def greedy(http: httpx.Client) -> tuple[str, list[int]]:
    body = comp(prompt="the same question", max_tokens=24, temperature=0, return_token_ids=True)
    r = http.post(COMP, json=body)
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["text"], r.json()["choices"][0]["token_ids"]


def send(http: httpx.Client, url: str, body) -> httpx.Response:
    if body == "GET":
        return http.get(url)
    if body == "TEXT":
        return http.post(url, content=json.dumps(comp()).encode(), headers={"content-type": "text/plain"})
    if body == "FORM":
        return http.post(url, data={"model": "m", "prompt": "hi"})
    if isinstance(body, bytes):
        return http.post(url, content=body, headers={"content-type": "application/json"})
    return http.post(url, json=body)


def test_abuse_suite(server):
    base, engine, sched = server
    assert len(CASES) >= 100
    failures, statuses = [], []
    with httpx.Client(base_url=base, timeout=DEADLINE_S) as http:
        before = greedy(http)
        for name, url, body, status, words, param in CASES:
            r = send(http, url, body)
            statuses.append(r.status_code)
            problem = None
            if r.status_code != status:
                problem = f"status {r.status_code} != {status}: {r.text[:200]}"
            elif status >= 400:
                err = r.json().get("error", {})
                msg = err.get("message", "")
                if set(err) != {"message", "type", "param", "code"} or not msg:
                    problem = f"not an OpenAI error body: {r.text[:200]}"
                elif words and not any(w.lower() in msg.lower() for w in words):
                    problem = f"message does not name {words}: {msg!r}"
                elif param is not None and err["param"] != param:
                    problem = f"param {err['param']!r} != {param!r}"
                elif SECRET in r.text or "Traceback" in r.text or "Error(" in r.text:
                    problem = f"error body echoes input or internals: {r.text[:200]}"
            if problem:
                failures.append(f"{name}: {problem}")
        wait_until(lambda: sched.num_active == 0 and sched.num_waiting == 0, what="slots and queue empty")
        after = greedy(http)
    assert not failures, "\n".join(failures)
    assert max(statuses) < 500
    assert after == before  # greedy output unchanged by the suite
    assert sched.num_active == 0 and sched.num_waiting == 0 and not sched.table.busy()
    assert engine.violations == []


def test_huge_content_length_is_refused_before_reading(server):
    """413 comes from the header alone: the server answers although the body never arrives."""
    base, _, _ = server
    host, port = base.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=DEADLINE_S) as s:
        s.sendall(
            b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b"Content-Length: 999999999999\r\n\r\n{"
        )
        head = s.recv(4096).decode()
    assert head.startswith("HTTP/1.1 413")


def test_chunked_body_over_the_limit_is_cut(server):
    base, _, sched = server

    def chunks():
        yield b'{"model": "fake", "prompt": "'
        for _ in range(50):
            yield b"a" * 100_000  # 5 MB in all, past the 4 MB limit; no Content-Length
        yield b'"}'

    with httpx.Client(base_url=base, timeout=DEADLINE_S) as http:
        r = http.post(COMP, content=chunks(), headers={"content-type": "application/json"})
    assert r.status_code == 413 and "limit" in r.json()["error"]["message"]


@pytest.mark.parametrize(
    ("what", "request_bytes"),
    [
        (
            "1 MB header",
            b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: " + b"a" * 1_000_000 + b"\r\n\r\n",
        ),
        ("garbage request line", b"\x00\xff NOT HTTP\r\n\r\n"),
        (
            "bad Content-Length",
            b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: -5\r\n\r\n",
        ),
        (
            "two Content-Lengths",
            b"POST /v1/completions HTTP/1.1\r\nHost: a\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n{}",
        ),
    ],
)
def test_malformed_http_is_a_4xx_and_harmless(server, what, request_bytes):
    base, _, sched = server
    host, port = base.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=DEADLINE_S) as s:
        s.sendall(request_bytes)
        head = s.recv(4096).decode("latin-1")
    assert head.startswith("HTTP/1.1 4"), (what, head[:80])
    assert httpx.post(base + COMP, json=comp(), timeout=DEADLINE_S).status_code == 200
