"""A scripted OpenAI-compatible server whose stream timings are known, for serve-load tests.

Every streamed response follows `Script` against the request's arrival time t_r (absolute deadlines,
so sleeps do not drift): chat sends a role-only chunk at once (TTFT must ignore it); the first content
chunk at t_r + ttft_s (slow_ttft_s for every `slow_every`-th request), then chunk k at
t_r + ttft + k·gap_s; chunks whose index is in `two_token_chunks` carry two tokens (text "xy", two
token_ids). Then a finish chunk, a usage chunk (prompt_tokens, completion_tokens = max_tokens,
cached_tokens = longest common prefix with any earlier prompt + output, as a prefix cache would),
and [DONE]. /health is 503 for `warm_s` after start, then 200. /v1/models lists "scripted".

Run in a thread (`start_in_thread`) or as a subprocess (`python scripted_server.py [--die-after N]
[--warm-s S]`, prints `PORT <n>`): the subprocess can exit hard mid-stream after N requests, which is
how a crashing server looks to a client.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import sys
import threading
import time
from dataclasses import dataclass

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route

MODEL = "scripted"


@dataclass
class Script:
    ttft_s: float = 0.1
    gap_s: float = 0.02
    two_token_chunks: frozenset[int] = frozenset({2, 5})
    slow_every: int = 0  # every k-th request (1-based count) gets slow_ttft_s
    slow_ttft_s: float = 0.3
    warm_s: float = 0.0
    die_after: int = 0  # subprocess only: hard exit in the middle of request die_after + 1
    drop_token_ids: bool = False  # behave like a server without return_token_ids
    ids_on_finish: bool = False  # all completion ids on the finish chunk only (g4bench serve's form)

    def chunk_sizes(self, n_tokens: int) -> list[int]:
        sizes, left, k = [], n_tokens, 0
        while left > 0:
            s = 2 if k in self.two_token_chunks and left >= 2 else 1
            sizes.append(s)
            left -= s
            k += 1
        return sizes


def _lcp(a: list, b: list) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def make_app(script: Script) -> Starlette:
    state = {"count": 0, "seqs": [], "t_start": time.monotonic()}

    async def health(_: Request) -> JSONResponse:
        ready = time.monotonic() - state["t_start"] >= script.warm_s
        return JSONResponse({"ok": ready}, status_code=200 if ready else 503)

    async def models(_: Request) -> JSONResponse:
        return JSONResponse({"object": "list", "data": [{"id": MODEL, "object": "model"}]})

    async def generate(request: Request) -> StreamingResponse | JSONResponse:
        loop = asyncio.get_running_loop()
        t_r = loop.time()
        body = await request.json()
        if body.get("model") != MODEL:
            return JSONResponse({"error": {"message": f"unknown model {body.get('model')}"}}, status_code=404)
        state["count"] += 1
        count = state["count"]
        chat = "messages" in body
        if chat:
            prompt: list = list("".join(m["content"] for m in body["messages"]))
        else:
            p = body["prompt"]
            prompt = list(p) if isinstance(p, list) else list(p)
        n = int(body["max_tokens"])
        out_ids = [100 + (i % 20) for i in range(n)]
        cached = max((_lcp(s, prompt) for s in state["seqs"]), default=0)
        state["seqs"].append(prompt + ([chr(i - 3) for i in out_ids] if chat else out_ids))
        slow = script.slow_every and count % script.slow_every == 0
        ttft = script.slow_ttft_s if slow else script.ttft_s
        ids_wanted = body.get("return_token_ids") and not script.drop_token_ids
        die = script.die_after and count > script.die_after

        def chunk(text: str, ids: list[int] | None, finish: str | None = None, role: bool = False) -> str:
            if chat:
                delta = {"role": "assistant", "content": ""} if role else {"content": text}
                choice: dict = {"index": 0, "delta": delta, "finish_reason": finish}
            else:
                choice = {"index": 0, "text": text, "finish_reason": finish}
            if ids_wanted and ids is not None:
                choice["token_ids"] = ids
            return "data: " + json.dumps({"id": f"r{count}", "model": MODEL, "choices": [choice]}) + "\n\n"

        async def stream():
            if chat:
                yield chunk("", None, role=True)
            pos = 0
            for k, size in enumerate(script.chunk_sizes(n)):
                await asyncio.sleep(max(0.0, t_r + ttft + k * script.gap_s - loop.time()))
                ids = out_ids[pos : pos + size]
                pos += size
                yield chunk("".join(chr(i - 3) for i in ids), None if script.ids_on_finish else ids)
                if die and k == 1:
                    os._exit(1)
            yield chunk("", out_ids if script.ids_on_finish else [], finish="length")
            usage = {"prompt_tokens": len(prompt), "completion_tokens": n, "total_tokens": len(prompt) + n,
                     "prompt_tokens_details": {"cached_tokens": cached}}  # fmt: skip
            yield "data: " + json.dumps({"id": f"r{count}", "choices": [], "usage": usage}) + "\n\n"
            yield "data: [DONE]\n\n"

        return StreamingResponse(stream(), media_type="text/event-stream")

    routes = [
        Route("/health", health),
        Route("/v1/models", models),
        Route("/v1/completions", generate, methods=["POST"]),
        Route("/v1/chat/completions", generate, methods=["POST"]),
    ]
    return Starlette(routes=routes)


class ThreadServer:
    """uvicorn in a daemon thread on an ephemeral loopback port."""

    def __init__(self, script: Script) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        config = uvicorn.Config(make_app(script), log_level="warning", lifespan="off")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)

    def __enter__(self) -> ThreadServer:
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            if time.monotonic() > deadline:
                raise RuntimeError("scripted server did not start")
            time.sleep(0.01)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--die-after", type=int, default=0)
    ap.add_argument("--warm-s", type=float, default=0.0)
    ap.add_argument("--port", type=int, default=0)
    args = ap.parse_args()
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", args.port))
    sys.stdout.write(f"PORT {sock.getsockname()[1]}\n")
    sys.stdout.flush()
    script = Script(die_after=args.die_after, warm_s=args.warm_s)
    uvicorn.Server(uvicorn.Config(make_app(script), log_level="warning", lifespan="off")).run(sockets=[sock])


if __name__ == "__main__":
    main()
