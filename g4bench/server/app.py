"""The OpenAI-compatible HTTP layer: `create_app(scheduler_or_engine, tokenizer, model_name)`.

Data flow for one request: FastAPI parses the body into a protocol model (bad input -> 400 with an
OpenAI error body) -> the prompt is tokenized (chat: `ChatFormatter`; completions: text or ids) and
checked against the context length -> `Scheduler.submit` with an `AsyncSink` -> the engine thread
pushes (token, text delta) events into the request's asyncio.Queue -> this module turns them into
one JSON response or SSE chunks (role chunk with the first token, content deltas, a finish chunk, an
optional usage chunk, `data: [DONE]`). With `return_token_ids` every sampled token gets its own chunk
whose `choices[0].token_ids` holds its id (vLLM's form; text may be empty while a stop string or a
UTF-8 sequence is incomplete), and the first chunk carries `prompt_token_ids`.

The event loop never touches the engine. A watcher task listens for the client's `http.disconnect`
and cancels the request in the scheduler, which frees the slot at once (streaming or not).
/health answers 503 until the scheduler's warm-up is done (and again if the engine loop dies).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import secrets
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from g4bench.engine.sampling import SamplingParams
from g4bench.engine.scheduler import GenerationParams, QueueFull, RequestResult, Scheduler, SchedulerDead
from g4bench.server import protocol as p
from g4bench.server.chat import ChatFormatter, TemplateError
from g4bench.server.metrics import ServerMetrics
from g4bench.server.streaming import AsyncSink, TextAssembler
from g4bench.server.tokenizer import Tokenizer

log = logging.getLogger(__name__)


class APIError(Exception):
    """Becomes `{"error": {"message", "type", "param", "code"}}` with `status`."""

    def __init__(
        self, status: int, message: str, type_: str = "invalid_request_error", param=None, code=None
    ):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type_, param, code

    def response(self) -> JSONResponse:
        body = p.ErrorResponse(
            error=p.ErrorDetail(message=self.message, type=self.type, param=self.param, code=self.code)
        )
        return JSONResponse(body.model_dump(), status_code=self.status)


class _ApiKeyMiddleware:
    """Pure ASGI (no BaseHTTPMiddleware: it would break streaming and disconnect detection).
    Checks `Authorization: Bearer KEY` on /v1/* before the body is read."""

    def __init__(self, app, api_key: str) -> None:
        self.app, self.expected = app, f"Bearer {api_key}".encode()

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http" and scope["path"].startswith("/v1/"):
            got = dict(scope["headers"]).get(b"authorization", b"")
            if not secrets.compare_digest(got, self.expected):
                msg = "missing API key" if not got else "invalid API key"
                err = APIError(401, msg, code="invalid_api_key")
                await err.response()(scope, receive, send)
                return
        await self.app(scope, receive, send)


def create_app(
    scheduler_or_engine: Any, tokenizer: Tokenizer, model_name: str, api_key: str | None = None
) -> FastAPI:
    """An app over a running `Scheduler` (the caller starts and stops it), or over an `Engine`, for
    which the app builds a scheduler, starts it (warm-up included) at startup and stops it at shutdown."""
    owned = not isinstance(scheduler_or_engine, Scheduler)
    scheduler = Scheduler(scheduler_or_engine) if owned else scheduler_or_engine
    service = _Service(scheduler, tokenizer, model_name)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        if owned:
            scheduler.start()
        yield
        if owned:
            await asyncio.to_thread(scheduler.stop)

    app = FastAPI(title="g4bench", lifespan=lifespan)
    app.state.scheduler, app.state.metrics = scheduler, service.metrics
    if api_key:
        app.add_middleware(_ApiKeyMiddleware, api_key=api_key)
    _install_error_handlers(app)

    @app.get("/health")
    async def health() -> JSONResponse:
        if scheduler.ready:
            return JSONResponse({"status": "ok", "model": model_name})
        if scheduler.error is not None:
            return JSONResponse({"status": "error", "error": repr(scheduler.error)}, status_code=503)
        return JSONResponse({"status": "loading", "model": model_name}, status_code=503)

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(service.metrics.render(), media_type=service.metrics.content_type)

    @app.get("/v1/models")
    async def models() -> p.ModelList:
        return p.ModelList(
            data=[p.ModelCard(id=model_name, created=service.created, max_model_len=scheduler.max_len)]
        )

    @app.post("/v1/chat/completions")
    async def chat(body: p.ChatCompletionRequest, request: Request):
        service.check_model(body.model, "chat")
        messages = [{"role": m.role, "content": m.text()} for m in body.messages]
        try:
            prompt = service.formatter.encode(messages)
        except TemplateError as exc:
            service.metrics.count_request("chat", "invalid")
            raise APIError(400, str(exc), param="messages") from exc
        stops = (body.stop or []) + service.formatter.stop_strings
        return await service.run("chat", body, prompt, stops, request)

    @app.post("/v1/completions")
    async def completions(body: p.CompletionRequest, request: Request):
        service.check_model(body.model, "completions")
        prompt = service.tokenizer.encode(body.prompt) if isinstance(body.prompt, str) else list(body.prompt)
        return await service.run("completions", body, prompt, body.stop or [], request)

    return app


class _Service:
    """Request handling shared by both endpoints."""

    def __init__(self, scheduler: Scheduler, tokenizer: Tokenizer, model_name: str) -> None:
        self.scheduler, self.tokenizer, self.model_name = scheduler, tokenizer, model_name
        self.formatter = ChatFormatter(tokenizer)
        self.stop_ids = self.formatter.stop_token_ids | frozenset(scheduler.engine.eos_token_ids)
        self.metrics = ServerMetrics(scheduler, model_name)
        scheduler.observers.append(self.metrics)
        self.created = p.now_s()

    def check_model(self, model: str, endpoint: str) -> None:
        if model != self.model_name:
            self.metrics.count_request(endpoint, "invalid")
            raise APIError(
                404,
                f"model {model!r} does not exist; this server serves {self.model_name!r}",
                param="model",
                code="model_not_found",
            )

    def params(self, endpoint: str, body: p.SamplingFields, prompt: list[int]) -> GenerationParams:
        """Check lengths and ids against the engine and build the scheduler's parameters."""
        max_len, param = self.scheduler.max_len, "messages" if endpoint == "chat" else "prompt"
        if not prompt:
            raise APIError(400, "the prompt is empty", param=param)
        if any(not 0 <= t < self.scheduler.vocab_size for t in prompt):
            raise APIError(400, f"prompt token ids must be in [0, {self.scheduler.vocab_size})", param=param)
        if len(prompt) >= max_len:
            raise APIError(
                400,
                f"the prompt has {len(prompt)} tokens; the context length is {max_len}",
                param=param,
                code="context_length_exceeded",
            )
        limit = body.output_limit if body.output_limit is not None else max_len - len(prompt)
        if len(prompt) + limit > max_len:
            raise APIError(
                400,
                f"prompt ({len(prompt)} tokens) + max_tokens ({limit}) exceeds the context length {max_len}",
                param="max_tokens",
                code="context_length_exceeded",
            )
        if body.min_tokens > limit:
            raise APIError(
                400, f"min_tokens ({body.min_tokens}) exceeds max_tokens ({limit})", param="min_tokens"
            )
        sampling = SamplingParams(
            temperature=1.0 if body.temperature is None else body.temperature,
            top_k=max(0, body.top_k or 0),
            top_p=1.0 if body.top_p is None else body.top_p,
            seed=random.getrandbits(31) if body.seed is None else body.seed,
        )
        return GenerationParams(limit, sampling, body.min_tokens, body.ignore_eos, self.stop_ids)

    async def run(
        self, endpoint: str, body: p.SamplingFields, prompt: list[int], stops: list[str], request: Request
    ):
        try:
            params = self.params(endpoint, body, prompt)
        except APIError:
            self.metrics.count_request(endpoint, "invalid")
            raise
        sink = AsyncSink(asyncio.get_running_loop(), TextAssembler(self.tokenizer, stops, body.min_tokens))
        try:
            rid = self.scheduler.submit(prompt, params, sink)
        except (ValueError, QueueFull, SchedulerDead) as exc:
            self.metrics.count_request(endpoint, "rejected")
            status, type_ = {
                ValueError: (400, "invalid_request_error"),
                QueueFull: (429, "rate_limit_exceeded"),
            }.get(type(exc), (503, "server_error"))
            raise APIError(status, str(exc), type_) from exc
        watcher = asyncio.create_task(self._watch_disconnect(request, rid))
        reply = _Reply(endpoint, self.model_name, body, prompt)
        if body.stream:
            return StreamingResponse(
                self._stream(reply, rid, sink, watcher),
                media_type="text/event-stream",
                headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
            )
        result = None
        try:
            text = []
            while (event := await sink.queue.get())[0] == "token":
                text.append(event[2])
            _, result, tail = event
        finally:
            watcher.cancel()
            if result is None:  # this handler was cancelled (shutdown): stop the generation too
                self.scheduler.cancel(rid)
        self.metrics.count_request(endpoint, result.finish_reason)
        if result.finish_reason == "error":
            raise APIError(500, f"generation failed: {result.error}", "server_error")
        if result.finish_reason == "cancelled":
            raise APIError(499, "request cancelled (client disconnected)", code="cancelled")
        return JSONResponse(reply.whole("".join(text) + tail, result))

    async def _watch_disconnect(self, request: Request, rid: int) -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass
        self.scheduler.cancel(rid)

    async def _stream(
        self, reply: _Reply, rid: int, sink: AsyncSink, watcher: asyncio.Task
    ) -> AsyncIterator[str]:
        status = "cancelled"
        with_ids = reply.body.return_token_ids  # then every token gets a chunk carrying its id
        try:
            first = True
            while (event := await sink.queue.get())[0] == "token":
                _, token, text = event
                if first or text or with_ids:
                    yield from_chunks(reply.delta(text, first, [token] if with_ids else None))
                first = False
            _, result, tail = event
            status = result.finish_reason
            if status == "error":
                err = p.ErrorResponse(
                    error=p.ErrorDetail(message=f"generation failed: {result.error}", type="server_error")
                )
                yield f"data: {err.model_dump_json()}\n\n"
                return
            if status == "cancelled":
                return
            if first or tail:
                yield from_chunks(reply.delta(tail, first, [] if with_ids else None))
            yield from_chunks([reply.finish_chunk(result)])
            if reply.body.include_usage:
                yield from_chunks([reply.usage_chunk(result)])
            yield "data: [DONE]\n\n"
        finally:
            watcher.cancel()
            if status == "cancelled":
                self.scheduler.cancel(rid)
            self.metrics.count_request(reply.endpoint, status)


def from_chunks(chunks: list) -> str:
    return "".join(f"data: {c.model_dump_json()}\n\n" for c in chunks)


class _Reply:
    """Builds one request's response objects in the endpoint's OpenAI shape."""

    def __init__(self, endpoint: str, model: str, body: p.SamplingFields, prompt: list[int]) -> None:
        self.endpoint, self.model, self.body, self.prompt = endpoint, model, body, prompt
        self.chat = endpoint == "chat"
        self.id = p.new_id("chatcmpl" if self.chat else "cmpl")
        self.created = p.now_s()

    def _usage(self, r: RequestResult) -> p.Usage:
        return p.make_usage(r.prompt_tokens, len(r.output_ids), r.cached_tokens)

    def _ids(self, r: RequestResult) -> tuple[list[int] | None, list[int] | None]:
        return (self.prompt, r.output_ids) if self.body.return_token_ids else (None, None)

    def whole(self, text: str, r: RequestResult) -> dict:
        prompt_ids, ids = self._ids(r)
        common = {"id": self.id, "created": self.created, "model": self.model, "usage": self._usage(r)}
        if self.chat:
            choice = p.ChatChoice(
                message=p.AssistantMessage(content=text), finish_reason=r.finish_reason, token_ids=ids
            )
            resp: Any = p.ChatCompletionResponse(choices=[choice], prompt_token_ids=prompt_ids, **common)
        else:
            choice = p.CompletionChoice(text=text, finish_reason=r.finish_reason, token_ids=ids)
            resp = p.CompletionResponse(choices=[choice], prompt_token_ids=prompt_ids, **common)
        return resp.model_dump(mode="json")

    def _chunk(self, choices: list, **extra):
        cls = p.ChatCompletionChunk if self.chat else p.CompletionResponse
        return cls(id=self.id, created=self.created, model=self.model, choices=choices, **extra)

    def delta(self, text: str, first: bool, ids: list[int] | None = None) -> list:
        """Chat: the role chunk before the first content; completions: a text chunk. `ids` (with
        `return_token_ids`, vLLM's form) are the token ids this chunk adds, possibly none while
        text is held back; the first chunk also carries the prompt's ids."""
        prompt_ids = self.prompt if first and self.body.return_token_ids else None
        if not self.chat:
            return [self._chunk([p.CompletionChoice(text=text, token_ids=ids)], prompt_token_ids=prompt_ids)]
        chunks = []
        if first:
            role = p.ChatChunkChoice(delta=p.ChatDelta(role="assistant", content=""))
            chunks.append(self._chunk([role], prompt_token_ids=prompt_ids))
        if text or ids is not None:
            chunks.append(self._chunk([p.ChatChunkChoice(delta=p.ChatDelta(content=text), token_ids=ids)]))
        return chunks

    def finish_chunk(self, r: RequestResult):
        """The streamed finish chunk: no new text and no ids (every id rode on its own chunk)."""
        if self.chat:
            choice: Any = p.ChatChunkChoice(delta=p.ChatDelta(), finish_reason=r.finish_reason)
        else:
            choice = p.CompletionChoice(text="", finish_reason=r.finish_reason)
        return self._chunk([choice])

    def usage_chunk(self, r: RequestResult):
        return self._chunk([], usage=self._usage(r))


def _install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(APIError)
    async def api_error(request: Request, exc: APIError) -> JSONResponse:
        return exc.response()

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = exc.errors()
        first = errors[0] if errors else {"loc": (), "msg": "invalid request", "type": ""}
        loc = [str(x) for x in first.get("loc", ()) if x != "body"]
        if first.get("type") == "json_invalid":
            message = f"malformed JSON body: {first.get('ctx', {}).get('error', first['msg'])}"
        else:
            message = f"{'.'.join(loc) or 'body'}: {first['msg']}"
        endpoint = "chat" if request.url.path.endswith("/chat/completions") else "completions"
        request.app.state.metrics.count_request(endpoint, "invalid")
        return APIError(400, message, param=".".join(loc) or None).response()

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        return APIError(exc.status_code, str(exc.detail), code=str(exc.status_code)).response()

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error in %s %s", request.method, request.url.path)
        return APIError(500, f"internal error: {exc!r}", "server_error").response()
