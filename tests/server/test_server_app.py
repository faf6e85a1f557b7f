"""The HTTP layer over the fake engine, in process (FastAPI TestClient).

Expected outputs are computed by hand from the fake's rule (`reference`) and the synthetic tokenizer,
so every test checks exact text, token ids and usage, not just status codes.
"""

from __future__ import annotations

import json

import pytest
from fastapi.testclient import TestClient

from g4bench.server.chat import ChatFormatter
from g4bench.server.settings import ServerSettings
from g4bench.server.synthetic_tokenizer import SyntheticTokenizer
from tests.server.conftest import DEADLINE_S, wait_until
from tests.server.fake_engine import reference

TOK = SyntheticTokenizer(512)
FMT = ChatFormatter(TOK)
STOP_IDS = (0, 1)


def chat_body(content="hello", **kw):
    return {"model": "fake", "messages": [{"role": "user", "content": content}], "temperature": 0, **kw}


def expected_chat(messages, max_tokens, eos_mod=0):
    prompt = FMT.encode(messages)
    ids = reference(prompt, max_tokens, eos_mod=eos_mod, stop_ids=STOP_IDS)
    return prompt, ids, TOK.decode(ids)


def sse_events(lines) -> list:
    events = []
    for line in lines:
        if line.startswith("data: "):
            data = line[len("data: ") :]
            events.append(data if data == "[DONE]" else json.loads(data))
    return events


@pytest.fixture
def client(fake_app):
    app, engine, sched = fake_app(max_len=256)
    with TestClient(app) as c:
        c.engine, c.sched = engine, sched
        yield c


def test_health_flips_after_warmup(fake_app):
    app, engine, sched = fake_app(warm=False)
    with TestClient(app) as c:
        r = c.get("/health")
        assert r.status_code == 503 and r.json()["status"] == "loading"
        engine.warmup_gate.set()
        wait_until(lambda: c.get("/health").status_code == 200, what="/health 200")
        assert c.get("/v1/models").json()["data"][0]["id"] == "fake"


def test_chat_non_streaming_exact(client):
    msgs = [{"role": "user", "content": "hello"}]
    prompt, ids, text = expected_chat(msgs, 12)
    r = client.post("/v1/chat/completions", json=chat_body(max_tokens=12, return_token_ids=True))
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["object"] == "chat.completion" and body["model"] == "fake"
    choice = body["choices"][0]
    assert choice["message"] == {"role": "assistant", "content": text}
    assert choice["finish_reason"] == "length" and choice["token_ids"] == ids
    assert body["prompt_token_ids"] == prompt
    assert body["usage"] == {
        "prompt_tokens": len(prompt),
        "completion_tokens": 12,
        "total_tokens": len(prompt) + 12,
        "prompt_tokens_details": {"cached_tokens": 0},
    }
    plain = client.post("/v1/chat/completions", json=chat_body(max_tokens=12)).json()
    assert "token_ids" not in plain["choices"][0] and "prompt_token_ids" not in plain


@pytest.mark.parametrize("prompt", ["abc def", [70, 71, 72, 73], ["abc def"]])
def test_completions_prompt_forms(client, prompt):
    ids_in = (
        TOK.encode(prompt if isinstance(prompt, str) else prompt[0])
        if not isinstance(prompt[0], int)
        else prompt
    )
    r = client.post(
        "/v1/completions", json={"model": "fake", "prompt": prompt, "max_tokens": 7, "temperature": 0}
    )
    assert r.status_code == 200, r.text
    body = r.json()
    ids = reference(ids_in, 7, stop_ids=STOP_IDS)
    assert body["object"] == "text_completion" and body["choices"][0]["text"] == TOK.decode(ids)
    assert body["usage"]["prompt_tokens"] == len(ids_in)


