"""`ServerSettings`: every limit and security knob of one server, with the defaults `serve` uses.

Defaults follow what production servers do (TGI's 2 MB payload limit, uvicorn's 5 s keep-alive),
scaled to an agent server on one chip:

- `max_body_bytes` 4 MiB: a request body larger than this is refused (413) before it is read.
- `body_timeout_s` 30: the whole body must arrive within this (408), so a client that sends half a
  body and stalls holds nothing for long.
- `queue_timeout_s` 120: a request still waiting for a slot after this gets 504.
- `request_timeout_s` 1800: a request not finished after this is cancelled with 504 (an error
  event in a stream already under way).
- `engine_stall_s` 60: no engine-loop progress for this long while requests exist trips the
  watchdog (longer than any single prefill chunk or decode step should take; raise it for very
  slow hosts).
- `retry_after_s` 1 (429: the queue is full) and `unavailable_retry_after_s` 5 (503: warming up or
  failed) are sent as `Retry-After`.
- `api_key`: required as `Authorization: Bearer KEY` on /v1/* (and on /metrics, /docs, /redoc and
  /openapi.json with `protect_docs`). /health stays open for probes.
- `allowed_hosts`: Host header names accepted (None: any). `serve` sets the loopback names when it
  binds a loopback address, which defeats DNS rebinding from a browser.
- `cors_origins`: origins whose web pages may call the API (CORS); None (the default): no CORS
  headers at all, so a browser lets no other origin's page send the JSON the API requires.
  POST bodies must be `Content-Type: application/json` in every case (415 otherwise).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

API_KEY_ENV = "G4BENCH_API_KEY"
LOOPBACK_HOSTS = frozenset({"localhost", "127.0.0.1", "::1"})


@dataclass(frozen=True)
class ServerSettings:
    max_body_bytes: int = 4 * 1024 * 1024
    body_timeout_s: float = 30.0
    queue_timeout_s: float = 120.0
    request_timeout_s: float = 1800.0
    engine_stall_s: float = 60.0
    retry_after_s: int = 1
    unavailable_retry_after_s: int = 5
    api_key: str | None = None
    protect_docs: bool = False
    allowed_hosts: frozenset[str] | None = None
    prepare_workers: int = 2
    cors_origins: tuple[str, ...] | None = None
    # Called once when the engine watchdog trips (the serve command stops uvicorn and exits non-zero).
    on_engine_failure: Callable[[str], None] | None = None

    def __post_init__(self) -> None:
        positive = {
            "max_body_bytes": self.max_body_bytes,
            "body_timeout_s": self.body_timeout_s,
            "queue_timeout_s": self.queue_timeout_s,
            "request_timeout_s": self.request_timeout_s,
            "engine_stall_s": self.engine_stall_s,
            "prepare_workers": self.prepare_workers,
        }
        for name, value in positive.items():
            if not value > 0:
                raise ValueError(f"{name} must be > 0, got {value}")
        if self.cors_origins is not None and "*" in self.cors_origins and self.api_key is None:
            raise ValueError("cors_origins '*' lets every web page use the server: set an API key too")
        if self.api_key is not None and not self.api_key.strip():
            raise ValueError("the API key is empty")
