"""Running the app under uvicorn with connection limits and timeouts (what `serve` and the tests use).

uvicorn bounds header size (h11's 16 KB incomplete-event limit) and times out an idle keep-alive
connection after a response, but a connection that never completes a request head is never timed
out: 300 such connections stay open for ever, and with a low file-descriptor limit a normal request
can no longer be accepted. `GuardedH11Protocol` closes a connection that has no request in progress
`head_timeout_s` after it opened or after its last response (a slow-loris sending a byte at a time
is cut too, since the timer is not reset by data). A request whose head arrived is bounded by the
app instead (body deadline, queue and request deadlines).

`GuardedH11Protocol` also turns Nagle's algorithm off (TCP_NODELAY) on every TCP connection. asyncio
does that by itself only for sockets whose `proto` is IPPROTO_TCP, and `run_server` binds its own
socket (`socket.socket(family, SOCK_STREAM)`, proto 0), so its connections kept Nagle on: a stream's
first content chunk, written right after the response head, then waited for the client's delayed ACK
of the head (~40 ms on Linux) and reached the client together with the second token. Measured on the
2-core CPU host (small model, fixed workload, c=1): head and first chunk written 1.7 ms apart at the
end of the prefill, head read by the client at once, first chunk read 43 ms (median) after it was
written, so TTFT was prefill + ~45 ms; with TCP_NODELAY it is read 1.2 ms after. Every SSE chunk is
a small write, so with Nagle on any token (and the end of a stream) could wait for an ACK.

`StopOnEngineFailure` is the `ServerSettings.on_engine_failure` callback that stops uvicorn once
the engine watchdog trips, so the process can exit non-zero and a supervisor restart it.

`make_server` also sets uvicorn's `limit_concurrency` (503 past that many connections),
`timeout_keep_alive` and `timeout_graceful_shutdown` (after SIGTERM, connections still busy after
this many seconds are cancelled, so a client holding a half-sent body cannot keep the process alive),
and `raise_fd_limit` lifts the soft RLIMIT_NOFILE to the hard limit, as vLLM does.
"""

from __future__ import annotations

import asyncio
import logging
import resource
import socket

import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

log = logging.getLogger(__name__)


class GuardedH11Protocol(H11Protocol):
    head_timeout_s = 10.0  # set per server by make_server (a class attribute: uvicorn builds instances)

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        set_nodelay(transport)
        self._arm_head_timer()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._arm_head_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        timer = getattr(self, "_head_timer", None)
        if timer is not None:
            timer.cancel()
        super().connection_lost(exc)

    def _arm_head_timer(self) -> None:
        timer = getattr(self, "_head_timer", None)
        if timer is not None:
            timer.cancel()
        self._head_timer = self.loop.call_later(self.head_timeout_s, self._head_timeout)

    def _head_timeout(self) -> None:
        idle = self.cycle is None or self.cycle.response_complete
        if idle and not self.transport.is_closing():
            self.transport.close()


def set_nodelay(transport: asyncio.BaseTransport) -> None:
    """Send every write at once (TCP_NODELAY) on a TCP connection; other sockets are left alone."""
    sock = transport.get_extra_info("socket")
    if (
        sock is not None
        and sock.family in (socket.AF_INET, socket.AF_INET6)
        and sock.type == socket.SOCK_STREAM
    ):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


class StopOnEngineFailure:
    """Records why the engine failed and asks `server` (set once it exists) to shut down."""

    def __init__(self) -> None:
        self.reason: str | None = None
        self.server: uvicorn.Server | None = None

    def __call__(self, reason: str) -> None:
        self.reason = reason
        if self.server is not None:
            self.server.should_exit = True


def make_server(
    app,
    *,
    head_timeout_s: float = 10.0,
    keep_alive_s: float = 5.0,
    graceful_shutdown_s: float = 5.0,
    max_connections: int = 1000,
    log_level: str = "info",
) -> uvicorn.Server:
    protocol = type("GuardedH11", (GuardedH11Protocol,), {"head_timeout_s": head_timeout_s})
    config = uvicorn.Config(
        app,
        http=protocol,
        log_level=log_level,
        lifespan="on",
        limit_concurrency=max_connections,
        timeout_keep_alive=int(max(1, keep_alive_s)),
        timeout_graceful_shutdown=int(max(1, graceful_shutdown_s)),
        h11_max_incomplete_event_size=16 * 1024,
    )
    return uvicorn.Server(config)


def raise_fd_limit() -> int:
    """Lift the soft open-files limit to the hard one; returns the limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        target = hard if hard != resource.RLIM_INFINITY else max(soft, 65536)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError) as exc:
            log.warning("could not raise the open-files limit from %d: %s", soft, exc)
    return soft
