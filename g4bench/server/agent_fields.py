"""Request fields of the agent protocol (tools, tool_choice, response_format, logprobs) as pydantic
mixins, mixed into protocol.py's request and message models:

    class ChatCompletionRequest(SamplingFields, ChatAgentFields): ...
    class CompletionRequest(SamplingFields, CompletionLogprobsField): ...
    class ChatMessage(_Lenient, MessageToolFields): ...

Validation follows OpenAI: `tool_choice` "required" or a named function needs `tools` (and the name
must be one of them); `response_format` "json_schema" needs its `json_schema.schema`;
`top_logprobs` (0..20) needs `logprobs: true`. Errors are ValueErrors naming the field, which the
server's validation handler turns into a 400. `grammar_request()` hands the engine exactly what
`g4bench.engine.grammar.compile_grammar` takes, as plain dicts, so the engine never sees pydantic.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, model_validator

_NAME = r"^[A-Za-z0-9_.\-]{1,64}$"


class _Lenient(BaseModel):
    model_config = ConfigDict(extra="ignore", populate_by_name=True)


class FunctionDef(_Lenient):
    name: Annotated[str, Field(pattern=_NAME)]
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: StrictBool | None = None


class ToolDef(_Lenient):
    type: Literal["function"] = "function"
    function: FunctionDef


class NamedFunction(_Lenient):
    name: str


class NamedToolChoice(_Lenient):
    type: Literal["function"] = "function"
    function: NamedFunction


class JsonSchemaSpec(_Lenient):
    name: str = "response"
    description: str | None = None
    json_schema: dict[str, Any] = Field(alias="schema")
    strict: StrictBool | None = None


class ResponseFormat(_Lenient):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaSpec | None = None

    @model_validator(mode="after")
    def _schema_present(self) -> ResponseFormat:
        if self.type == "json_schema" and self.json_schema is None:
            raise ValueError("response_format of type json_schema needs a json_schema object with a schema")
        return self


class FunctionCall(_Lenient):
    name: str
    arguments: str  # JSON text, as OpenAI sends it


class ToolCall(_Lenient):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class MessageToolFields(_Lenient):
    """Extra message fields: an assistant turn's `tool_calls`, a tool message's `tool_call_id`."""

    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None
    name: str | None = None


class ChatAgentFields(_Lenient):
    tools: list[ToolDef] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: StrictBool = True
    response_format: ResponseFormat | None = None
    logprobs: StrictBool = False
    top_logprobs: Annotated[StrictInt, Field(ge=0, le=20)] | None = None
    # g4bench extension (as `return_token_ids`): tokens the model may spend inside Gemma's
    # `<|channel>thought ... <channel|>` before the channel is closed for it (g4bench/engine/thinking.py)
    thinking_budget: Annotated[StrictInt, Field(ge=1, le=1_000_000)] | None = None

    @model_validator(mode="after")
    def _consistent(self) -> ChatAgentFields:
        names = {t.function.name for t in self.tools or []}
        if self.tool_choice == "required" and not names:
            raise ValueError("tool_choice 'required' needs tools")
        if isinstance(self.tool_choice, NamedToolChoice) and self.tool_choice.function.name not in names:
            raise ValueError(f"tool_choice names {self.tool_choice.function.name!r}, which is not in tools")
        if self.top_logprobs is not None and not self.logprobs:
            raise ValueError("top_logprobs needs logprobs: true")
        return self

    def grammar_request(self) -> dict[str, Any]:
        """Keyword arguments for `compile_grammar` (plain dicts)."""
        choice = self.tool_choice
        return {
            "response_format": None
            if self.response_format is None
            else self.response_format.model_dump(by_alias=True, exclude_none=True),
            "tools": [t.model_dump(exclude_none=True) for t in self.tools or []],
            "tool_choice": choice.model_dump() if isinstance(choice, NamedToolChoice) else choice,
            "parallel_tool_calls": self.parallel_tool_calls,
        }


class CompletionLogprobsField(_Lenient):
    """Completions' `logprobs`: how many top alternatives per token (0..5 in OpenAI; vLLM allows 20)."""

    logprobs: Annotated[StrictInt, Field(ge=0, le=20)] | None = None
