"""Streaming OpenAI-compatible HTTP client: one request in, one `RequestRecord` out.

Data flow: a workload builds a `RequestSpec` (endpoint, JSON body, bookkeeping labels); `stream_request`
POSTs it with `stream: true` and `stream_options.include_usage`, parses the SSE events as they arrive
and stamps each one with `time.perf_counter()` the moment its line is read. The record keeps every
output chunk's arrival time (seconds after send) and how many tokens it carried, the server's `usage`
block, the generated text and, when the server returns them, the generated token ids. Nothing here
computes statistics (metrics.py does) and nothing raises for a failed request: HTTP errors, broken
streams and timeouts become a record with `ok=False` and the error kept, so no failure is dropped.

Which event is the first token (see ../shared/reference/serving-bench-anchors.md §2.1, §3.5): vLLM's
client counts the first SSE event with non-empty `choices`, which includes the role-only chunk that an
OpenAI server may flush before any token exists. We count the first chunk that carries generated
output: non-empty `text` (completions), `delta.content`, `delta.reasoning_content` or
`delta.tool_calls` (chat). The role chunk and the trailing usage-only chunk are not output chunks, so
neither TTFT nor E2E (send → last output chunk) is stamped on them.

Tokens per chunk, best source first: the chunk's `token_ids` (vLLM's `return_token_ids`: each chunk
carries its new ids; `g4bench serve` does the same), the growth of a per-chunk
`usage.completion_tokens` (vLLM's `continuous_usage_stats`), else one token per chunk (marked
`chunk_tokens_source="assumed"`; checks.py then compares against usage). A chunk with ids but no
text (a token whose text is held back) is still an output chunk: a token arrived. A server that puts
the whole completion's ids on the finish chunk only (empty text, after content chunks without ids)
gives us the generated ids for the agent history but no per-chunk counts.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import httpx

CONNECTION_ERRORS = (httpx.ConnectError, httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError)


@dataclass
class RequestSpec:
    """One request to send: where, what, and labels that travel into its record."""

    endpoint: str  # "/v1/completions" | "/v1/chat/completions"
    body: dict[str, Any]  # without stream / stream_options (added by the client)
    request_id: str
    agent_id: int | None = None
    task_id: int | None = None
    turn: int | None = None  # 0-based turn index inside an agent task
    input_len: int | None = None  # prompt tokens the workload intended (None: text prompt)
    prompt_ids: list[int] | None = None  # token-id prompts only, for the prefix check


@dataclass
class RequestRecord:
    """Everything one request produced. Times are seconds; `*_s` fields are relative to run start."""

    request_id: str
    endpoint: str
    agent_id: int | None = None
    task_id: int | None = None
    turn: int | None = None
    input_len: int | None = None
    max_tokens: int | None = None
    scheduled_s: float = 0.0  # when the workload wanted to send it (arrival time)
    send_s: float = 0.0  # when it was actually sent; send_s - scheduled_s = client queue time
    ok: bool = False
    error: str | None = None
    error_kind: str | None = None  # "http" | "connection" | "timeout" | "protocol"
    status_code: int | None = None
    chunk_times: list[float] = field(default_factory=list)  # output chunk arrivals, s after send
    chunk_tokens: list[int] = field(default_factory=list)  # tokens carried by each output chunk
    chunk_tokens_source: str = "assumed"  # "token_ids" | "usage" | "assumed"
    end_s: float | None = None  # arrival of the last output chunk, relative to run start
    done: bool = False  # saw `data: [DONE]`
    finish_reason: str | None = None
    prompt_tokens: int | None = None  # usage
    completion_tokens: int | None = None  # usage
    cached_tokens: int | None = None  # usage.prompt_tokens_details.cached_tokens
    text: str = ""
    tool_call_deltas: list[dict] = field(default_factory=list)  # streamed `delta.tool_calls` entries
    output_ids: list[int] | None = None  # generated token ids when the server returns them
    prompt_ids: list[int] | None = None

    @property
    def queue_s(self) -> float:
        return max(0.0, self.send_s - self.scheduled_s)

    @property
    def streamed_tokens(self) -> int:
        return sum(self.chunk_tokens)

    @property
    def output_tokens(self) -> int:
        """Server-counted output tokens (usage), else what the stream carried."""
        return self.completion_tokens if self.completion_tokens is not None else self.streamed_tokens

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _chunk_output(choice: dict[str, Any]) -> tuple[str, bool]:
    """(text, is_output) for one streamed choice; role-only and empty deltas are not output."""
    if "text" in choice:
        text = choice.get("text") or ""
        return text, bool(text) or bool(choice.get("token_ids"))
    delta = choice.get("delta") or {}
    content = delta.get("content") or ""
    reasoning = delta.get("reasoning_content") or delta.get("reasoning") or ""
    return content + reasoning, bool(content or reasoning or delta.get("tool_calls"))


class _StreamState:
    """Accumulates one stream's events into a record (kept apart so tests can feed events directly)."""

    def __init__(self, record: RequestRecord, t_send: float, t0: float) -> None:
        self.rec, self.t_send, self.t0 = record, t_send, t0
        self.last_usage_completion = 0
        self.ids: list[int] = []
        self.saw_ids = False

    def event(self, data: str, t: float) -> None:
        if data.strip() == "[DONE]":
            self.rec.done = True
            return
        try:
            obj = json.loads(data)
        except json.JSONDecodeError as e:
            raise ValueError(f"bad SSE JSON: {data[:200]!r}") from e
        if "error" in obj and not obj.get("choices"):
            raise ValueError(f"server error in stream: {json.dumps(obj['error'])[:300]}")
        usage = obj.get("usage")
        choices = obj.get("choices") or []
        n_tokens: int | None = None
        if choices:
            choice = choices[0]
            text, is_output = _chunk_output(choice)
            self.rec.tool_call_deltas.extend((choice.get("delta") or {}).get("tool_calls") or [])
            ids = choice.get("token_ids")
            if (
                isinstance(ids, list)
                and ids
                and choice.get("finish_reason")
                and not text
                and not self.ids
                and self.rec.chunk_times
            ):
                # the whole completion's ids on the finish chunk only (some servers' form), not a delta
                self.saw_ids, self.ids = True, [int(i) for i in ids]
                ids, is_output = None, False
            if isinstance(ids, list):
                self.saw_ids = True
                self.ids.extend(int(i) for i in ids)
                n_tokens, source = len(ids), "token_ids"
            elif usage and usage.get("completion_tokens") is not None:
                n_tokens = int(usage["completion_tokens"]) - self.last_usage_completion
                source = "usage"
            else:
                source = "assumed"
            if usage and usage.get("completion_tokens") is not None:
                self.last_usage_completion = int(usage["completion_tokens"])
            if is_output or (n_tokens or 0) > 0:
                self.rec.chunk_times.append(t - self.t_send)
                self.rec.chunk_tokens.append(n_tokens if n_tokens is not None else 1)
                self.rec.chunk_tokens_source = source
                self.rec.text += text
                self.rec.end_s = t - self.t0
            if choice.get("finish_reason"):
                self.rec.finish_reason = choice["finish_reason"]
        if usage and not choices:  # the final usage chunk
            self.rec.prompt_tokens = usage.get("prompt_tokens")
            self.rec.completion_tokens = usage.get("completion_tokens")
            details = usage.get("prompt_tokens_details") or {}
            self.rec.cached_tokens = details.get("cached_tokens")

    def finish(self) -> None:
        if self.saw_ids:
            self.rec.output_ids = self.ids


