"""Bar `server-strict-content-type`: POST bodies must be `application/json`, CORS is closed unless
configured. A web page can send text/plain, form-encoded and multipart bodies cross-origin without
a preflight; each must get 415 naming the header (and never reach the engine), while JSON bodies
(with or without `charset=utf-8`) are served."""

from __future__ import annotations

import json

import pytest
from fastapi.testclient import TestClient

from g4bench.server.settings import ServerSettings

BODY = {"model": "fake", "prompt": "hello", "max_tokens": 2, "temperature": 0}
RAW = json.dumps(BODY).encode()
REFUSED = [
    ("text/plain", {"content": RAW, "headers": {"content-type": "text/plain"}}),
    ("text/plain;charset=UTF-8", {"content": RAW, "headers": {"content-type": "text/plain;charset=UTF-8"}}),
    ("form-encoded", {"data": {"model": "fake", "prompt": "hello"}}),
    ("form-encoded, JSON as the body", {"content": RAW, "headers": {"content-type": "application/x-www-form-urlencoded"}}),
    ("multipart", {"files": {"f": ("a.json", RAW, "application/json")}}),
    ("no content type", {"content": RAW, "headers": {"content-type": ""}}),
    ("json lookalike", {"content": RAW, "headers": {"content-type": "application/jsonp"}}),
    ("json in latin-1", {"content": RAW, "headers": {"content-type": "application/json; charset=latin-1"}}),
]  # fmt: skip


@pytest.fixture
def client(fake_app):
    app, engine, sched = fake_app()
    with TestClient(app) as c:
        c.engine, c.sched = engine, sched
        yield c


@pytest.mark.parametrize("endpoint", ["/v1/completions", "/v1/chat/completions"])
@pytest.mark.parametrize(("what", "kwargs"), REFUSED, ids=[w for w, _ in REFUSED])
def test_non_json_bodies_get_415_naming_the_header(client, endpoint, what, kwargs):
    r = client.post(endpoint, **kwargs)
    assert r.status_code == 415, (what, r.text)
    err = r.json()["error"]
    assert err["param"] == "Content-Type" and err["code"] == "unsupported_media_type"
    assert "Content-Type" in err["message"] and "application/json" in err["message"]
    assert client.sched.num_active == 0 and client.sched.num_waiting == 0 and not client.engine.calls


@pytest.mark.parametrize(
    "ctype", ["application/json", "application/json; charset=utf-8", 'Application/JSON;charset="UTF-8"']
)
def test_json_bodies_are_served(client, ctype):
    r = client.post("/v1/completions", content=RAW, headers={"content-type": ctype})
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] == 2


def test_get_endpoints_need_no_content_type(client):
    assert client.get("/v1/models").status_code == 200
    assert client.get("/health").status_code == 200


def test_cors_closed_by_default(client):
    """No CORS headers: a browser shows no other origin's page the reply, and the JSON preflight fails."""
    r = client.options(
        "/v1/completions",
        headers={"origin": "https://evil.example", "access-control-request-method": "POST",
                 "access-control-request-headers": "content-type"},
    )  # fmt: skip
    assert r.status_code >= 400 and "access-control-allow-origin" not in r.headers
    r = client.post("/v1/completions", json=BODY, headers={"origin": "https://evil.example"})
    assert r.status_code == 200 and "access-control-allow-origin" not in r.headers


def test_cors_opens_only_for_configured_origins(fake_app):
    app, _, _ = fake_app(settings=ServerSettings(cors_origins=("https://app.example",)))
    pre = {"access-control-request-method": "POST", "access-control-request-headers": "content-type"}
    with TestClient(app) as c:
        ok = c.options("/v1/completions", headers={"origin": "https://app.example", **pre})
        assert ok.status_code == 200 and ok.headers["access-control-allow-origin"] == "https://app.example"
        bad = c.options("/v1/completions", headers={"origin": "https://evil.example", **pre})
        assert bad.headers.get("access-control-allow-origin") != "https://evil.example"
        r = c.post(
            "/v1/completions",
            content=RAW,
            headers={"origin": "https://app.example", "content-type": "text/plain"},
        )
        assert r.status_code == 415  # CORS configured or not, the body must be JSON


def test_cors_wildcard_needs_an_api_key():
    with pytest.raises(ValueError, match="API key"):
        ServerSettings(cors_origins=("*",))
    assert ServerSettings(cors_origins=("*",), api_key="k").cors_origins == ("*",)
