"""A real uvicorn server (127.0.0.1, port 0) over the fake engine: the official `openai` client,
concurrent HTTP requests, and clients that disconnect mid-request."""

from __future__ import annotations

import socket
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest

from g4bench.server.chat import ChatFormatter
from g4bench.server.synthetic_tokenizer import SyntheticTokenizer
from tests.server.conftest import DEADLINE_S, start_uvicorn, wait_until
from tests.server.fake_engine import reference

TOK = SyntheticTokenizer(512)
FMT = ChatFormatter(TOK)


def cancelled(base: str) -> float:
    """How many completions requests the server counted as cancelled."""
    for line in httpx.get(f"{base}/metrics").text.splitlines():
        if line.startswith('g4bench_requests_total{endpoint="completions",status="cancelled"}'):
            return float(line.split()[-1])
    return 0.0


@pytest.fixture
def served(fake_app, live_server):
    app, engine, sched = fake_app(max_slots=4, max_len=4096, step_delay_s=0.0005)
    base = live_server(app)
    client = openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0, timeout=DEADLINE_S)
    return base, client, engine, sched


def test_openai_client_chat_and_completions(served):
    base, client, engine, sched = served
    msgs = [{"role": "user", "content": "Say something."}]
    want = TOK.decode(reference(FMT.encode(msgs), 16, stop_ids=(0, 1)))

    r = client.chat.completions.create(model="fake", messages=msgs, max_tokens=16, temperature=0)
    assert r.choices[0].message.content == want and r.choices[0].finish_reason == "length"
    assert r.usage.completion_tokens == 16 and r.usage.prompt_tokens_details.cached_tokens >= 0

    stream = client.chat.completions.create(
        model="fake",
        messages=msgs,
        max_tokens=16,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == want
    assert chunks[-1].usage.completion_tokens == 16

    prompt_ids = TOK.encode("Once upon")
    want = TOK.decode(reference(prompt_ids, 12, stop_ids=(0, 1)))
    r = client.completions.create(model="fake", prompt="Once upon", max_tokens=12, temperature=0)
    assert r.choices[0].text == want and r.usage.prompt_tokens == len(prompt_ids)
    stream = client.completions.create(
        model="fake", prompt="Once upon", max_tokens=12, temperature=0, stream=True
    )
    assert "".join(c.choices[0].text for c in stream if c.choices) == want

    assert [m.id for m in client.models.list().data] == ["fake"]
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="nope", messages=msgs)
    with pytest.raises(openai.BadRequestError, match="max_tokens"):
        client.chat.completions.create(model="fake", messages=msgs, max_tokens=0)
    assert engine.violations == []


@pytest.mark.parametrize("n", [2, 4, 8])
def test_concurrent_http_requests_match_alone(served, n):
    base, client, engine, sched = served
    prompts = [[{"role": "user", "content": f"question {i} " + "x" * (7 * i)}] for i in range(n)]
    lengths = [5 + 4 * i for i in range(n)]

    def ask(i):
        return client.chat.completions.create(
            model="fake", messages=prompts[i], max_tokens=lengths[i], temperature=0, stream=i % 2 == 0
        )

    with ThreadPoolExecutor(n) as pool:
        results = list(pool.map(ask, range(n)))
    for i, r in enumerate(results):
        text = r.choices[0].message.content if i % 2 else "".join(c.choices[0].delta.content or "" for c in r)
        assert text == TOK.decode(reference(FMT.encode(prompts[i]), lengths[i], stop_ids=(0, 1))), i
    assert engine.violations == []
    wait_until(lambda: sched.num_active == 0, what="slots free")