def _sse_data(lines: list[str]) -> str | None:
    data = [ln[5:].lstrip(" ") if ln.startswith("data:") else None for ln in lines]
    kept = [d for d in data if d is not None]
    return "\n".join(kept) if kept else None


async def stream_request(
    client: httpx.AsyncClient,
    base_url: str,
    spec: RequestSpec,
    *,
    t0: float,
    scheduled_s: float,
    timeout_s: float,
    headers: dict[str, str] | None = None,
) -> RequestRecord:
    """Send `spec` streaming; return its record (never raises for request-level failures).

    `t0` is the run's perf_counter origin; `scheduled_s` the intended send time relative to it.
    `timeout_s` bounds the whole request (send → [DONE]); exceeding it records `error_kind="timeout"`.
    """
    body = dict(spec.body)
    body["stream"] = True
    body["stream_options"] = {"include_usage": True}
    rec = RequestRecord(
        request_id=spec.request_id,
        endpoint=spec.endpoint,
        agent_id=spec.agent_id,
        task_id=spec.task_id,
        turn=spec.turn,
        input_len=spec.input_len,
        max_tokens=body.get("max_tokens"),
        scheduled_s=scheduled_s,
        prompt_ids=spec.prompt_ids,
    )
    t_send = time.perf_counter()
    rec.send_s = t_send - t0
    state = _StreamState(rec, t_send, t0)
    try:
        async with asyncio.timeout(timeout_s):
            async with client.stream("POST", base_url + spec.endpoint, json=body, headers=headers) as resp:
                rec.status_code = resp.status_code
                if resp.status_code != 200:
                    raw = (await resp.aread()).decode(errors="replace")
                    rec.error, rec.error_kind = f"HTTP {resp.status_code}: {raw[:500]}", "http"
                    return rec
                pending: list[str] = []
                async for line in resp.aiter_lines():
                    t = time.perf_counter()
                    if line:
                        pending.append(line)
                        if not line.startswith("data:") or not line.endswith(("}", "]")):
                            continue  # multi-line event: wait for its blank line
                    data = _sse_data(pending)
                    pending = []
                    if data is not None:
                        state.event(data, t)
                if pending and (data := _sse_data(pending)) is not None:
                    state.event(data, time.perf_counter())
        state.finish()
        if not rec.done:
            rec.error, rec.error_kind = "stream ended without [DONE]", "protocol"
        elif not rec.chunk_times and (rec.max_tokens or 1) > 0:
            rec.error, rec.error_kind = "stream carried no output tokens", "protocol"
        else:
            rec.ok = True
    except TimeoutError:
        rec.error, rec.error_kind = f"timed out after {timeout_s:g} s", "timeout"
    except CONNECTION_ERRORS as e:
        rec.error, rec.error_kind = f"{type(e).__name__}: {e}", "connection"
    except httpx.HTTPError as e:
        rec.error, rec.error_kind = f"{type(e).__name__}: {e}", "connection"
    except ValueError as e:
        rec.error, rec.error_kind = str(e), "protocol"
    state.finish()
    return rec
