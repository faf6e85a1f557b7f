"""OpenAI request and response schemas (pydantic), plus g4bench's benchmarking extensions.

Requests are parsed leniently about *unknown* fields (clients send `user`, `metadata`, ... that
change nothing) and strictly about known ones: wrong types, n > 1, empty messages, and every number
outside the range the engine can honour (max_tokens, min_tokens and top_k fit an int32, seeds an
int64, temperature and top_p their usual ranges) fail validation and become a 400 with an OpenAI
error body naming the field (see requests.py).

The agent protocol's fields (agent_fields.py) are mixed in: `tools`, `tool_choice`,
`parallel_tool_calls`, `response_format`, `logprobs` / `top_logprobs` (chat), `logprobs` (completions),
and messages' `tool_calls` / `tool_call_id` / `name`. Responses carry `tool_calls`,
`reasoning_content` (vLLM's field) and `logprobs` in OpenAI's shapes.

`UNSUPPORTED` lists OpenAI fields that ask for something this server does not do (legacy
function calls, vLLM's guided_* fields, echo, best-of, penalties, logit bias). Silently ignoring them
would let a client believe its constraint was applied, so each is a 400 naming the field, unless
its value is one that asks for nothing: null, and the listed no-op values (`tools: []`,
`echo: false`, `best_of: 1`, penalties of 0, `logit_bias: {}`, ...).

Extensions beyond OpenAI, named as vLLM names them: `ignore_eos`, `min_tokens`, `top_k`, and
`return_token_ids` — when true the response carries `prompt_token_ids` at the top level and the
choice's completion `token_ids`; a stream carries `prompt_token_ids` on its first chunk and each
chunk's new ids in `choices[0].token_ids`, so a load tester can count tokens per chunk and check
prefix reuse token by token.
"""

from __future__ import annotations

import time
import uuid
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, field_validator, model_validator

from g4bench.server.agent_fields import (
    ChatAgentFields,
    CompletionLogprobsField,
    MessageToolFields,
    ResponseFormat,
)

# A field that is left out of the JSON while it is None (extensions, deltas, usage in chunks).
_OMIT_NONE: Any = Field(default=None, exclude_if=lambda v: v is None)

Role = Literal["system", "developer", "user", "assistant", "tool"]


INT32_MAX = 2**31 - 1
MAX_STOP_CHARS = 256  # the stop-string scan runs in the engine thread, per token
INT64 = (-(2**63), 2**63 - 1)

# Field -> the values that ask for nothing (besides null); any other value is a 400 naming the field.
# Compared with their type (`0` is not `false`), see `unsupported_field`.
UNSUPPORTED: dict[str, tuple] = {
    "functions": ([],),
    "function_call": ("none",),
    "guided_json": (),
    "guided_regex": (),
    "guided_choice": (),
    "guided_grammar": (),
    "prompt_logprobs": (),
    "echo": (False,),
    "best_of": (1,),
    "suffix": ("",),
    "presence_penalty": (0, 0.0),
    "frequency_penalty": (0, 0.0),
    "repetition_penalty": (1, 1.0),
    "min_p": (0, 0.0),
    "logit_bias": ({},),
    "bad_words": ([],),
}


def unsupported_field(body: dict) -> str | None:
    """The first field of `body` that asks for something this server does not do, or None."""
    for name, noops in UNSUPPORTED.items():
        if name in body:
            value = body[name]
            if value is not None and not any(type(value) is type(v) and value == v for v in noops):
                return name
    return None


class _Lenient(BaseModel):
    model_config = ConfigDict(extra="ignore")


class TextPart(_Lenient):
    type: Literal["text"]
    text: str


class ChatMessage(MessageToolFields):
    role: Role
    content: str | list[TextPart] | None = None

    def template_dict(self) -> dict[str, Any]:
        """The message as chat templates read it (tool fields only where present)."""
        out: dict[str, Any] = {"role": self.role, "content": self.text()}
        if self.tool_calls:
            out["tool_calls"] = [c.model_dump() for c in self.tool_calls]
        for key in ("tool_call_id", "name"):
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
        return out

    @property
    def uses_tools(self) -> bool:
        return self.role == "tool" or bool(self.tool_calls)

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(p.text for p in self.content)


class StreamOptions(_Lenient):
    include_usage: StrictBool = False


