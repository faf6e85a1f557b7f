"""The OpenAI-compatible HTTP layer: `create_app(scheduler_or_engine, tokenizer, model_name, settings)`.

Data flow for one request: the body is read under a size limit and a deadline (requests.read_body)
-> a worker thread parses, bounds, validates and tokenizes it (requests.Preparer; bad input -> 4xx
with an OpenAI error body naming the problem) -> admission: 503 + Retry-After while the engine is
warming up or has failed, 429 + Retry-After when the queue is full -> `Scheduler.submit` with an
`AsyncSink` -> the engine thread pushes (token, text delta) events into the request's asyncio.Queue
-> the first event is awaited *before* any response starts, so a queue timeout (504), an engine
failure (503) or a generation error (500) is a real HTTP status, streaming or not -> one JSON
response, or SSE chunks (role chunk with the first token, content deltas, a finish chunk, an
optional usage chunk, `data: [DONE]`). With `return_token_ids` every sampled token gets its own
chunk whose `choices[0].token_ids` holds its id (vLLM's form), and the first chunk carries
`prompt_token_ids`. A failure after the stream started becomes an error event, then `[DONE]`.

Chat output goes through `AgentOutput` (agent_output.py) on the event loop: each token's text
(already checked for stop strings in the engine thread) -> content / reasoning_content / tool_calls
deltas with the logprobs of their tokens; `finish_reason` is "tool_calls" when calls came out.
Requests that use tools detokenize through `AgentVocab.piece`, which keeps the markers a real
tokenizer's decode drops. Completions' logprobs ride on the chunk that carries their text.

Deadlines: a request still queued after `queue_timeout_s`, or unfinished after `request_timeout_s`,
is cancelled and answered 504. The event loop never touches the engine. A watcher task listens for
the client's `http.disconnect` and cancels the request in the scheduler, which frees the slot at
once. The engine watchdog (watchdog.py) turns /health and every waiting request into 503 when the
engine thread dies or stalls.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from g4bench.engine.logprobs import TokenLogprob, completion_logprobs
from g4bench.engine.scheduler import QueueFull, RequestResult, Scheduler, SchedulerDead
from g4bench.server import protocol as p
from g4bench.server.agent_output import AgentOutput
from g4bench.server.errors import APIError, install_error_handlers
from g4bench.server.metrics import ServerMetrics
from g4bench.server.replies import Reply, from_chunks
from g4bench.server.requests import Prepared, Preparer, read_body
from g4bench.server.security import ApiKeyAuth, HostAllowList, JsonOnly
from g4bench.server.settings import ServerSettings
from g4bench.server.streaming import AsyncSink, TextAssembler
from g4bench.server.tokenizer import PieceDecoder, Tokenizer
from g4bench.server.watchdog import EngineWatchdog

ENGINE_FAILED = "the engine failed; the server must be restarted"


def create_app(
    scheduler_or_engine: Any, tokenizer: Tokenizer, model_name: str, settings: ServerSettings | None = None
) -> FastAPI:
    """An app over a running `Scheduler` (the caller starts and stops it), or over an `Engine`, for
    which the app builds a scheduler, starts it (warm-up included) at startup and stops it at shutdown."""
    settings = settings or ServerSettings()
    owned = not isinstance(scheduler_or_engine, Scheduler)
    scheduler = Scheduler(scheduler_or_engine) if owned else scheduler_or_engine
    service = _Service(scheduler, tokenizer, model_name, settings)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        if owned:
            scheduler.start()
        service.watchdog.start()
        yield
        await service.watchdog.stop()
        service.abort_all(503, "the server is shutting down", "shutting_down")
        service.executor.shutdown(wait=False, cancel_futures=True)
        if owned:
            await asyncio.to_thread(scheduler.stop)

    app = FastAPI(title="g4bench", lifespan=lifespan)
    app.state.scheduler, app.state.metrics, app.state.service = scheduler, service.metrics, service
    app.add_middleware(JsonOnly)  # innermost: after the Host and key checks
    if settings.api_key:
        app.add_middleware(ApiKeyAuth, api_key=settings.api_key, protect_docs=settings.protect_docs)
    if settings.cors_origins is not None:  # outside the key check: preflights carry no key
        from fastapi.middleware.cors import CORSMiddleware

        app.add_middleware(
            CORSMiddleware, allow_origins=list(settings.cors_origins), allow_methods=["GET", "POST"],
            allow_headers=["authorization", "content-type"],
        )  # fmt: skip
    if settings.allowed_hosts is not None:
        app.add_middleware(HostAllowList, allowed=settings.allowed_hosts)  # outermost: checked first
    install_error_handlers(app)

    @app.get("/health")
    async def health() -> JSONResponse:
        failure = service.watchdog.failure or service.watchdog.check()
        retry = {"Retry-After": str(settings.unavailable_retry_after_s)}
        if failure is not None:
            return JSONResponse({"status": "error", "reason": failure}, status_code=503, headers=retry)
        if scheduler.ready:
            return JSONResponse({"status": "ok", "model": model_name})
        return JSONResponse({"status": "loading", "model": model_name}, status_code=503, headers=retry)

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(service.metrics.render(), media_type=service.metrics.content_type)

    @app.get("/v1/models")
    async def models() -> p.ModelList:
        return p.ModelList(
            data=[p.ModelCard(id=model_name, created=service.created, max_model_len=scheduler.max_len)]
        )

    @app.post("/v1/chat/completions", openapi_extra=_body_ref(p.ChatCompletionRequest))
    async def chat(request: Request):
        return await service.handle("chat", request)

    @app.post("/v1/completions", openapi_extra=_body_ref(p.CompletionRequest))
    async def completions(request: Request):
        return await service.handle("completions", request)

    _document_request_schemas(app, (p.ChatCompletionRequest, p.CompletionRequest))
    return app


def _body_ref(model: type) -> dict:
    """The endpoints read their body themselves (requests.py), so FastAPI does not know its schema:
    point the OpenAPI request body at the pydantic model, registered by `_document_request_schemas`."""
    ref = {"$ref": f"#/components/schemas/{model.__name__}"}
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": ref}}}}


def _document_request_schemas(app: FastAPI, models: tuple) -> None:
    build = app.openapi

    def openapi() -> dict:
        if app.openapi_schema is not None:
            return app.openapi_schema
        schema = build()  # caches itself in app.openapi_schema; completed in place below
        components = schema.setdefault("components", {}).setdefault("schemas", {})
        for model in models:
            body = model.model_json_schema(ref_template="#/components/schemas/{model}")
            components.update(body.pop("$defs", {}))
            components[model.__name__] = body
        return schema

    app.openapi = openapi  # type: ignore[method-assign]


class _Service:
    """Request handling shared by both endpoints."""

    def __init__(self, scheduler: Scheduler, tokenizer: Tokenizer, model_name: str, settings: ServerSettings):
        self.scheduler, self.model_name, self.settings = scheduler, model_name, settings
        self.preparer = Preparer(
            tokenizer,
            model_name,
            scheduler.max_len,
            scheduler.vocab_size,
            frozenset(scheduler.engine.eos_token_ids),
        )
        self.tokenizer = tokenizer
        self.metrics = ServerMetrics(scheduler, model_name)
        scheduler.observers.append(self.metrics)
        self.created = p.now_s()
        self.executor = ThreadPoolExecutor(settings.prepare_workers, thread_name_prefix="g4bench-prepare")
        self.inflight: dict[int, AsyncSink] = {}
        self.watchdog = EngineWatchdog(
            scheduler,
            settings.engine_stall_s,
            on_trip=lambda reason: self.abort_all(503, ENGINE_FAILED, "engine_failed"),
            on_exit=settings.on_engine_failure,
        )

    def abort_all(self, status: int, message: str, code: str) -> None:
        """Answer every request still waiting on the engine (event loop only)."""
        for sink in list(self.inflight.values()):
            sink.queue.put_nowait(("abort", status, message, code))

    def _unavailable(self) -> APIError | None:
        s = self.settings
        if self.watchdog.failure is not None or not self.scheduler.alive:
            return APIError(
                503,
                ENGINE_FAILED,
                "server_error",
                code="engine_failed",
                retry_after_s=s.unavailable_retry_after_s,
            )
        if not self.scheduler.ready:
            return APIError(
                503, "the model is still warming up", "server_error",
                code="loading", retry_after_s=s.unavailable_retry_after_s,
            )  # fmt: skip
        return None

    async def handle(self, endpoint: str, request: Request):
        s = self.settings
        try:
            raw = await read_body(request, s.max_body_bytes, s.body_timeout_s)
            loop = asyncio.get_running_loop()
            prep = await loop.run_in_executor(self.executor, self.preparer.prepare, endpoint, raw)
        except APIError:
            self.metrics.count_request(endpoint, "invalid")
            raise
        if (err := self._unavailable()) is not None:
            self.metrics.count_request(endpoint, "rejected")
            raise err
        vocab = self.preparer.vocab
        decoder = PieceDecoder(vocab.piece) if prep.uses_tools and not vocab.synthetic else self.tokenizer
        sink = AsyncSink(asyncio.get_running_loop(), TextAssembler(decoder, prep.stops, prep.body.min_tokens))
        try:
            rid = self.scheduler.submit(prep.prompt, prep.params, sink)
        except ValueError as exc:  # the scheduler's own checks (Preparer checks the same first)
            self.metrics.count_request(endpoint, "invalid")
            raise APIError(400, str(exc)) from exc
        except (QueueFull, SchedulerDead) as exc:
            self.metrics.count_request(endpoint, "rejected")
            if isinstance(exc, QueueFull):
                raise APIError(
                    429, "too many requests are waiting; retry later", "rate_limit_exceeded",
                    code="queue_full", retry_after_s=s.retry_after_s,
                ) from exc  # fmt: skip
            raise APIError(
                503, "the engine is not running", "server_error", retry_after_s=s.unavailable_retry_after_s
            ) from exc
        return await _Request(self, endpoint, prep, rid, sink, request).respond()


class _Request:
    """One admitted request: its events, deadlines, disconnect watcher and response."""

    def __init__(
        self, service: _Service, endpoint: str, prep: Prepared, rid: int, sink: AsyncSink, request: Request
    ):
        self.service, self.endpoint, self.prep, self.rid, self.sink = service, endpoint, prep, rid, sink
        self.reply = Reply(endpoint, service.model_name, prep.body, prep.prompt)
        self.piece = service.preparer.vocab.piece
        self.top = prep.params.logprobs  # None: no logprobs
        self.agent = AgentOutput(self.piece, top_logprobs=self.top) if endpoint == "chat" else None
        loop = asyncio.get_running_loop()
        now = loop.time()
        self.loop, self.queue_deadline = loop, now + service.settings.queue_timeout_s
        self.deadline = now + service.settings.request_timeout_s
        self.started = False  # the first event arrived (admitted and prefilled)
        service.inflight[rid] = sink
        self.watcher = asyncio.create_task(self._watch_disconnect(request))

    async def _watch_disconnect(self, request: Request) -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass
        self.service.scheduler.cancel(self.rid)

    async def next_event(self) -> tuple:
        """The next engine event, or ("abort", status, message, code) when a deadline passes."""
        s = self.service.settings
        while True:
            now = self.loop.time()
            until = self.deadline if self.started else min(self.deadline, self.queue_deadline)
            try:
                event = await asyncio.wait_for(self.sink.queue.get(), max(0.0, until - now))
            except TimeoutError:
                if self.loop.time() >= self.deadline:
                    message = f"the request did not finish within {s.request_timeout_s:g} s"
                    return ("abort", 504, message, "request_timeout")
                if self.service.scheduler.is_waiting(self.rid):
                    return (
                        "abort",
                        504,
                        f"no slot became free within {s.queue_timeout_s:g} s",
                        "queue_timeout",
                    )
                self.queue_deadline = self.deadline  # admitted (prefilling): only the total deadline now
                continue
            self.started = True
            return event

    def close(self, status: str) -> None:
        """Always called once: stop watching, cancel unless finished, count the outcome."""
        self.watcher.cancel()
        self.service.inflight.pop(self.rid, None)
        if status not in ("stop", "length"):
            self.service.scheduler.cancel(self.rid)
        self.service.metrics.count_request(self.endpoint, status)

    def _error(self, event: tuple) -> APIError:
        """The HTTP error for an ("abort", ...) or a failed ("done", ...) event."""
        if event[0] == "abort":
            _, status, message, code = event
            type_ = "timeout" if status == 504 else "server_error"
            retry = self.service.settings.unavailable_retry_after_s if status == 503 else None
            return APIError(status, message, type_, code=code, retry_after_s=retry)
        result: RequestResult = event[1]
        if result.finish_reason == "cancelled":
            return APIError(499, "request cancelled (client disconnected)", code="cancelled")
        if self.service.watchdog.failure is not None or not self.service.scheduler.alive:
            return self._error(("abort", 503, ENGINE_FAILED, "engine_failed"))
        return APIError(500, "generation failed (internal error, logged on the server)", "server_error")

    def _reason(self, result: RequestResult) -> str:
        """The reply's finish_reason: "length" when the grammar's budget forced the close (the
        output is complete and valid, but shorter than the model would have written), else the
        engine's reason ("tool_calls" for a chat reply that carried calls)."""
        if self.prep.budget is not None and self.prep.budget.forced:
            return "length"
        return (
            self.agent.finish_reason(result.finish_reason) if self.agent is not None else result.finish_reason
        )

    @staticmethod
    def _failed(event: tuple) -> bool:
        return event[0] == "abort" or (
            event[0] == "done" and event[1].finish_reason in ("error", "cancelled")
        )

    @staticmethod
    def _outcome(event: tuple) -> str:
        """The metrics label of a final event: the finish reason, "timeout" or "error"."""
        if event[0] == "abort":
            return "timeout" if event[1] == 504 else "error"
        return event[1].finish_reason

    async def respond(self):
        status = "cancelled"
        try:
            first = await self.next_event()
            if self._failed(first):
                status = self._outcome(first)
                raise self._error(first)
            if self.prep.body.stream:
                stream = self._stream(first)
                status = "streaming"  # the generator closes the request
                return StreamingResponse(
                    stream,
                    media_type="text/event-stream",
                    headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
                )
            text, rows, updates, event = [], [], [], first
            while event[0] == "token":
                _, _, delta, row = event
                if self.agent is not None:
                    updates += self.agent.push_text(delta, row)
                text.append(delta)
                if row is not None:
                    rows.append(row)
                event = await self.next_event()
            if self._failed(event):
                status = self._outcome(event)
                raise self._error(event)
            _, result, tail = event
            status = result.finish_reason
            if self.agent is None:
                lp = None if self.top is None else completion_logprobs(rows, self.piece, self.top)
                reply = self.reply.whole(
                    "".join(text) + tail, result, logprobs=lp, finish_reason=self._reason(result)
                )
                return JSONResponse(reply)
            updates += self.agent.tail(tail) + self.agent.finish()
            whole = self.reply.whole(
                "", result, parsed=self.agent.result(), logprobs=self.agent.logprobs_all(updates),
                finish_reason=self._reason(result),
            )  # fmt: skip
            return JSONResponse(whole)
        finally:
            if status != "streaming":
                self.close(status)

    def _chunks(self, delta: str, first: bool, ids: list[int] | None, rows: list[TokenLogprob]) -> str:
        """One token's chunks (chat: its AgentOutput updates; completions: its text and logprobs)."""
        reply = self.reply
        if self.agent is not None:
            row = rows.pop() if rows else None
            updates = self.agent.push_text(delta, row)
            return (
                from_chunks(reply.updates(updates, first, ids)) if updates or first or ids is not None else ""
            )
        if not (first or delta or ids is not None):
            return ""  # held text: its logprob rows wait for the chunk that carries it
        lp = None
        if self.top is not None:
            lp = completion_logprobs(rows, self.piece, self.top, self.text_offset)
            rows.clear()
        self.text_offset += len(delta)
        return from_chunks(reply.delta(delta, first, ids, lp))

    async def _stream(self, event: tuple) -> AsyncIterator[str]:
        status = "cancelled"
        reply = self.reply
        with_ids = reply.body.return_token_ids  # then every token gets a chunk carrying its id
        self.text_offset = 0
        rows: list[TokenLogprob] = []
        try:
            first = True
            while event[0] == "token":
                _, token, text, row = event
                if row is not None:
                    rows.append(row)
                out = self._chunks(text, first, [token] if with_ids else None, rows)
                if out:
                    yield out
                first = False
                event = await self.next_event()
            if self._failed(event):
                status = self._outcome(event)
                if status != "cancelled":
                    yield f"data: {json.dumps(self._error(event).body())}\n\ndata: [DONE]\n\n"
                return
            _, result, tail = event
            status = result.finish_reason
            reason = self._reason(result)
            if self.agent is not None:
                updates = self.agent.tail(tail) + self.agent.finish()
                if updates or first:
                    yield from_chunks(reply.updates(updates, first, [] if with_ids else None))
                reason = self._reason(result)
            elif first or tail or rows:
                lp = None
                if self.top is not None:
                    lp = completion_logprobs(rows, self.piece, self.top, self.text_offset)
                yield from_chunks(reply.delta(tail, first, [] if with_ids else None, lp))
            yield from_chunks([reply.finish_chunk(result, reason)])
            if reply.body.include_usage:
                yield from_chunks([reply.usage_chunk(result)])
            yield "data: [DONE]\n\n"
        finally:
            self.close(status)
