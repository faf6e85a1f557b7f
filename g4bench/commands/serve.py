"""`g4bench serve`: an OpenAI-compatible HTTP server over one engine (continuous batching, prefix reuse).

Loads the model (`load_engine`), builds the tokenizer (the checkpoint's tokenizer.json, or the
synthetic tokenizer for synthetic models), starts the scheduler's engine thread — which compiles
every bucket first, so /health answers 503 until that warm-up is done — binds the socket, says on
stderr what it serves where, and runs uvicorn (transport.make_server: connection limits and
timeouts) until SIGINT/SIGTERM. Limits, deadlines and security settings are `ServerSettings`
(see g4bench/server/settings.py for the defaults and why). With `--exit-on-engine-failure` (the
default) a dead or stalled engine stops the server with exit status 3.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from g4bench.commands.options import alias, renamed
from g4bench.engine.served_step import DEFAULT_MAX_BATCHED_TOKENS
from g4bench.server.settings import API_KEY_ENV, ServerSettings

DEFAULTS = ServerSettings()


def serve(
    model: Annotated[
        str, typer.Option(help="e2b | e4b | small | a tiny-* preset | a config .json (synthetic weights) | a checkpoint DIR")
    ] = "e2b",
    kv_dtype: Annotated[str, typer.Option(help="KV cache storage: bf16 | int8")] = "bf16",
    max_slots: Annotated[int, typer.Option(help="Concurrent sequences (KV slots)")] = 8,
    max_len: Annotated[int, typer.Option(help="Positions per slot: prompt + output")] = 8192,
    chunk_size: Annotated[
        int, typer.Option(help="Prefill tokens per engine call (bounds decode stalls)")
    ] = 256,
    sliding_kv: Annotated[str, typer.Option(help="Sliding-layer KV: ring (window-sized) | full")] = "ring",
    kv_layout: Annotated[
        str, typer.Option(help="KV layout: paged (blocks shared across requests) | contiguous (per slot)")
    ] = "paged",
    max_batched_tokens: Annotated[
        int, typer.Option(help="Token budget of one engine call: decode rows + prefill tokens (vLLM's meaning)")
    ] = DEFAULT_MAX_BATCHED_TOKENS,
    prefill_policy: Annotated[
        str | None,
        typer.Option(
            help="mixed (decode rows and budgeted prefill chunks of several prompts in one call) | chunk (one "
            "prompt's chunk per turn beside a separate decode call; the older policy). (default: mixed when paged)"
        ),
    ] = None,
    cached_windows: Annotated[
        int,
        typer.Option(
            help="Paged: sliding-layer windows kept cached per slot (finished conversations, shared prefixes)"
        ),
    ] = 4,
    draft_model: Annotated[
        str | None,
        typer.Option(
            help="Speculative decoding: the draft model (a preset, config .json or checkpoint DIR with the "
            "target's vocabulary); needs --spec-k"
        ),
    ] = None,
    spec_k: Annotated[
        int, typer.Option(help="Speculative decoding: draft tokens verified per round (0: off; needs --draft-model)")
    ] = 0,
    host: Annotated[str, typer.Option(help="Address to bind")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to bind (0: any free port)")] = 8000,
    api_key: Annotated[
        str | None,
        typer.Option(
            help="Require `Authorization: Bearer KEY` on /v1/* (visible in `ps`: prefer "
            f"--api-key-file or ${API_KEY_ENV})"
        ),
    ] = None,
    api_key_file: Annotated[
        Path | None, typer.Option(help=f"File holding the API key (else ${API_KEY_ENV}, else --api-key)")
    ] = None,
    protect_docs: Annotated[
        bool, typer.Option(help="Also require the key on /metrics, /docs, /redoc and /openapi.json")
    ] = False,
    allowed_host: Annotated[
        list[str] | None,
        typer.Option(
            help="Host header names to accept besides the loopback names (repeatable; "
            "loopback binds accept only localhost/127.0.0.1/::1 by default, other binds any host)"
        ),
    ] = None,
    max_waiting: Annotated[
        int, typer.Option(help="Requests that may wait beyond the idle slots before 429")
    ] = 64,
    max_body_bytes: Annotated[
        int, typer.Option(help="Largest request body (413 beyond)")
    ] = DEFAULTS.max_body_bytes,
    body_timeout: Annotated[
        float, typer.Option(help="Seconds for a request body to arrive (408 beyond)")
    ] = DEFAULTS.body_timeout_s,
    queue_timeout: Annotated[
        float, typer.Option(help="Seconds a request may wait for a slot (504 beyond)")
    ] = DEFAULTS.queue_timeout_s,
    request_timeout: Annotated[
        float, typer.Option(help="Seconds a request may take in all (504 beyond)")
    ] = DEFAULTS.request_timeout_s,
    engine_stall_timeout: Annotated[
        float, typer.Option(help="Seconds without engine progress before the watchdog fails the server")
    ] = DEFAULTS.engine_stall_s,
    exit_on_engine_failure: Annotated[
        bool, typer.Option(help="Exit with status 3 when the engine dies or stalls (for a supervisor)")
    ] = True,
    max_connections: Annotated[int, typer.Option(help="Open connections before new requests get 503")] = 1000,
    idle_timeout: Annotated[
        float, typer.Option(help="Seconds a connection may stay open without a request in progress")
    ] = 10.0,
    shutdown_timeout: Annotated[
        float, typer.Option(help="Seconds to let busy connections finish after SIGTERM")
    ] = 5.0,
    model_name: Annotated[
        str | None, typer.Option(help="Model id clients send (default: --model)")
    ] = None,
    served_model_name: Annotated[str | None, renamed("--served-model-name", "--model-name")] = None,
) -> None:
    """Serve a model over an OpenAI-compatible HTTP API."""
    served_model_name = alias(model_name, served_model_name)
    if kv_dtype not in ("bf16", "int8"):
        raise typer.BadParameter(f"--kv-dtype must be bf16 or int8, got {kv_dtype!r}")
    if sliding_kv not in ("ring", "full"):
        raise typer.BadParameter(f"--sliding-kv must be ring or full, got {sliding_kv!r}")
    if kv_layout not in ("paged", "contiguous"):
        raise typer.BadParameter(f"--kv-layout must be paged or contiguous, got {kv_layout!r}")
    from g4bench.server.launch import LaunchSpec, run_server
    from g4bench.server.security import resolve_api_key

    try:
        key = resolve_api_key(api_key, api_key_file)
        spec = LaunchSpec(
            model=model, kv_dtype=kv_dtype, max_slots=max_slots, max_len=max_len, chunk_size=chunk_size,
            sliding_kv=sliding_kv, host=host, port=port, protect_docs=protect_docs,
            allowed_hosts=tuple(allowed_host or ()), max_waiting=max_waiting, max_body_bytes=max_body_bytes,
            body_timeout_s=body_timeout, queue_timeout_s=queue_timeout, request_timeout_s=request_timeout,
            engine_stall_s=engine_stall_timeout, exit_on_engine_failure=exit_on_engine_failure,
            max_connections=max_connections, idle_timeout_s=idle_timeout, shutdown_timeout_s=shutdown_timeout,
            served_model_name=served_model_name, kv_layout=kv_layout, cached_windows=cached_windows,
            max_batched_tokens=max_batched_tokens, prefill_policy=prefill_policy, draft_model=draft_model,
            spec_k=spec_k,
        )  # fmt: skip
        spec.server_settings(key)  # validates the limits before the model loads
    except ValueError as err:
        raise typer.BadParameter(str(err)) from err
    code = run_server(spec, api_key=key)
    if code:
        raise typer.Exit(code=code)
