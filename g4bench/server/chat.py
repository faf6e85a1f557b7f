"""Chat messages -> prompt token ids, and the ids / strings that end a model turn.

Two templates:

- Synthetic models (`SyntheticTokenizer`) use a fixed Gemma-style layout, BOS first:

      <bos><|turn>system\\n{content}<turn|>\\n<|turn>user\\n{content}<turn|>\\n<|turn>model\\n

  (`assistant` is spelled `model`; `developer` is spelled `system`.) The synthetic vocabulary has no
  `<turn|>` token, so the string `<turn|>` is a stop string for it.
- Real checkpoints render their own `chat_template` (chat_template.jinja or tokenizer_config.json)
  with jinja2 in a sandbox, as transformers does (`add_generation_prompt=True`), then encode the
  text without special-token post-processing and prepend BOS if the template did not emit it
  (seed-engine-notes §5 item 10). A turn ends at EOS, pad, or the `<turn|>` / `<end_of_turn>`
  token, each only if the vocabulary really has it (`token_id` returns None otherwise, never the unk
  id: item 20), plus generation_config.json's eos ids.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime

from g4bench.server.chat_tools import TemplateError, render_tools_prompt
from g4bench.server.synthetic_tokenizer import SyntheticTokenizer
from g4bench.server.tokenizer import HFTokenizer, Tokenizer

TURN_END = "<turn|>"
TEMPLATE_ROLES = {
    "system": "system",
    "developer": "system",
    "user": "user",
    "assistant": "model",
    "tool": "tool",
}


def render_synthetic_template(messages: Sequence[dict]) -> str:
    parts = [f"<|turn>{TEMPLATE_ROLES[m['role']]}\n{m['content']}{TURN_END}\n" for m in messages]
    return "".join(parts) + "<|turn>model\n"


class ChatFormatter:
    """Turns a list of {"role", "content"} dicts into prompt ids for one tokenizer."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
        template = getattr(tokenizer, "chat_template", None)
        self._template = (
            None if isinstance(tokenizer, SyntheticTokenizer) or not template else _compile(template)
        )
        stop_ids = {tokenizer.eos_token_id, tokenizer.pad_token_id}
        self.stop_strings: list[str] = []
        if isinstance(tokenizer, SyntheticTokenizer):
            self.stop_strings.append(TURN_END)
        else:
            stop_ids |= {tokenizer.token_id(TURN_END), tokenizer.token_id("<end_of_turn>")}
        if isinstance(tokenizer, HFTokenizer):
            stop_ids |= set(tokenizer.generation_eos_ids)
        self.stop_token_ids = frozenset(i for i in stop_ids if i is not None)

    def render(self, messages: Sequence[dict], tools: Sequence[dict] | None = None) -> str:
        """The prompt text; `tools` (OpenAI tool dicts) and messages' tool fields go to the
        checkpoint's template, or for synthetic models to the Gemma-4-shaped one (chat_tools.py)."""
        if self._template is None:
            # A tool message with no assistant tool_calls before it keeps the plain layout (a
            # `tool` turn), as before tools were supported.
            if tools or any(m.get("tool_calls") for m in messages):
                return render_tools_prompt(messages, tools)
            return render_synthetic_template(messages)
        tok = self.tokenizer
        try:
            return self._template.render(
                messages=list(messages),
                tools=list(tools) if tools else None,
                add_generation_prompt=True,
                bos_token=getattr(tok, "bos_token", ""),
                eos_token=getattr(tok, "eos_token", ""),
            )
        except TemplateError:
            raise
        except Exception as exc:  # jinja raises many types; the client's conversation caused it
            raise TemplateError(f"chat template failed: {exc}") from exc

    def encode(self, messages: Sequence[dict], tools: Sequence[dict] | None = None) -> list[int]:
        return self.tokenizer.encode(self.render(messages, tools), add_bos=True)


def _raise(message: str) -> None:
    raise TemplateError(message)


def _compile(source: str):
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = lambda x, indent=None, ensure_ascii=False: json.dumps(
        x, indent=indent, ensure_ascii=ensure_ascii
    )
    env.globals["raise_exception"] = _raise
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env.from_string(source)
