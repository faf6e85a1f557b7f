"""Engine faults, deadlines, admission and access control, over a real uvicorn server on 127.0.0.1.

Faults are injected into the fake engine: a BaseException from `decode` kills the engine loop, and
`decode_gate` makes decode block (a stalled device call). Every client waiting at that moment must
get its answer — HTTP 503, or an error event if its stream had already started — within 2 s, and
/health must say 503 within 2 s. Waits are bounded polls, never fixed sleeps.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from g4bench.engine.scheduler import GenerationParams, QueueFull
from g4bench.server.security import is_loopback, resolve_api_key
from g4bench.server.settings import API_KEY_ENV, LOOPBACK_HOSTS, ServerSettings
from tests.server.conftest import DEADLINE_S, wait_until

COMP = "/v1/completions"
ANSWER_S = 2.0


class _Die(BaseException):
    """Not an Exception: what used to kill the engine thread without a trace."""


def body(prompt: str, n: int, stream: bool) -> dict:
    return {"model": "fake", "prompt": prompt, "max_tokens": n, "ignore_eos": True, "stream": stream}


def answer(base: str, b: dict, out: list, started: threading.Event | None = None) -> None:
    """POST and record (status, error payload or None, monotonic time of the answer)."""
    with httpx.Client(base_url=base, timeout=DEADLINE_S) as http, http.stream("POST", COMP, json=b) as r:
        if r.status_code != 200:
            r.read()
            out.append((r.status_code, r.json()["error"], time.monotonic()))
            return
        error = None
        for line in r.iter_lines():
            if started is not None:
                started.set()
            if line.startswith('data: {"error"'):
                error = json.loads(line[6:])["error"]
        out.append((200, error, time.monotonic()))


def fault_run(fake_app, live_server, inject, settings=None):
    """Two streams under way, two more requests running and three waiting (4 slots); inject the
    fault; collect every client's answer and the time /health turned 503."""
    app, engine, sched = fake_app(
        max_slots=4, max_len=4096, step_delay_s=0.005, settings=settings or ServerSettings()
    )
    base = live_server(app)
    out: list = []
    started = [threading.Event() for _ in range(2)]
    threads = [threading.Thread(target=answer, args=(base, body(f"s{i}", 3000, True), out, started[i])) for i in range(2)]  # fmt: skip
    for t in threads:
        t.start()
    for e in started:
        assert e.wait(DEADLINE_S)
    more = [threading.Thread(target=answer, args=(base, body(f"w{i}", 3000, i % 2 == 0), out)) for i in range(5)]  # fmt: skip
    for t in more:
        t.start()
    threads += more
    wait_until(lambda: sched.num_active == 4 and sched.num_waiting == 3, what="4 running, 3 waiting")
    t0 = time.monotonic()
    inject(engine)
    with httpx.Client(base_url=base, timeout=DEADLINE_S) as http:
        wait_until(lambda: http.get("/health").status_code == 503, timeout=ANSWER_S, what="/health 503")
        health_s = time.monotonic() - t0
        health = http.get("/health").json()
    for t in threads:
        t.join(DEADLINE_S)
    assert len(out) == 7
    return out, t0, health_s, health, base, sched


def check_all_answered(out, t0):
    latest = max(t for _, _, t in out) - t0
    assert latest < ANSWER_S, f"last client answered after {latest:.2f} s"
    for status, error, _ in out:
        if status == 200:  # the stream had started: an error event names the failure
            assert error is not None and error["code"] == "engine_failed", error
        else:
            assert status == 503 and error["code"] == "engine_failed", (status, error)
    assert sum(status == 503 for status, _, _ in out) >= 3  # at least the 3 queued ones got 503
    return latest


def test_engine_death_answers_every_waiting_client(fake_app, live_server):
    def inject(engine):
        engine.decode_error = _Die("engine thread killed")

    out, t0, health_s, health, base, sched = fault_run(fake_app, live_server, inject)
    latest = check_all_answered(out, t0)
    assert health == {"status": "error", "reason": "the engine loop died"} and health_s < ANSWER_S
    r = httpx.post(base + COMP, json=body("x", 2, False), timeout=DEADLINE_S)
    assert r.status_code == 503 and r.headers["retry-after"] == "5"
    print(f"engine death: all 7 clients answered within {latest:.3f} s, /health 503 after {health_s:.3f} s")


def test_engine_stall_trips_the_watchdog(fake_app, live_server):
    tripped = []

    def inject(engine):
        engine.decode_gate = threading.Event()  # the next decode never returns (until teardown)

    settings = ServerSettings(engine_stall_s=0.5, on_engine_failure=tripped.append)
    out, t0, health_s, health, base, sched = fault_run(fake_app, live_server, inject, settings)
    latest = check_all_answered(out, t0)
    assert health["status"] == "error" and "no progress" in health["reason"] and health_s < ANSWER_S
    assert len(tripped) == 1  # the serve command exits non-zero from this callback
    r = httpx.post(base + COMP, json=body("x", 2, False), timeout=DEADLINE_S)
    assert r.status_code == 503
    print(f"engine stall: all 7 clients answered within {latest:.3f} s, /health 503 after {health_s:.3f} s")


