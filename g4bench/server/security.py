"""Access control as pure ASGI middleware (no BaseHTTPMiddleware: it would break streaming and
disconnect detection); both run before the body is read.

- `HostAllowList`: a request whose Host header names a host outside the list gets 400. A server on
  127.0.0.1 is otherwise reachable from any web page through DNS rebinding (evil.example resolving
  to 127.0.0.1): the browser sends `Host: evil.example`, which the list refuses.
- `ApiKeyAuth`: `Authorization: Bearer KEY` (scheme case-insensitive, RFC 7235; key compared in
  constant time) on /v1/* and, when asked, on /metrics and the API docs. /health stays open.
- `JsonOnly`: a POST to /v1/* must say `Content-Type: application/json` (a `charset`, if given,
  utf-8), else 415 naming the header. A web page can send `text/plain`, form-encoded or multipart
  bodies to any server without a CORS preflight; JSON needs one, which an unconfigured server
  never answers (no CORS middleware unless `ServerSettings.cors_origins` names origins), so with
  this check no page can make a local server generate.
- `resolve_api_key`: the key from `--api-key-file`, the G4BENCH_API_KEY environment variable or
  `--api-key` (visible in `ps`; kept for convenience), in that order of preference.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

from g4bench.server.errors import APIError
from g4bench.server.settings import API_KEY_ENV

DOC_PATHS = ("/metrics", "/docs", "/redoc", "/openapi.json")


def _header(scope, name: bytes) -> bytes | None:
    for key, value in scope["headers"]:
        if key == name:
            return value
    return None


def host_name(host_header: str) -> str:
    """The host name of a Host header: 127.0.0.1:8000 -> 127.0.0.1, [::1]:80 -> ::1, LocalHost -> localhost."""
    h = host_header.strip().lower()
    if h.startswith("["):
        return h[1 : h.find("]")] if "]" in h else h
    return h.rsplit(":", 1)[0] if h.count(":") == 1 else h


class HostAllowList:
    def __init__(self, app, allowed: frozenset[str]) -> None:
        self.app, self.allowed = app, frozenset(h.lower() for h in allowed)

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http":
            raw = _header(scope, b"host")
            if raw is not None and host_name(raw.decode("latin-1")) not in self.allowed:
                err = APIError(
                    400, "the Host header names a host this server does not answer for", code="bad_host"
                )
                await err.response()(scope, receive, send)
                return
        await self.app(scope, receive, send)


JSON_TYPE = "application/json"


def json_content_type_error(value: bytes | None) -> str | None:
    """Why a Content-Type header value does not announce a UTF-8 JSON body (None when it does)."""
    if value is None:
        return f"the request has no Content-Type header; send Content-Type: {JSON_TYPE}"
    text = value.decode("latin-1")
    media, *params = (part.strip() for part in text.split(";"))
    if media.lower() != JSON_TYPE:
        return f"Content-Type {text!r} is not accepted; send Content-Type: {JSON_TYPE}"
    for param in params:
        key, _, val = param.partition("=")
        if key.strip().lower() == "charset" and val.strip().strip('"').lower() not in ("utf-8", "utf8"):
            return f"Content-Type charset {val.strip()!r} is not accepted; send Content-Type: {JSON_TYPE} (UTF-8)"
    return None


class JsonOnly:
    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST" and scope["path"].startswith("/v1/"):
            reason = json_content_type_error(_header(scope, b"content-type"))
            if reason is not None:
                err = APIError(415, reason, param="Content-Type", code="unsupported_media_type")
                await err.response()(scope, receive, send)
                return
        await self.app(scope, receive, send)


class ApiKeyAuth:
    def __init__(self, app, api_key: str, protect_docs: bool = False) -> None:
        self.app, self.key, self.protect_docs = app, api_key.encode(), protect_docs

    def _protected(self, path: str) -> bool:
        return path.startswith("/v1/") or (self.protect_docs and path.startswith(DOC_PATHS))

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http" and self._protected(scope["path"]):
            got = _header(scope, b"authorization") or b""
            scheme, _, key = got.strip().partition(b" ")
            ok = scheme.lower() == b"bearer" and secrets.compare_digest(key.strip(), self.key)
            if not ok:
                msg = "missing API key" if not got else "invalid API key"
                await APIError(401, msg, code="invalid_api_key").response()(scope, receive, send)
                return
        await self.app(scope, receive, send)


def resolve_api_key(cli_key: str | None, key_file: Path | None) -> str | None:
    """The key to require, or None. Raises ValueError for an unreadable or empty key file."""
    if key_file is not None:
        try:
            key = key_file.read_text().strip()
        except OSError as exc:
            raise ValueError(f"cannot read --api-key-file {key_file}: {exc.strerror}") from exc
        if not key:
            raise ValueError(f"--api-key-file {key_file} is empty")
        return key
    env = os.environ.get(API_KEY_ENV, "").strip()
    if env:
        return env
    return cli_key or None


def is_loopback(host: str) -> bool:
    import ipaddress

    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
