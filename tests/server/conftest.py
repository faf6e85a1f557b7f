"""Fixtures for server tests: apps over the fake engine, and a real uvicorn server on a free port.

`live_server(app)` runs uvicorn (through `transport.make_server`, as `serve` does) in a background
thread on 127.0.0.1 port 0 (the socket is bound first, so the port is known), waits for `server.started` with a deadline (no fixed sleeps), and
shuts it down after the test.
"""

from __future__ import annotations

import socket
import threading
import time

import pytest

from g4bench.engine.scheduler import Scheduler
from g4bench.server.app import create_app
from g4bench.server.settings import ServerSettings
from g4bench.server.synthetic_tokenizer import SyntheticTokenizer
from tests.server.fake_engine import FakeEngine

DEADLINE_S = 15.0


def wait_until(pred, timeout: float = DEADLINE_S, what: str = "condition") -> None:
    end = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > end:
            raise AssertionError(f"{what} not reached within {timeout} s")
        time.sleep(0.002)


@pytest.fixture
def fake_app():
    """make(warm=True, max_waiting=64, settings=None, **engine_kw) -> (app, engine, scheduler)."""
    scheds = []

    def make(warm=True, max_waiting=64, settings: ServerSettings | None = None, **engine_kw):
        engine = FakeEngine(**engine_kw)
        if not warm:
            engine.warmup_gate = threading.Event()
        sched = Scheduler(engine, max_waiting=max_waiting).start()
        scheds.append((sched, engine))
        if warm:
            assert sched.wait_ready(DEADLINE_S)
        app = create_app(sched, SyntheticTokenizer(engine.cfg.vocab_size), "fake", settings)
        return app, engine, sched

    yield make
    for sched, engine in scheds:
        if engine.warmup_gate is not None:
            engine.warmup_gate.set()
        if engine.decode_gate is not None:
            engine.decode_gate.set()
        sched.stop()


def start_server(app):
    """(base URL "http://127.0.0.1:PORT", stop()) for uvicorn serving `app` in a thread."""
    _, url, stop = start_uvicorn(app)
    return url, stop


def start_uvicorn(app):
    """(uvicorn server, base URL, stop()): `start_server` with the server object, whose
    `server_state.connections` holds the live connections' protocols."""
    from g4bench.server.transport import make_server

    # bound as `run_server` binds its socket (protocol 0, so asyncio leaves Nagle on by itself)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = make_server(app, log_level="warning")  # `serve`'s transport: limits and timeouts
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()

    def stop() -> None:
        server.should_exit = True
        thread.join(DEADLINE_S)
        sock.close()

    wait_until(lambda: server.started or not thread.is_alive(), what="uvicorn startup")
    assert server.started, "uvicorn failed to start"
    return server, f"http://127.0.0.1:{port}", stop


@pytest.fixture
def live_server():
    """serve(app) -> base URL "http://127.0.0.1:PORT"; stopped at teardown."""
    stops = []

    def serve(app) -> str:
        url, stop = start_server(app)
        stops.append(stop)
        return url

    yield serve
    for stop in stops:
        stop()
