"""One request's response objects in the endpoint's OpenAI shape: a whole response, or the SSE chunks
of a stream (role chunk, content deltas, finish chunk, usage chunk). With `return_token_ids`
(vLLM's form) a whole response carries `prompt_token_ids` and the choice's `token_ids`; a stream
carries `prompt_token_ids` on its first chunk and each chunk's new ids in `choices[0].token_ids`.
"""

from __future__ import annotations

from typing import Any

from g4bench.engine.scheduler import RequestResult
from g4bench.server import protocol as p


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

    def whole(self, text: str, r: RequestResult) -> dict:
        prompt_ids, ids = self._ids(r)
        common: dict[str, Any] = {
            "id": self.id,
            "created": self.created,
            "model": self.model,
            "usage": self._usage(r),
        }
        if self.chat:
            choice = p.ChatChoice(
                message=p.AssistantMessage(content=text), finish_reason=r.finish_reason, token_ids=ids
            )
            resp: Any = p.ChatCompletionResponse(choices=[choice], prompt_token_ids=prompt_ids, **common)
        else:
            done = p.CompletionChoice(text=text, finish_reason=r.finish_reason, token_ids=ids)
            resp = p.CompletionResponse(choices=[done], prompt_token_ids=prompt_ids, **common)
        return resp.model_dump(mode="json")

    def _chunk(self, choices: list, **extra):
        cls: Any = p.ChatCompletionChunk if self.chat else p.CompletionResponse
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
