"""`g4bench serve` argument handling (model loading itself needs the lead's loader)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time

import httpx
import pytest
from typer.testing import CliRunner

from g4bench.cli import app


def test_serve_help_lists_options():
    r = CliRunner().invoke(app, ["serve", "--help"])
    assert r.exit_code == 0
    for opt in ("--model", "--kv-dtype", "--max-slots", "--max-len", "--host", "--port", "--api-key"):
        assert opt in r.output
    assert "--chunk-size" in r.output and "--sliding-kv" in r.output


def test_serve_rejects_bad_choices_before_loading():
    r = CliRunner().invoke(app, ["serve", "--kv-dtype", "fp4"])
    assert r.exit_code == 2 and "kv-dtype" in r.output
    r = CliRunner().invoke(app, ["serve", "--sliding-kv", "circle"])
    assert r.exit_code == 2


def test_serve_warns_on_a_public_bind_without_a_key(monkeypatch):
    monkeypatch.delenv("G4BENCH_API_KEY", raising=False)
    r = CliRunner().invoke(app, ["serve", "--host", "0.0.0.0", "--model", "no-such-model.json"])
    assert "without an API key" in r.output  # printed before the model is loaded (which fails here)
    monkeypatch.setenv("G4BENCH_API_KEY", "k")
    r = CliRunner().invoke(app, ["serve", "--host", "0.0.0.0", "--model", "no-such-model.json"])
    assert "without an API key" not in r.output


def test_serve_rejects_bad_limits_and_key_files(tmp_path):
    r = CliRunner().invoke(app, ["serve", "--api-key-file", str(tmp_path / "missing")])
    assert r.exit_code == 2 and "cannot read" in r.output
    r = CliRunner().invoke(app, ["serve", "--max-body-bytes", "0"])
    assert r.exit_code == 2 and "max_body_bytes" in r.output
    r = CliRunner().invoke(app, ["serve", "--max-waiting", "-1"])
    assert r.exit_code == 2


@pytest.mark.slow
def test_serve_process_end_to_end(tmp_path):
    """The real command in a child process: bind port 0, /health 503 -> 200 after warm-up, one request."""
    pytest.importorskip("g4bench.engine.loading")
    cmd = [
        sys.executable,
        "-c",
        "from g4bench.cli import app; app()",
        "serve",
        "--model",
        "configs/models/tiny-a.json",
    ]
    cmd += ["--port", "0", "--max-slots", "2", "--max-len", "128", "--chunk-size", "16"]
    proc = subprocess.Popen(
        cmd, stderr=subprocess.PIPE, text=True, env={**os.environ, "JAX_PLATFORMS": "cpu"}
    )
    lines: list[str] = []
    threading.Thread(target=lambda: lines.extend(proc.stderr), daemon=True).start()
    try:
        deadline = time.monotonic() + 120
        port = None
        while port is None:
            assert time.monotonic() < deadline and proc.poll() is None, "".join(lines)
            m = re.search(r"http://127\.0\.0\.1:(\d+)", "".join(lines))
            port = int(m.group(1)) if m else None
            time.sleep(0.05)
        base = f"http://127.0.0.1:{port}"
        while True:
            assert time.monotonic() < deadline, "".join(lines)
            try:
                if httpx.get(f"{base}/health").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.05)
        body = {"model": "configs/models/tiny-a.json", "prompt": "hi", "max_tokens": 3, "ignore_eos": True}
        r = httpx.post(f"{base}/v1/completions", json=body, timeout=60)
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 3
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(30)
