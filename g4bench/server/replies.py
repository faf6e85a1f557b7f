"""One request's response objects in the endpoint's OpenAI shape: a whole response, or the SSE chunks
of a stream (role chunk, content deltas, finish chunk, usage chunk). With `return_token_ids`
(vLLM's form) a whole response carries `prompt_token_ids` and the choice's `token_ids`; a stream
carries `prompt_token_ids` on its first chunk and each chunk's new ids in `choices[0].token_ids`.

Chat replies are built from `AgentOutput` (agent_output.py): the whole message's `content`,
`reasoning_content` and `tool_calls` (content is null beside tool calls, as OpenAI's), and per
update one chunk whose delta carries one of them, with the logprobs of the tokens behind it.
"""

from __future__ import annotations

from typing import Any

from g4bench.engine.scheduler import RequestResult
from g4bench.server import protocol as p
from g4bench.server.toolcalls import ParsedOutput


def from_chunks(chunks: list) -> str:
    return "".join(f"data: {c.model_dump_json()}\n\n" for c in chunks)


class Reply:
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

    def whole(
        self,
        text: str,
        r: RequestResult,
        *,
        parsed: ParsedOutput | None = None,
        finish_reason: str | None = None,
        logprobs: dict | None = None,
    ) -> dict:
        prompt_ids, ids = self._ids(r)
        common: dict[str, Any] = {
            "id": self.id,
            "created": self.created,
            "model": self.model,
            "usage": self._usage(r),
        }
        reason = finish_reason or r.finish_reason
        if self.chat:
            parsed = parsed or ParsedOutput(content=text)
            message = p.AssistantMessage(
                content=parsed.content if parsed.tool_calls else (parsed.content or ""),
                reasoning_content=parsed.reasoning_content,
                tool_calls=parsed.tool_calls or None,
            )
            choice = p.ChatChoice(message=message, finish_reason=reason, logprobs=logprobs, token_ids=ids)
            resp: Any = p.ChatCompletionResponse(choices=[choice], prompt_token_ids=prompt_ids, **common)
        else:
            done = p.CompletionChoice(text=text, finish_reason=reason, logprobs=logprobs, token_ids=ids)
            resp = p.CompletionResponse(choices=[done], prompt_token_ids=prompt_ids, **common)
        return resp.model_dump(mode="json")

    def _chunk(self, choices: list, **extra):
        cls: Any = p.ChatCompletionChunk if self.chat else p.CompletionResponse
        return cls(id=self.id, created=self.created, model=self.model, choices=choices, **extra)

    def updates(self, updates: list[dict], first: bool, ids: list[int] | None = None) -> list:
        """Chat: AgentOutput updates -> chunks (the role chunk first); `ids` ride on the first
        update's chunk, or on an empty content chunk when the token surfaced no update yet."""
        prompt_ids = self.prompt if first and self.body.return_token_ids else None
        chunks = []
        if first:
            role = p.ChatChunkChoice(delta=p.ChatDelta(role="assistant", content=""))
            chunks.append(self._chunk([role], prompt_token_ids=prompt_ids))
        if not updates and ids is not None:
            updates = [{"delta": {"content": ""}, "logprobs": None}]
        for i, u in enumerate(updates):
            choice = p.ChatChunkChoice(
                delta=p.ChatDelta(**u["delta"]), logprobs=u["logprobs"], token_ids=ids if i == 0 else None
            )
            chunks.append(self._chunk([choice]))
        return chunks

    def delta(self, text: str, first: bool, ids: list[int] | None = None, logprobs: dict | None = None) -> list:
        """Chat: the role chunk before the first content; completions: a text chunk. `ids` (with
        `return_token_ids`, vLLM's form) are the token ids this chunk adds, possibly none while
        text is held back; the first chunk also carries the prompt's ids."""
        prompt_ids = self.prompt if first and self.body.return_token_ids else None
        if not self.chat:
            choice = p.CompletionChoice(text=text, token_ids=ids, logprobs=logprobs)
            return [self._chunk([choice], prompt_token_ids=prompt_ids)]
        chunks = []
        if first:
            role = p.ChatChunkChoice(delta=p.ChatDelta(role="assistant", content=""))
            chunks.append(self._chunk([role], prompt_token_ids=prompt_ids))
        if text or ids is not None:
            chunks.append(self._chunk([p.ChatChunkChoice(delta=p.ChatDelta(content=text), token_ids=ids)]))
        return chunks

    def finish_chunk(self, r: RequestResult, finish_reason: str | None = None):
        """The streamed finish chunk: no new text and no ids (every id rode on its own chunk)."""
        reason = finish_reason or r.finish_reason
        if self.chat:
            choice: Any = p.ChatChunkChoice(delta=p.ChatDelta(), finish_reason=reason)
        else:
            choice = p.CompletionChoice(text="", finish_reason=reason)
        return self._chunk([choice])

    def usage_chunk(self, r: RequestResult):
        return self._chunk([], usage=self._usage(r))
