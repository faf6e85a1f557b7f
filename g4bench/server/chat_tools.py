"""Chat prompts with tools for synthetic models: a Gemma-4-shaped template (templates/gemma4_tools.jinja).

Real checkpoints render `tools`, assistant `tool_calls` and `tool` messages through their own chat
template (`ChatFormatter.render` passes them through). Synthetic models have no
template, so this module renders the same structure Gemma 4's templates produce:

    <bos><|turn>system\\n{system}<|tool>declaration:NAME{description:<|"|>..<|"|>,parameters:{..}}<tool|><turn|>\\n
    <|turn>user\\n{text}<turn|>\\n
    <|turn>model\\n{content}<|tool_call>call:NAME{args}<tool_call|>
    <|tool_response>response:NAME{output:<|"|>..<|"|>}<tool_response|>     (still the model's turn)
    {the model's answer after the results}<turn|>\\n
    <|turn>model\\n                                                          (generation prompt)

A prompt whose last message is a tool result ends at ``<tool_response|>``: the model continues its
own turn (Gemma 4's templates do the same; TensorSharp measured that priming anything there hurts).
Values are written in Gemma's argument syntax (`to_gemma`): bare keys, strings in ``<|"|>``, so the
model sees calls in the syntax it emits and `g4bench.server.toolcalls` parses them back.
A tool message whose text is a JSON object is passed as that object; other text as {output: text}.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from functools import cache
from pathlib import Path


class TemplateError(ValueError):
    """The chat template rejected the conversation (e.g. roles that do not alternate)."""


TEMPLATE = Path(__file__).parent / "templates" / "gemma4_tools.jinja"
STRING_DELIM = '<|"|>'


def to_gemma(value: object) -> str:
    """A JSON value in Gemma's tool-call argument syntax."""
    if isinstance(value, dict):
        return "{" + ",".join(f"{k}:{to_gemma(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ",".join(to_gemma(v) for v in value) + "]"
    if isinstance(value, str):
        return STRING_DELIM + value + STRING_DELIM
    return json.dumps(value)


def _args(arguments: str | dict) -> str:
    if isinstance(arguments, dict):
        return to_gemma(arguments)
    try:
        value = json.loads(arguments)
    except json.JSONDecodeError as exc:
        raise TemplateError(f"tool_calls arguments are not JSON: {exc}") from exc
    if not isinstance(value, dict):
        raise TemplateError("tool_calls arguments must be a JSON object")
    return to_gemma(value)


def _tool_result(content: str | None) -> str:
    text = content or ""
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        value = None
    return to_gemma(value if isinstance(value, dict) else {"output": text})


def _raise(message: str) -> None:
    raise TemplateError(message)


@cache
def _template():
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(keep_trailing_newline=True)
    env.filters.update(gemma=to_gemma, args=_args, tool_result=_tool_result)
    env.globals["raise_exception"] = _raise
    return env.from_string(TEMPLATE.read_text())


def render_tools_prompt(
    messages: Sequence[dict],
    tools: Sequence[dict] | None = None,
    *,
    add_generation_prompt: bool = True,
    bos_token: str = "",
) -> str:
    """OpenAI-shaped messages (with optional `tool_calls` / `tool` messages) and tools -> prompt text.
    The byte tokenizer adds BOS itself (`encode(add_bos=True)`), hence the empty default."""
    call_names = {
        call["id"]: call["function"]["name"]
        for m in messages
        if m.get("role") == "assistant"
        for call in m.get("tool_calls") or []
    }
    try:
        return _template().render(
            messages=list(messages),
            tools=list(tools or []),
            call_names=call_names,
            add_generation_prompt=add_generation_prompt,
            bos_token=bos_token,
        )
    except TemplateError:
        raise
    except Exception as exc:  # jinja raises many types; the client's conversation caused it
        raise TemplateError(f"tools chat template failed: {exc}") from exc