class SamplingFields(_Lenient):
    """Fields shared by chat and completions requests."""

    model: str
    max_tokens: Annotated[StrictInt, Field(ge=1, le=INT32_MAX)] | None = None
    temperature: Annotated[float, Field(strict=True, ge=0.0, le=2.0, allow_inf_nan=False)] | None = None
    top_p: Annotated[float, Field(strict=True, gt=0.0, le=1.0, allow_inf_nan=False)] | None = None
    # -1 or 0: off (vLLM spells off as -1); a value past the vocabulary means the same as off.
    top_k: Annotated[StrictInt, Field(ge=-1, le=INT32_MAX)] | None = None
    seed: Annotated[StrictInt, Field(ge=INT64[0], le=INT64[1])] | None = None
    stop: list[str] | None = None  # a single string is accepted as a list of one
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    n: Annotated[StrictInt, Field(ge=1, le=1)] = 1  # only one choice per request
    ignore_eos: StrictBool = False
    min_tokens: Annotated[StrictInt, Field(ge=0, le=INT32_MAX)] = 0
    return_token_ids: StrictBool = False

    @field_validator("stop", mode="before")
    @classmethod
    def _one_stop(cls, v: Any) -> Any:
        return [v] if isinstance(v, str) else v

    @field_validator("stop")
    @classmethod
    def _stops(cls, v: list[str] | None) -> list[str] | None:
        if v is not None and (len(v) > 4 or any(not 0 < len(s) <= MAX_STOP_CHARS for s in v)):
            raise ValueError(
                f"stop must be at most 4 non-empty strings of at most {MAX_STOP_CHARS} characters"
            )
        return v

    @property
    def output_limit(self) -> int | None:
        """The most tokens to generate (None: up to the context length)."""
        return self.max_tokens

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


class ChatCompletionRequest(SamplingFields, ChatAgentFields):
    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    max_completion_tokens: Annotated[StrictInt, Field(ge=1, le=INT32_MAX)] | None = None

    @property
    def output_limit(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens


class CompletionRequest(SamplingFields, CompletionLogprobsField):
    # Text, a list of token ids, or a list holding exactly one string (or one id list).
    prompt: str | list[StrictInt] | list[str] | list[list[StrictInt]]
    response_format: ResponseFormat | None = None  # as chat's (vLLM accepts it on completions too)

    @field_validator("prompt")
    @classmethod
    def _one_prompt(cls, v: Any) -> Any:
        if isinstance(v, list):
            if not v:
                raise ValueError("prompt must not be empty")
            if isinstance(v[0], str | list):
                if len(v) != 1:
                    raise ValueError("only one prompt per request is supported")
                v = v[0]
        if isinstance(v, list) and not v:
            raise ValueError("prompt must not be empty")
        return v

    @model_validator(mode="after")
    def _default_limit(self) -> CompletionRequest:
        if self.max_tokens is None:
            self.max_tokens = 16  # OpenAI's completions default
        return self


# ---- responses (serialized with model_dump_json(); optional extras vanish when None) ----------------------------------------------------------------------------------
class PromptTokensDetails(BaseModel):
    cached_tokens: int = 0


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails


def make_usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> Usage:
    return Usage(
        prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens,
        total_tokens=prompt_tokens + completion_tokens,
        prompt_tokens_details=PromptTokensDetails(cached_tokens=cached_tokens),
    )


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


def now_s() -> int:
    return int(time.time())


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None
    reasoning_content: str | None = _OMIT_NONE
    tool_calls: list[dict[str, Any]] | None = _OMIT_NONE


class ChatChoice(BaseModel):
    index: int = 0
    message: AssistantMessage
    finish_reason: str | None
    logprobs: dict[str, Any] | None = None
    token_ids: list[int] | None = _OMIT_NONE


class ChatCompletionResponse(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage
    prompt_token_ids: list[int] | None = _OMIT_NONE


class ChatDelta(BaseModel):
    role: Literal["assistant"] | None = _OMIT_NONE
    content: str | None = _OMIT_NONE
    reasoning_content: str | None = _OMIT_NONE
    tool_calls: list[dict[str, Any]] | None = _OMIT_NONE  # each with its `index`


class ChatChunkChoice(BaseModel):
    index: int = 0
    delta: ChatDelta
    finish_reason: str | None = None
    logprobs: dict[str, Any] | None = None
    token_ids: list[int] | None = _OMIT_NONE


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatChunkChoice]
    usage: Usage | None = _OMIT_NONE
    prompt_token_ids: list[int] | None = _OMIT_NONE


class CompletionChoice(BaseModel):
    index: int = 0
    text: str
    finish_reason: str | None = None
    logprobs: dict[str, Any] | None = None
    token_ids: list[int] | None = _OMIT_NONE


class CompletionResponse(BaseModel):
    """Also the streamed chunk shape (`object` is "text_completion" in both, as in OpenAI)."""

    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = _OMIT_NONE
    prompt_token_ids: list[int] | None = _OMIT_NONE


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "g4bench"
    max_model_len: int


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    error: ErrorDetail