def test_stream_disconnect_frees_slot(served):
    base, client, engine, sched = served
    body = {"model": "fake", "prompt": "forever", "max_tokens": 3000, "ignore_eos": True, "stream": True}
    with (
        httpx.Client(base_url=base, timeout=DEADLINE_S) as http,
        http.stream("POST", "/v1/completions", json=body) as r,
    ):
        lines = r.iter_lines()
        got = [next(lines) for _ in range(6)]
        assert any(line.startswith("data: ") for line in got)
        assert sched.num_active == 1
    wait_until(lambda: sched.num_active == 0, what="slot freed after disconnect")
    assert not sched.table.busy()
    wait_until(lambda: cancelled(base) == 1, what="request counted as cancelled")
    r = client.completions.create(model="fake", prompt="still here", max_tokens=4, temperature=0)
    assert r.choices[0].text == TOK.decode(reference(TOK.encode("still here"), 4, stop_ids=(0, 1)))


def test_non_streaming_disconnect_frees_slot(served):
    base, client, engine, sched = served
    host, port = base.removeprefix("http://").split(":")
    payload = b'{"model": "fake", "prompt": "long", "max_tokens": 3000, "ignore_eos": true}'
    head = (
        f"POST /v1/completions HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(payload)}\r\n\r\n"
    ).encode()
    with socket.create_connection((host, int(port)), timeout=DEADLINE_S) as s:
        s.sendall(head + payload)
        wait_until(lambda: sched.num_active == 1, what="request running")
    wait_until(lambda: sched.num_active == 0, what="slot freed after disconnect")
    wait_until(lambda: cancelled(base) == 1, what="request counted as cancelled")
    assert client.completions.create(model="fake", prompt="ok", max_tokens=2).usage.completion_tokens == 2


def test_garbage_on_the_wire_does_not_hurt(served):
    base, client, engine, sched = served
    host, port = base.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=DEADLINE_S) as s:
        s.sendall(b"\x00\xffNOT HTTP AT ALL\r\n\r\n")
        s.recv(1024)
    r = client.completions.create(model="fake", prompt="ok", max_tokens=2)
    assert r.usage.completion_tokens == 2


@pytest.mark.parametrize("endpoint", ["/v1/completions", "/v1/chat/completions"])
def test_load_client_counts_per_chunk_token_ids(served, endpoint):
    """serve-load's client against our stream: one id per chunk (vLLM's form), counted exactly,
    also while a stop string holds text back (chunks with ids but no text)."""
    import asyncio
    import time

    from harness.load.client import RequestSpec, stream_request

    base, client, engine, sched = served
    body = {"model": "fake", "max_tokens": 12, "temperature": 0, "return_token_ids": True, "stop": ["~~~"]}
    body |= {"prompt": "count me"} if endpoint == "/v1/completions" else {"messages": [{"role": "user", "content": "count me"}]}  # fmt: skip
    whole = httpx.post(base + endpoint, json=body, timeout=DEADLINE_S).json()

    async def go():
        async with httpx.AsyncClient() as c:
            spec = RequestSpec(endpoint, body, request_id="x")
            return await stream_request(
                c, base, spec, t0=time.perf_counter(), scheduled_s=0.0, timeout_s=DEADLINE_S
            )

    rec = asyncio.run(go())
    assert rec.ok and rec.chunk_tokens_source == "token_ids"
    assert rec.output_ids == whole["choices"][0]["token_ids"] and rec.completion_tokens == len(rec.output_ids)
    assert sum(rec.chunk_tokens) == rec.completion_tokens and set(rec.chunk_tokens) <= {0, 1}


def test_connections_send_without_nagle(fake_app):
    """Every SSE chunk is a small write: with Nagle on, a stream's first content chunk waited for the
    client's delayed ACK of the response head (~40 ms on Linux; g4bench/server/transport.py). asyncio
    sets TCP_NODELAY only on sockets bound with protocol IPPROTO_TCP, which `serve`'s is not."""
    app, _, _ = fake_app()
    server, base, stop = start_uvicorn(app)
    try:
        with httpx.Client(timeout=DEADLINE_S) as client:  # keep-alive: the connection stays open
            assert client.get(f"{base}/health").status_code == 200
            conns = list(server.server_state.connections)
            assert conns
            for conn in conns:
                sock = conn.transport.get_extra_info("socket")
                assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 1
    finally:
        stop()
