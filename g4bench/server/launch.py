"""Start a server from one `LaunchSpec`: load the engine, build the app, bind, run until stopped.

Data flow::

    LaunchSpec (model, engine shape, limits, security) ──run_server──▶
        load_engine → tokenizer → Scheduler → create_app(ServerSettings) → transport.make_server
        bind the socket, print what is served where, run uvicorn until SIGINT/SIGTERM
        ──▶ exit status: 0, 2 when the draft model cannot serve (speculation), or 3 when the engine
            died or stalled (`exit_on_engine_failure`)

Two callers: the `g4bench serve` command (which maps its flags onto a spec) and the harness, which
starts a server for a load test as a child process with ``python -m g4bench.server.launch
'<spec json>'`` — a function call by value, never through the command line's flag names. The API
key never travels in the spec (it would show in `ps`): the child reads it from $G4BENCH_API_KEY.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, fields
from typing import Any

from g4bench.engine.served_step import DEFAULT_MAX_BATCHED_TOKENS, ServedStep, check_speculation
from g4bench.server.settings import API_KEY_ENV, ServerSettings

DEFAULTS = ServerSettings()
ENGINE_FAILURE_EXIT = 3


@dataclass(frozen=True)
class LaunchSpec:
    """Everything one server is started with (the key aside: see the module docstring)."""

    model: str = "e2b"
    kv_dtype: str = "bf16"
    max_slots: int = 8
    max_len: int = 8192
    chunk_size: int = 256
    sliding_kv: str = "ring"
    kv_layout: str = "paged"  # paged: blocks shared across requests (radix index); contiguous: per slot
    cached_windows: int = 4  # paged: sliding-layer windows kept cached per slot
    max_batched_tokens: int = DEFAULT_MAX_BATCHED_TOKENS  # one engine call's token budget (decode + prefill)
    prefill_policy: str | None = None  # mixed | chunk; None: mixed when paged (ServedStep.policy)
    host: str = "127.0.0.1"
    port: int = 8000
    protect_docs: bool = False
    allowed_hosts: tuple[str, ...] = ()
    max_waiting: int = 64
    max_body_bytes: int = DEFAULTS.max_body_bytes
    body_timeout_s: float = DEFAULTS.body_timeout_s
    queue_timeout_s: float = DEFAULTS.queue_timeout_s
    request_timeout_s: float = DEFAULTS.request_timeout_s
    engine_stall_s: float = DEFAULTS.engine_stall_s
    exit_on_engine_failure: bool = True
    max_connections: int = 1000
    idle_timeout_s: float = 10.0
    shutdown_timeout_s: float = 5.0
    served_model_name: str | None = None
    draft_model: str | None = None  # speculative decoding: a model with the target's vocabulary
    spec_k: int = 0  # drafts verified per round (0: off; needs draft_model)

    def __post_init__(self) -> None:
        if self.kv_dtype not in ("bf16", "int8"):
            raise ValueError(f"kv_dtype must be bf16 or int8, got {self.kv_dtype!r}")
        if self.sliding_kv not in ("ring", "full"):
            raise ValueError(f"sliding_kv must be ring or full, got {self.sliding_kv!r}")
        if (self.spec_k > 0) != (self.draft_model is not None):
            raise ValueError("speculative decoding needs both --draft-model and --spec-k >= 1")
        if self.spec_k < 0:
            raise ValueError(f"spec_k must be >= 0, got {self.spec_k}")
        if self.spec_k and self.prefill_policy == "mixed":
            raise ValueError("speculative decoding runs the chunk prefill policy, not mixed")
        if self.spec_k:
            check_speculation(self.spec_k, chunk_size=self.chunk_size, kv_layout=self.kv_layout,
                              sliding_kv=self.sliding_kv)  # fmt: skip
        self.step()  # validates layout, sliding KV, KV dtype, token budget and prefill policy together
        if self.prefill_policy == "mixed" and self.kv_layout != "paged":
            raise ValueError("prefill_policy mixed needs kv_layout paged (the contiguous layout runs chunk)")
        if self.max_waiting < 0:
            raise ValueError(f"max_waiting must be >= 0, got {self.max_waiting}")
        positive = {"max_connections": self.max_connections, "idle_timeout_s": self.idle_timeout_s,
                    "shutdown_timeout_s": self.shutdown_timeout_s}  # fmt: skip
        for name, value in positive.items():
            if not value > 0:
                raise ValueError(f"{name} must be > 0, got {value}")

    def step(self) -> ServedStep:
        """The served step this server runs (what a profile must be fitted on to predict it)."""
        return ServedStep.served(kv_layout=self.kv_layout, sliding_kv=self.sliding_kv, kv_dtype=self.kv_dtype,
                                 chunk_size=self.chunk_size, max_batched_tokens=self.max_batched_tokens,
                                 prefill_policy="chunk" if self.spec_k else self.prefill_policy)  # fmt: skip

    def server_settings(self, api_key: str | None, on_engine_failure: Any = None) -> ServerSettings:
        """The app's limits and security for this spec (raises ValueError on a bad limit)."""
        from g4bench.server.security import is_loopback
        from g4bench.server.settings import LOOPBACK_HOSTS

        hosts = frozenset(self.allowed_hosts)
        return ServerSettings(
            max_body_bytes=self.max_body_bytes,
            body_timeout_s=self.body_timeout_s,
            queue_timeout_s=self.queue_timeout_s,
            request_timeout_s=self.request_timeout_s,
            engine_stall_s=self.engine_stall_s,
            api_key=api_key,
            protect_docs=self.protect_docs,
            allowed_hosts=(LOOPBACK_HOSTS | hosts) if is_loopback(self.host) else (hosts or None),
            on_engine_failure=on_engine_failure,
        )

    def to_json(self) -> str:
        return json.dumps({f.name: getattr(self, f.name) for f in fields(self)})

    @classmethod
    def from_json(cls, text: str) -> LaunchSpec:
        data: dict[str, Any] = json.loads(text)
        unknown = set(data) - {f.name for f in fields(cls)}
        if unknown:
            raise ValueError(f"unknown launch settings {sorted(unknown)}")
        if "allowed_hosts" in data:
            data["allowed_hosts"] = tuple(data["allowed_hosts"])
        return cls(**data)


