"""`g4bench serve`: an OpenAI-compatible HTTP server over one engine (continuous batching, prefix reuse).

Loads the model (`load_engine`), builds the tokenizer (the checkpoint's tokenizer.json, or the
byte-level tokenizer for synthetic models), starts the scheduler's engine thread — which compiles
every bucket first, so /health answers 503 until that warm-up is done — binds the socket, says on
stderr what it serves where, and runs uvicorn until interrupted.
"""

from __future__ import annotations

from typing import Annotated

import typer


def serve(
    model: Annotated[
        str, typer.Option(help="e2b | e4b | a checkpoint DIR | a config .json (synthetic weights)")
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
    cached_windows: Annotated[
        int,
        typer.Option(
            help="Paged: sliding-layer windows kept cached per slot (finished conversations, shared prefixes)"
        ),
    ] = 4,
    host: Annotated[str, typer.Option(help="Address to bind")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to bind (0: any free port)")] = 8000,
    api_key: Annotated[str | None, typer.Option(help="Require `Authorization: Bearer KEY` on /v1/*")] = None,
    max_waiting: Annotated[int, typer.Option(help="Requests that may wait for a slot before 429")] = 64,
    served_model_name: Annotated[
        str | None, typer.Option(help="Model id clients send (default: --model)")
    ] = None,
) -> None:
    """Serve a model over an OpenAI-compatible HTTP API."""
    if kv_dtype not in ("bf16", "int8"):
        raise typer.BadParameter(f"--kv-dtype must be bf16 or int8, got {kv_dtype!r}")
    if sliding_kv not in ("ring", "full"):
        raise typer.BadParameter(f"--sliding-kv must be ring or full, got {sliding_kv!r}")
    if kv_layout not in ("paged", "contiguous"):
        raise typer.BadParameter(f"--kv-layout must be paged or contiguous, got {kv_layout!r}")

    import logging
    import socket
    import threading

    import uvicorn
    from rich.console import Console

    from g4bench.engine.engine import EngineConfig
    from g4bench.engine.loading import load_engine
    from g4bench.engine.scheduler import Scheduler
    from g4bench.server.app import create_app
    from g4bench.server.tokenizer import load_tokenizer

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    console = Console(stderr=True)
    ecfg = EngineConfig(
        max_slots=max_slots,
        max_len=max_len,
        kv_dtype=kv_dtype,
        sliding_kv=sliding_kv,
        chunk_size=chunk_size,
        kv_layout=kv_layout,
        cached_windows=cached_windows,
    )
    console.print(f"[bold]g4bench serve[/]: loading {model} ({ecfg})")
    engine, tokenizer_dir = load_engine(model, ecfg)
    tokenizer = load_tokenizer(tokenizer_dir, engine.cfg.vocab_size)
    name = served_model_name or model
    scheduler = Scheduler(engine, max_waiting=max_waiting)
    app = create_app(scheduler, tokenizer, name, api_key=api_key)

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    bound_host, bound_port = sock.getsockname()[:2]
    console.print(
        f"serving [bold]{name}[/] on http://{bound_host}:{bound_port}/v1 "
        f"(tokenizer: {tokenizer_dir or 'byte-level'}, {max_slots} slots x {max_len} positions, "
        f"KV {kv_dtype}/{sliding_kv}, chunk {chunk_size}{', API key required' if api_key else ''}); "
        "/health is 503 until warm-up is done"
    )

    def announce_ready() -> None:
        if scheduler.wait_ready(timeout=24 * 3600):
            console.print(f"[green]ready[/]: warm-up took {scheduler.warmup_s or 0.0:.1f} s")
        else:
            console.print(f"[red]engine loop failed[/]: {scheduler.error!r}")

    scheduler.start()
    threading.Thread(target=announce_ready, daemon=True).start()
    try:
        uvicorn.Server(uvicorn.Config(app, log_level="info")).run(sockets=[sock])
    finally:
        scheduler.stop()
        sock.close()
