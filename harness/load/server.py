"""The server under test: start our own `g4bench serve` in a child process, or check a given URL.

Self-started (no --url): `g4bench serve --model M --max-slots N --max-len L --host 127.0.0.1 --port P`
runs in its own process group on a free loopback port, with stdout/stderr to `server.log` in the run
folder. We poll GET /health until 200 (503 means still warming up / compiling) under a deadline,
failing early with the log's tail if the child exits. `ManagedServer.stop` (called from a `finally`,
so also on Ctrl-C and errors) sends SIGTERM to the whole group, then SIGKILL after a grace period.

Any server (--url): `wait_ready` first waits while GET /health answers 503 (a server still warming up
would otherwise put its compile time into the first requests' TTFT); then GET /v1/models must
answer and list --model-name; otherwise `ServerError` with a message that says what to fix.
`alive()` is the mid-run liveness probe the runner calls after a connection-level failure: a dead
child or a refused /health means the server is gone.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

from harness.isolate import host_tuning_env

DEFAULT_CPU_MODEL = "small"  # synthetic preset sized for a 2-core CPU (named by the lead)
DEFAULT_ACCEL_MODEL = "e2b"


class ServerError(RuntimeError):
    """The server is unreachable, not ready, or does not serve the requested model."""


def has_accelerator() -> bool:
    """A TPU or NVIDIA GPU on this host, judged from device files (importing jax here would grab it)."""
    dev = Path("/dev")
    return any(dev.glob("accel*")) or any(dev.glob("vfio/[0-9]*")) or (dev / "nvidia0").exists()


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def serve_command(
    model: str, max_slots: int, max_len: int, port: int, prefill_policy: str | None = None,
    draft_model: str | None = None, spec_k: int = 0,
) -> list[str]:  # fmt: skip
    """The child command line: `g4bench.server.launch` run with a `LaunchSpec` (by value, not by the
    serve command's flag names), loopback only."""
    from g4bench.server.launch import LaunchSpec

    spec = LaunchSpec(model=model, max_slots=max_slots, max_len=max_len, host="127.0.0.1", port=port,
                      prefill_policy=prefill_policy, draft_model=draft_model, spec_k=spec_k)  # fmt: skip
    return [sys.executable, "-m", "g4bench.server.launch", spec.to_json()]


def _tail(path: Path, n: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return ""


class ManagedServer:
    """A child server process: `start()` → ready at `base_url`; `stop()` always safe to call."""

    def __init__(self, cmd: list[str], port: int, log_path: Path, startup_timeout_s: float = 600.0) -> None:
        self.cmd, self.port, self.log_path = cmd, port, log_path
        self.startup_timeout_s = startup_timeout_s
        self.base_url = f"http://127.0.0.1:{port}"
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "ab")  # noqa: SIM115 - owned by the child for its lifetime
        env = host_tuning_env()  # the same malloc tuning as every measuring child (harness/isolate.py)
        self.proc = subprocess.Popen(
            self.cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
        log.close()
        deadline = time.monotonic() + self.startup_timeout_s
        last = "no answer yet"
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise ServerError(
                    f"server exited with code {self.proc.returncode} during startup; "
                    f"log {self.log_path}:\n{_tail(self.log_path)}"
                )
            try:
                r = httpx.get(self.base_url + "/health", timeout=2.0)
                if r.status_code == 200:
                    return
                last = f"/health returned {r.status_code}"
            except httpx.HTTPError as e:
                last = f"{type(e).__name__}"
            time.sleep(0.2)
        raise ServerError(
            f"server not ready after {self.startup_timeout_s:g} s ({last}); log {self.log_path}:\n"
            f"{_tail(self.log_path)}"
        )

    def exited(self) -> bool:
        return self.proc is not None and self.proc.poll() is not None

    def stop(self, grace_s: float = 10.0) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                return
            try:
                self.proc.wait(timeout=wait)
                return
            except subprocess.TimeoutExpired:
                continue


READY_TIMEOUT_S = 600.0


def wait_ready(base_url: str, timeout_s: float = READY_TIMEOUT_S, poll_s: float = 0.5) -> str:
    """Wait until GET /health stops answering 503 (warming up); returns what was seen.

    "ready": /health answered 200. "no /health": 404/405, a server without the endpoint (we go on).
    "unreachable": no answer at all (`check_server` then says so). Still 503 (or another 5xx) after
    `timeout_s` → `ServerError`, so a run never starts against a server that is compiling."""
    url = base_url.rstrip("/") + "/health"
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            code = httpx.get(url, timeout=5.0).status_code
        except httpx.HTTPError:
            return "unreachable"
        if code == 200:
            return "ready"
        if code in (404, 405):
            return "no /health"
        if code < 500:
            return f"/health {code}"
        if time.monotonic() >= deadline:
            raise ServerError(f"{url} still answers HTTP {code} after {timeout_s:g} s; is the server warming up or stuck?")
        time.sleep(poll_s)


def check_server(base_url: str, model_name: str | None, api_key: str | None = None) -> str:
    """Verify the server answers /v1/models and serves `model_name` (default: its first model)."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else None
    try:
        r = httpx.get(base_url.rstrip("/") + "/v1/models", timeout=10.0, headers=headers)
    except httpx.HTTPError as e:
        raise ServerError(
            f"cannot reach a server at {base_url} ({type(e).__name__}: {e}); is it running?"
        ) from e
    if r.status_code != 200:
        raise ServerError(f"{base_url}/v1/models returned HTTP {r.status_code}: {r.text[:300]}")
    try:
        ids = [m["id"] for m in r.json()["data"]]
    except (ValueError, KeyError, TypeError) as e:
        raise ServerError(f"{base_url}/v1/models did not return an OpenAI model list: {r.text[:300]}") from e
    if not ids:
        raise ServerError(f"{base_url} serves no models")
    if model_name is None:
        return ids[0]
    if model_name not in ids:
        raise ServerError(f"{base_url} does not serve model {model_name!r}; it serves {ids}")
    return model_name


async def alive(client: httpx.AsyncClient, base_url: str, server: ManagedServer | None) -> bool:
    """Whether the server still answers (any HTTP status counts as alive)."""
    if server is not None and server.exited():
        return False
    try:
        await client.get(base_url + "/health", timeout=3.0)
        return True
    except httpx.HTTPError:
        return False
