"""Agent-protocol request fields: OpenAI-shaped bodies validate (as mixins on today's request
models), inconsistent ones fail naming the field, and grammar_request() compiles."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from g4bench.engine.grammar import compile_grammar
from g4bench.server.agent_fields import ChatAgentFields, CompletionLogprobsField, MessageToolFields
from g4bench.server.protocol import ChatCompletionRequest, ChatMessage, CompletionRequest


class ChatRequest(ChatCompletionRequest, ChatAgentFields):
    pass


class Message(ChatMessage, MessageToolFields):
    pass


class TextRequest(CompletionRequest, CompletionLogprobsField):
    pass


TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}
BASE = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


def test_full_body_validates_and_compiles():
    req = ChatRequest.model_validate(
        {
            **BASE,
            "tools": [TOOL],
            "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
            "parallel_tool_calls": False,
            "logprobs": True,
            "top_logprobs": 3,
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "x", "schema": {"type": "object"}, "strict": True},
            },
        }  # fmt: skip
    )
    args = req.grammar_request()
    assert args["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "x", "schema": {"type": "object"}, "strict": True},
    }
    assert args["tool_choice"] == {"type": "function", "function": {"name": "get_weather"}}
    assert compile_grammar(**args).startswith("start: call\n")
    no_tools = ChatRequest.model_validate(
        {**BASE, "response_format": {"type": "json_object"}}
    ).grammar_request()
    assert compile_grammar(**no_tools).startswith("start: %json")
    assert compile_grammar(**ChatRequest.model_validate(BASE).grammar_request()) is None


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"tool_choice": "required"}, "needs tools"),
        (
            {"tools": [TOOL], "tool_choice": {"type": "function", "function": {"name": "nope"}}},
            "not in tools",
        ),
        ({"top_logprobs": 2}, "needs logprobs"),
        ({"logprobs": True, "top_logprobs": 21}, "less than or equal to 20"),
        ({"response_format": {"type": "json_schema"}}, "needs a json_schema"),
        ({"tools": [{"type": "function", "function": {"name": "bad name!"}}]}, "pattern"),
    ],
)
def test_inconsistent_bodies_fail(extra, message):
    with pytest.raises(ValidationError, match=message):
        ChatRequest.model_validate({**BASE, **extra})


def test_message_and_completion_fields():
    m = Message.model_validate({"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]})  # fmt: skip
    assert m.tool_calls[0].function.arguments == "{}"
    assert Message.model_validate({"role": "tool", "tool_call_id": "c1", "content": "r"}).tool_call_id == "c1"
    assert TextRequest.model_validate({"model": "m", "prompt": "x", "logprobs": 5}).logprobs == 5