def speculation(spec: LaunchSpec, target: Any) -> Any:
    """The `SpecDecoder` for `spec.draft_model` (None without speculation): a draft engine with the
    target's slots and positions, contiguous with full-length sliding KV (its rejected drafts are
    overwritten the next round; see g4bench/engine/spec_batch.py)."""
    if not spec.spec_k or spec.draft_model is None:
        return None
    from g4bench.engine.engine_config import EngineConfig
    from g4bench.engine.loading import load_engine
    from g4bench.engine.spec_batch import SpecDecoder
    from g4bench.model.drafter import is_assistant

    if is_assistant(spec.draft_model):
        raise ValueError(
            f"{spec.draft_model} is a Gemma 4 assistant drafter: it drafts from the target's hidden state "
            "and KV, which the serving engine does not hand out yet; serve a draft model with the "
            "target's vocabulary instead (any preset or checkpoint)"
        )
    ecfg = EngineConfig(max_slots=spec.max_slots, max_len=spec.max_len, kv_dtype=spec.kv_dtype,
                        chunk_size=spec.chunk_size, kv_layout="contiguous", sliding_kv="full")  # fmt: skip
    draft, _ = load_engine(spec.draft_model, ecfg)
    return SpecDecoder(target, draft, spec.spec_k)


def run_server(spec: LaunchSpec, api_key: str | None = None, console: Any = None) -> int:
    """Serve until stopped; returns the exit status (ENGINE_FAILURE_EXIT after an engine failure)."""
    import logging
    import socket
    import threading

    from rich.console import Console

    from g4bench.engine.loading import load_engine
    from g4bench.engine.scheduler import Scheduler
    from g4bench.server.app import create_app
    from g4bench.server.security import is_loopback
    from g4bench.server.tokenizer import load_tokenizer
    from g4bench.server.transport import StopOnEngineFailure, make_server, raise_fd_limit

    console = console or Console(stderr=True)
    loopback = is_loopback(spec.host)
    stop_on_failure = StopOnEngineFailure() if spec.exit_on_engine_failure else None
    settings = spec.server_settings(api_key, stop_on_failure)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if not loopback and api_key is None:
        console.print(
            f"[bold red]warning[/]: binding {spec.host} (reachable from other machines) without an API key; "
            f"set ${API_KEY_ENV} or --api-key-file"
        )
    ecfg = spec.step().engine_config(
        max_slots=spec.max_slots, max_len=spec.max_len, cached_windows=spec.cached_windows
    )
    console.print(f"[bold]g4bench serve[/]: loading {spec.model} ({ecfg})")
    engine, tokenizer_dir = load_engine(spec.model, ecfg)
    tokenizer = load_tokenizer(tokenizer_dir, engine.cfg.vocab_size)
    name = spec.served_model_name or spec.model
    try:
        decoder = speculation(spec, engine)
    except ValueError as err:
        from rich.markup import escape

        console.print(f"[red]error[/]: {escape(str(err))}")
        return 2
    scheduler = Scheduler(engine, max_waiting=spec.max_waiting, spec=decoder)
    app = create_app(scheduler, tokenizer, name, settings)
    fds = raise_fd_limit()
    server = make_server(
        app,
        head_timeout_s=spec.idle_timeout_s,
        graceful_shutdown_s=spec.shutdown_timeout_s,
        max_connections=spec.max_connections,
    )
    if stop_on_failure is not None:
        stop_on_failure.server = server

    family = socket.AF_INET6 if ":" in spec.host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((spec.host, spec.port))
    bound_host, bound_port = sock.getsockname()[:2]
    console.print(
        f"serving [bold]{name}[/] on http://{bound_host}:{bound_port}/v1 "
        f"(tokenizer: {tokenizer_dir or 'synthetic'}, {spec.max_slots} slots x {spec.max_len} positions, "
        f"KV {spec.kv_dtype}/{spec.sliding_kv}, chunk {spec.chunk_size}, {ecfg.policy} prefill "
        f"(≤{spec.max_batched_tokens} tokens a call), "
        f"{f'speculative k={spec.spec_k} with {spec.draft_model}, ' if spec.spec_k else ''}{spec.max_connections} connections, "
        f"{fds} open files{', API key required' if api_key else ''}); /health is 503 until warm-up is done"
    )

    def announce_ready() -> None:
        if scheduler.wait_ready(timeout=24 * 3600):
            console.print(f"[green]ready[/]: warm-up took {scheduler.warmup_s or 0.0:.1f} s")
        else:
            console.print(f"[red]engine loop failed[/]: {scheduler.error!r}")

    scheduler.start()
    threading.Thread(target=announce_ready, daemon=True).start()
    try:
        server.run(sockets=[sock])
    finally:
        scheduler.stop(timeout=spec.shutdown_timeout_s)
        sock.close()
    if stop_on_failure is not None and stop_on_failure.reason is not None:
        console.print(f"[red]exiting: {stop_on_failure.reason}[/]")
        return ENGINE_FAILURE_EXIT
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python -m g4bench.server.launch '<LaunchSpec json>'`` (the key from $G4BENCH_API_KEY)."""
    import os

    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        sys.stderr.write("usage: python -m g4bench.server.launch '<LaunchSpec json>'\n")
        return 2
    try:
        spec = LaunchSpec.from_json(args[0])
    except (ValueError, TypeError) as err:
        sys.stderr.write(f"bad launch spec: {err}\n")
        return 2
    return run_server(spec, api_key=os.environ.get(API_KEY_ENV) or None)


if __name__ == "__main__":
    sys.exit(main())