@pytest.mark.parametrize("endpoint", ["chat", "completions"])
def test_streaming_equals_non_streaming(client, endpoint):
    if endpoint == "chat":
        url, body = "/v1/chat/completions", chat_body("stream me", max_tokens=20)
    else:
        url, body = (
            "/v1/completions",
            {"model": "fake", "prompt": "stream me", "max_tokens": 20, "temperature": 0},
        )
    whole = client.post(url, json=body).json()
    stream_body = {
        **body,
        "stream": True,
        "stream_options": {"include_usage": True},
        "return_token_ids": True,
    }
    with client.stream("POST", url, json=stream_body) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        events = sse_events(r.iter_lines())
    assert events[-1] == "[DONE]"
    usage_chunk, finish_chunk = events[-2], events[-3]
    assert usage_chunk["choices"] == []
    usage = usage_chunk["usage"]
    assert usage["completion_tokens"] == whole["usage"]["completion_tokens"] == 20
    # The same prompt again: everything but its last token is reused from the resident slot.
    assert usage["prompt_tokens_details"]["cached_tokens"] == usage["prompt_tokens"] - 1
    assert finish_chunk["choices"][0]["finish_reason"] == "length"
    assert "token_ids" not in finish_chunk["choices"][0]
    content = events[:-3]
    # vLLM's form: every token rides on its own chunk; the first chunk carries the prompt's ids.
    assert content[0]["prompt_token_ids"] == TOK.encode("stream me") or endpoint == "chat"
    assert "prompt_token_ids" in content[0] and all("prompt_token_ids" not in e for e in content[1:])
    with_ids = [e["choices"][0]["token_ids"] for e in content if "token_ids" in e["choices"][0]]
    assert all(len(ids) == 1 for ids in with_ids) and len(with_ids) == 20
    whole_ids = client.post(url, json={**body, "return_token_ids": True}).json()["choices"][0]["token_ids"]
    assert [i for ids in with_ids for i in ids] == whole_ids
    if endpoint == "chat":
        assert content[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
        assert all(e["object"] == "chat.completion.chunk" for e in content)
        text = "".join(e["choices"][0]["delta"].get("content", "") for e in content)
        assert text == whole["choices"][0]["message"]["content"]
        assert finish_chunk["choices"][0]["delta"] == {}
    else:
        text = "".join(e["choices"][0]["text"] for e in content)
        assert text == whole["choices"][0]["text"]
    assert len({e["id"] for e in events[:-1]}) == 1


def test_next_chat_turn_reuses_resident_prefix(client):
    turn1 = [{"role": "user", "content": "first question"}]
    prompt1, ids1, text1 = expected_chat(turn1, 10)
    r1 = client.post("/v1/chat/completions", json={**chat_body(max_tokens=10), "messages": turn1}).json()
    assert r1["choices"][0]["message"]["content"] == text1
    turn2 = turn1 + [{"role": "assistant", "content": text1}, {"role": "user", "content": "and then?"}]
    prompt2, ids2, text2 = expected_chat(turn2, 10)
    r2 = client.post("/v1/chat/completions", json={**chat_body(max_tokens=10), "messages": turn2}).json()
    assert r2["choices"][0]["message"]["content"] == text2  # same as a cold prefill of the whole prompt
    assert r2["usage"]["prompt_tokens_details"]["cached_tokens"] == len(prompt1) + len(ids1) - 1
    assert client.engine.violations == []


def test_stop_string_and_eos(fake_app):
    app, engine, sched = fake_app(eos_mod=9)
    msgs = [{"role": "user", "content": "x"}]
    prompt, ids, text = expected_chat(msgs, 60, eos_mod=9)
    assert ids[-1] == 1 and len(ids) < 60
    with TestClient(app) as c:
        r = c.post("/v1/chat/completions", json=chat_body("x", max_tokens=60)).json()
        assert r["choices"][0]["finish_reason"] == "stop" and r["choices"][0]["message"]["content"] == text
        assert r["usage"]["completion_tokens"] == len(ids)
        stop = text[3:5]
        cut = text.find(stop)
        r = c.post("/v1/chat/completions", json=chat_body("x", max_tokens=60, stop=[stop])).json()
        assert r["choices"][0]["message"]["content"] == text[:cut]
        assert r["choices"][0]["finish_reason"] == "stop" and r["usage"]["completion_tokens"] == cut + len(
            stop
        )
        body = chat_body("x", max_tokens=len(ids) + 3, ignore_eos=True)
        r = c.post("/v1/chat/completions", json=body).json()
        assert (
            r["choices"][0]["finish_reason"] == "length" and r["usage"]["completion_tokens"] == len(ids) + 3
        )


BAD_REQUESTS = [
    ("malformed JSON", "/v1/chat/completions", b'{"model": "fake", "messages": [', 400, None),
    ("not an object", "/v1/chat/completions", b"[1, 2]", 400, None),
    ("wrong type", "/v1/chat/completions", {**chat_body(), "max_tokens": "ten"}, 400, "max_tokens"),
    (
        "wrong temperature type",
        "/v1/chat/completions",
        {**chat_body(), "temperature": "hot"},
        400,
        "temperature",
    ),
    ("unknown model", "/v1/chat/completions", {**chat_body(), "model": "gpt-9"}, 404, "model"),
    ("n > 1", "/v1/chat/completions", {**chat_body(), "n": 2}, 400, "n"),
    ("empty messages", "/v1/chat/completions", {**chat_body(), "messages": []}, 400, "messages"),
    (
        "bad role",
        "/v1/chat/completions",
        {**chat_body(), "messages": [{"role": "x", "content": "a"}]},
        400,
        None,
    ),
    ("max_tokens 0", "/v1/chat/completions", {**chat_body(), "max_tokens": 0}, 400, "max_tokens"),
    (
        "max_tokens < 0",
        "/v1/completions",
        {"model": "fake", "prompt": "a", "max_tokens": -3},
        400,
        "max_tokens",
    ),
    ("too long", "/v1/chat/completions", {**chat_body(), "max_tokens": 250}, 400, "max_tokens"),
    ("prompt too long", "/v1/completions", {"model": "fake", "prompt": "a" * 300}, 400, "prompt"),
    ("bad token id", "/v1/completions", {"model": "fake", "prompt": [5, 100000]}, 400, "prompt"),
    ("empty prompt", "/v1/completions", {"model": "fake", "prompt": ""}, 400, "prompt"),
    ("two prompts", "/v1/completions", {"model": "fake", "prompt": ["a", "b"]}, 400, "prompt"),
    (
        "min > max",
        "/v1/completions",
        {"model": "fake", "prompt": "a", "max_tokens": 2, "min_tokens": 5},
        400,
        None,
    ),
    ("missing model", "/v1/completions", {"prompt": "a"}, 400, "model"),
]


@pytest.mark.parametrize(
    ("why", "url", "body", "status", "param"), BAD_REQUESTS, ids=[b[0] for b in BAD_REQUESTS]
)
def test_bad_input_gets_openai_error(client, why, url, body, status, param):
    kw = (
        {"content": body, "headers": {"content-type": "application/json"}}
        if isinstance(body, bytes)
        else {"json": body}
    )
    r = client.post(url, **kw)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    if param is not None:
        assert err["param"] == param, err
    # The server keeps serving, and nothing is left holding a slot.
    ok = client.post(
        "/v1/completions", json={"model": "fake", "prompt": "a", "max_tokens": 2, "temperature": 0}
    )
    assert ok.status_code == 200
    wait_until(lambda: client.sched.num_active == 0, what="slots free")


def test_malformed_json_message_names_the_problem(client):
    r = client.post("/v1/completions", content=b"{nope", headers={"content-type": "application/json"})
    assert r.status_code == 400 and "malformed JSON" in r.json()["error"]["message"]
    assert client.get("/v1/nothing").json()["error"]["code"] == "404"


def test_api_key(fake_app):
    app, _, _ = fake_app(settings=ServerSettings(api_key="sekrit"))
    with TestClient(app) as c:
        body = {"model": "fake", "prompt": "a", "max_tokens": 2}
        r = c.post("/v1/completions", json=body)
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
        r = c.post("/v1/completions", json=body, headers={"Authorization": "Bearer wrong"})
        assert r.status_code == 401 and "invalid" in r.json()["error"]["message"]
        r = c.post("/v1/completions", content=b"{bad", headers={"Authorization": "Bearer nope"})
        assert r.status_code == 401  # the key is checked before the body is parsed
        for scheme in ("Bearer", "bearer", "BEARER"):  # the scheme is case-insensitive (RFC 7235)
            r = c.post("/v1/completions", json=body, headers={"Authorization": f"{scheme} sekrit"})
            assert r.status_code == 200, scheme
        assert c.get("/health").status_code == 200  # health and (by default) metrics need no key
        assert c.get("/metrics").status_code == 200


def test_queue_full_is_429_with_retry_after(fake_app):
    """One slot busy (its decode blocked), one request waiting: the next is refused with 429."""
    import threading

    app, engine, sched = fake_app(max_waiting=1, max_slots=1)
    engine.decode_gate = threading.Event()
    body = {"model": "fake", "prompt": "a", "max_tokens": 2, "temperature": 0}
    with TestClient(app) as c:
        t1 = threading.Thread(target=c.post, args=("/v1/completions",), kwargs={"json": body})
        t1.start()
        wait_until(lambda: sched.num_active == 1, what="slot taken")
        t2 = threading.Thread(target=c.post, args=("/v1/completions",), kwargs={"json": body})
        t2.start()
        wait_until(lambda: sched.num_waiting == 1, what="one waiting")
        r = c.post("/v1/completions", json=body)
        assert r.status_code == 429 and r.json()["error"]["type"] == "rate_limit_exceeded"
        assert r.headers["retry-after"] == "1"
        engine.decode_gate.set()
        t1.join(DEADLINE_S)
        t2.join(DEADLINE_S)


def test_engine_error_is_500_and_server_survives(fake_app):
    app, engine, sched = fake_app(poison_token=ord("!") + 3)
    with TestClient(app) as c:
        bad = {"model": "fake", "prompt": "boom!", "max_tokens": 3}
        r = c.post("/v1/completions", json=bad)
        # A generation failure is a 500 whose body names no internal detail (that goes to the log).
        assert r.status_code == 500 and "poisoned" not in r.text
        assert r.json()["error"]["message"].startswith("generation failed")
        with c.stream("POST", "/v1/completions", json={**bad, "stream": True}) as r:
            assert r.status_code == 500  # the first event is awaited before the stream starts
        ok = c.post("/v1/completions", json={"model": "fake", "prompt": "fine", "max_tokens": 3})
        assert ok.status_code == 200 and sched.alive


def test_dead_loop_flips_health(fake_app):
    app, engine, sched = fake_app()
    with TestClient(app) as c:
        c.post("/v1/completions", json={"model": "fake", "prompt": "abc", "max_tokens": 2, "temperature": 0})

        def boom(cached, common):
            raise AssertionError("bug")

        engine.can_resume = boom
        r = c.post("/v1/completions", json={"model": "fake", "prompt": "abcd", "max_tokens": 2})
        assert r.status_code == 503 and r.headers["retry-after"] == "5"
        wait_until(lambda: not sched.alive, what="loop death")
        h = c.get("/health")
        assert h.status_code == 503 and h.json() == {"status": "error", "reason": "the engine loop died"}
        r = c.post("/v1/completions", json={"model": "fake", "prompt": "abcd", "max_tokens": 2})
        assert r.status_code == 503 and "bug" not in r.text


def test_metrics(client):
    client.post("/v1/chat/completions", json=chat_body(max_tokens=5))
    client.post("/v1/chat/completions", json={**chat_body(), "n": 3})
    text = client.get("/metrics").text
    assert 'g4bench_requests_total{endpoint="chat",status="length"} 1.0' in text
    assert 'g4bench_prompt_tokens_total{kind="computed"}' in text
    assert "g4bench_generation_tokens_total 5.0" in text
    for name in ("time_to_first_token_seconds", "time_per_output_token_seconds", "queue_time_seconds"):
        assert f"g4bench_{name}_count 1.0" in text
    assert "g4bench_batch_occupancy_count 4.0" in text  # 5 tokens: 1 from prefill + 4 decode steps
    assert 'g4bench_requests_total{endpoint="chat",status="invalid"} 1.0' in text
    assert "g4bench_active_slots 0.0" in text and "g4bench_waiting_requests 0.0" in text


def test_app_over_a_bare_engine_owns_its_scheduler():
    from g4bench.server.app import create_app
    from tests.server.fake_engine import FakeEngine

    app = create_app(FakeEngine(), TOK, "fake")
    sched = app.state.scheduler
    with TestClient(app) as c:
        wait_until(lambda: c.get("/health").status_code == 200, what="/health 200")
        r = c.post(
            "/v1/completions", json={"model": "fake", "prompt": "ab", "max_tokens": 3, "temperature": 0}
        )
        assert r.json()["choices"][0]["text"] == TOK.decode(reference(TOK.encode("ab"), 3, stop_ids=STOP_IDS))
    assert not sched.alive  # stopped at shutdown


def test_openapi_documents_request_bodies(client):
    """The endpoints parse their own bodies (bounded, off the event loop); the docs still show them."""
    doc = client.get("/openapi.json").json()
    for path, model in (
        ("/v1/chat/completions", "ChatCompletionRequest"),
        ("/v1/completions", "CompletionRequest"),
    ):
        body = doc["paths"][path]["post"]["requestBody"]["content"]["application/json"]["schema"]
        assert body == {"$ref": f"#/components/schemas/{model}"}
        assert "max_tokens" in doc["components"]["schemas"][model]["properties"]
    assert "TextPart" in doc["components"]["schemas"]  # nested models resolve too