def test_queue_and_request_deadlines_are_504(fake_app, live_server):
    app, engine, sched = fake_app(
        max_slots=1, max_len=4096, step_delay_s=0.002,
        settings=ServerSettings(queue_timeout_s=0.3, request_timeout_s=1.0),
    )  # fmt: skip
    base = live_server(app)
    out: list = []
    with ThreadPoolExecutor(3) as pool:
        busy = pool.submit(answer, base, body("long", 3000, False), out)
        wait_until(lambda: sched.num_active == 1, what="slot taken")
        t0 = time.monotonic()
        r = httpx.post(base + COMP, json=body("queued", 2, False), timeout=DEADLINE_S)
        assert r.status_code == 504 and "slot" in r.json()["error"]["message"]
        assert 0.25 < time.monotonic() - t0 < ANSWER_S
        busy.result()
    status, error, _ = out[0]
    assert status == 504 and "did not finish" in error["message"]
    # A stream that outlives the request deadline ends with an error event and [DONE].
    with httpx.stream("POST", base + COMP, json=body("long", 3000, True), timeout=DEADLINE_S) as r:
        lines = [line for line in r.iter_lines() if line]
    assert r.status_code == 200 and lines[-1] == "data: [DONE]" and "did not finish" in lines[-2]
    wait_until(lambda: sched.num_active == 0 and sched.num_waiting == 0, what="freed")


def test_admission_counts_idle_slots():
    """max_waiting=0 admits into idle slots; a burst is refused only past idle slots + max_waiting."""
    from g4bench.engine.scheduler import Scheduler
    from tests.server.fake_engine import FakeEngine

    class Null:
        def on_token(self, t):
            return False

        def on_finish(self, r):
            pass

    for max_waiting in (0, 2):
        engine = FakeEngine(max_slots=4)
        engine.warmup_gate = threading.Event()  # the engine thread admits nothing while warming up
        sched = Scheduler(engine, max_waiting=max_waiting).start()
        try:
            for _ in range(4 + max_waiting):
                sched.submit([5, 6], GenerationParams(max_tokens=2), Null())
            with pytest.raises(QueueFull):
                sched.submit([5, 6], GenerationParams(max_tokens=2), Null())
        finally:
            engine.warmup_gate.set()
            sched.stop()


def test_max_waiting_zero_serves_when_idle(fake_app, live_server):
    app, engine, sched = fake_app(max_slots=4, max_waiting=0)
    base = live_server(app)
    with ThreadPoolExecutor(4) as pool:
        rs = list(pool.map(lambda i: httpx.post(base + COMP, json=body(f"p{i}", 8, False)), range(4)))
    assert [r.status_code for r in rs] == [200] * 4


def test_no_admission_while_warming_up(fake_app, live_server):
    app, engine, sched = fake_app(warm=False)
    base = live_server(app)
    r = httpx.post(base + COMP, json=body("x", 2, False), timeout=DEADLINE_S)
    assert r.status_code == 503 and r.json()["error"]["code"] == "loading" and r.headers["retry-after"] == "5"
    assert sched.num_waiting == 0  # nothing was queued behind the warm-up
    h = httpx.get(base + "/health")
    assert h.status_code == 503 and h.headers["retry-after"] == "5"


def test_half_sent_body_times_out_with_408(fake_app, live_server):
    app, engine, sched = fake_app(settings=ServerSettings(body_timeout_s=0.5))
    base = live_server(app)
    host, port = base.removeprefix("http://").split(":")
    t0 = time.monotonic()
    with socket.create_connection((host, int(port)), timeout=DEADLINE_S) as s:
        s.sendall(
            b'POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{"mod'
        )
        head = s.recv(4096).decode()
    assert head.startswith("HTTP/1.1 408") and time.monotonic() - t0 < ANSWER_S


def test_host_allow_list_blocks_dns_rebinding(fake_app, live_server):
    app, _, _ = fake_app(settings=ServerSettings(allowed_hosts=LOOPBACK_HOSTS | {"gpu-box"}))
    base = live_server(app)
    port = base.rsplit(":", 1)[1]
    for host, status in [
        ("evil.example", 400), (f"evil.example:{port}", 400), ("127.0.0.1.evil.example", 400),
        (f"127.0.0.1:{port}", 200), ("localhost", 200), ("LOCALHOST:1", 200), (f"[::1]:{port}", 200),
        ("gpu-box", 200),
    ]:  # fmt: skip
        r = httpx.get(base + "/v1/models", headers={"Host": host})
        assert r.status_code == status, host
        if status == 400:
            assert r.json()["error"]["code"] == "bad_host" and "evil" not in r.text


def test_docs_and_metrics_behind_the_key(fake_app, live_server):
    app, _, _ = fake_app(settings=ServerSettings(api_key="k3y", protect_docs=True))
    base = live_server(app)
    for path in ("/metrics", "/docs", "/openapi.json", "/v1/models"):
        assert httpx.get(base + path).status_code == 401, path
        assert httpx.get(base + path, headers={"Authorization": "bearer k3y"}).status_code == 200, path
    assert httpx.get(base + "/health").status_code == 200  # probes need no key
    assert httpx.get(base + "/v1/models", headers={"Authorization": "Basic k3y"}).status_code == 401


def test_api_key_sources(tmp_path, monkeypatch):
    monkeypatch.delenv(API_KEY_ENV, raising=False)
    assert resolve_api_key(None, None) is None
    assert resolve_api_key("cli", None) == "cli"
    monkeypatch.setenv(API_KEY_ENV, " from-env \n")
    assert resolve_api_key("cli", None) == "from-env"
    f = tmp_path / "key"
    f.write_text("from-file\n")
    assert resolve_api_key("cli", f) == "from-file"
    f.write_text("  ")
    with pytest.raises(ValueError, match="empty"):
        resolve_api_key(None, f)
    with pytest.raises(ValueError, match="cannot read"):
        resolve_api_key(None, tmp_path / "missing")
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("192.168.1.5")
