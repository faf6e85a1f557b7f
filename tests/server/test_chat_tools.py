"""The Gemma-4-shaped tools template for synthetic models: exact layout, agreement with the plain
byte template, and calls rendered in the history parse back to the same arguments."""

from __future__ import annotations

import json

import pytest

from g4bench.server.chat import TemplateError, render_synthetic_template
from g4bench.server.chat_tools import render_tools_prompt, to_gemma
from g4bench.server.gemma_args import gemma_to_json
from g4bench.server.toolcalls import parse_output

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather.",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
]
CALL = {
    "id": "c1",
    "type": "function",
    "function": {"name": "get_weather", "arguments": '{"city": "Paris", "days": [1, 2]}'},
}
HISTORY = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": None, "tool_calls": [CALL]},
    {"role": "tool", "tool_call_id": "c1", "content": '{"temp": 21}'},
]
Q = '<|"|>'


def test_tool_turn_layout_ends_at_tool_response():
    assert render_tools_prompt(HISTORY, TOOLS) == (
        "<|turn>system\nBe brief."
        f"<|tool>declaration:get_weather{{description:{Q}Weather.{Q},parameters:{{type:{Q}object{Q},"
        f"properties:{{city:{{type:{Q}string{Q}}}}}}}}}<tool|><turn|>\n"
        "<|turn>user\nWeather in Paris?<turn|>\n"
        f"<|turn>model\n<|tool_call>call:get_weather{{city:{Q}Paris{Q},days:[1,2]}}<tool_call|>"
        "<|tool_response>response:get_weather{temp:21}<tool_response|>"
    )


def test_answer_after_results_closes_the_model_turn():
    text = render_tools_prompt(
        [
            *HISTORY,
            {"role": "tool", "tool_call_id": "c1", "content": "plain text"},
            {"role": "assistant", "content": "Sunny."},
            {"role": "user", "content": "Thanks"},
        ],  # fmt: skip
        TOOLS,
    )
    assert text.endswith(
        f"<|tool_response>response:get_weather{{output:{Q}plain text{Q}}}<tool_response|>Sunny.<turn|>\n"
        "<|turn>user\nThanks<turn|>\n<|turn>model\n"
    )


def test_plain_conversations_match_the_byte_template():
    conv = [{"role": "system", "content": "S"}, {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "yo"}, {"role": "user", "content": "again"}]  # fmt: skip
    assert render_tools_prompt(conv) == render_synthetic_template(conv)
    assert render_tools_prompt(conv[1:]) == render_synthetic_template(conv[1:])


def test_history_calls_parse_back():
    text = render_tools_prompt(HISTORY[:3], TOOLS, add_generation_prompt=False)
    model_part = text.split("<|turn>model\n", 1)[1]
    calls = parse_output(model_part).tool_calls
    assert [json.loads(c["function"]["arguments"]) for c in calls] == [{"city": "Paris", "days": [1, 2]}]
    value = {"a": [1, "x y", None, True, {"b": -2.5}], "c": "<odd> {text}"}
    assert json.loads(gemma_to_json(to_gemma(value))) == value


def test_errors_name_the_problem():
    with pytest.raises(TemplateError, match="must follow an assistant"):
        render_tools_prompt(
            [{"role": "user", "content": "x"}, {"role": "tool", "tool_call_id": "z", "content": "r"}]
        )
    bad = {**CALL, "function": {"name": "f", "arguments": "{not json"}}
    with pytest.raises(TemplateError, match="not JSON"):
        render_tools_prompt([{"role": "user", "content": "x"}, {"role": "assistant", "tool_calls": [bad]}])
