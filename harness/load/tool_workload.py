"""The tool-call agent workload: every turn is a forced tool call that the client "executes".

A task is one agent conversation over /v1/chat/completions with real tool declarations (`TOOLS`).
Each turn sends the whole conversation with ``tool_choice`` forcing a call — ``"required"``, or one
named function when `named` is set (rotating through the tools turn by turn) — so even synthetic
weights, whose free text is noise, produce a call the grammar keeps valid. ``parallel_tool_calls:
false`` asks for exactly one call, and the tools' strings are bounded (`maxLength`), so a sampled
call fits in `max_tokens` and the grammar ends the turn. The client then
"executes" the call: it appends the assistant message with its `tool_calls` and one `tool` message
per call carrying a synthetic JSON result of `tool_result_tokens` bytes (= tokens under the
byte-level tokenizer), and the next turn resends everything, so the prompt grows as an agent's does.

Each reply's calls are checked (`check_calls`): present, arguments parse as JSON, arguments
validate against the tool's parameter schema. `ToolCallStats` turns the checks into the
parse / validation rates the report prints. A reply without a valid call still advances the task
(with whatever calls parsed), so one bad turn costs one bad data point, not the whole task.

Streaming replies carry calls as deltas; `fold_tool_call_deltas` assembles them by `index` the
way the OpenAI client does (name and id from the first delta of an index, arguments concatenated).

`g4bench serve-load --workload tools` runs it (runner.py builds `ToolTask`s, one `ToolCallStats`
per concurrency level, reported as `tool_calls` in the level summary). Replies are streamed with
`return_token_ids`, so every token arrives as its own chunk and TTFT / ITL keep their meaning even
though a call's delta is emitted whole when its closing marker arrives.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import jsonschema

from g4bench.server.chat_tools import render_tools_prompt
from harness.load.client import RequestRecord, RequestSpec

_STR = {"type": "string", "maxLength": 16}
TOOLS: list[dict] = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "Current weather for a city.",
        "parameters": {"type": "object", "properties": {"city": _STR, "unit": {"enum": ["celsius", "fahrenheit"]}},
                       "required": ["city"], "additionalProperties": False}}},
    {"type": "function", "function": {
        "name": "search_docs", "description": "Full-text search over the documentation.",
        "parameters": {"type": "object", "properties": {
            "query": _STR, "limit": {"type": "integer", "minimum": 1, "maximum": 20},
            "tags": {"type": "array", "items": {"enum": ["api", "guide", "faq"]}, "maxItems": 3}},
            "required": ["query"], "additionalProperties": False}}},
    {"type": "function", "function": {
        "name": "read_file", "description": "Read lines of a file.",
        "parameters": {"type": "object", "properties": {
            "path": _STR, "start": {"type": "integer", "minimum": 1, "maximum": 100000}, "count": {"type": "integer", "minimum": 1,
                                                                                 "maximum": 200}},
            "required": ["path"], "additionalProperties": False}}},
    {"type": "function", "function": {
        "name": "create_ticket", "description": "Open a ticket.",
        "parameters": {"type": "object", "properties": {
            "title": _STR, "priority": {"enum": ["low", "normal", "high"]},
            "assignee": {"type": "object", "properties": {"team": _STR, "user": _STR}, "required": ["team"],
                         "additionalProperties": False}},
            "required": ["title", "priority"], "additionalProperties": False}}},
]  # fmt: skip


@dataclass(frozen=True)
class ToolWorkloadConfig:
    model: str = "default"
    input_len: int = 500  # bytes of the first user message
    turns: int = 8
    tool_result_tokens: int = 320
    max_tokens: int = 512  # a whole call even at 16 escaped chars (6 bytes each) per string; EOS ends it
    temperature: float = 1.0
    named: bool = False  # force one named function per turn instead of "required"
    seed: int = 0


@dataclass(frozen=True)
class CallCheck:
    """One reply's verdict: calls present, all arguments JSON, all arguments valid for their tool."""

    calls: int
    parsed: bool
    valid: bool
    error: str | None = None


def tools_prompt_tokens(tools: Sequence[dict] = TOOLS) -> int:
    """Prompt tokens the tool declarations add under the synthetic (one id per character) tokenizer."""
    return len(render_tools_prompt([], tools))


def check_calls(tool_calls: Sequence[dict], tools: Sequence[dict] = TOOLS) -> CallCheck:
    schemas = {t["function"]["name"]: t["function"].get("parameters", {}) for t in tools}
    if not tool_calls:
        return CallCheck(0, False, False, "reply has no tool_calls")
    for call in tool_calls:
        fn = call.get("function", {})
        try:
            args = json.loads(fn.get("arguments", ""))
        except json.JSONDecodeError as exc:
            return CallCheck(
                len(tool_calls), False, False, f"{fn.get('name')}: arguments are not JSON ({exc})"
            )
        if fn.get("name") not in schemas:
            return CallCheck(len(tool_calls), True, False, f"unknown function {fn.get('name')!r}")
        try:
            jsonschema.validate(args, schemas[fn["name"]])
        except jsonschema.ValidationError as exc:
            return CallCheck(len(tool_calls), True, False, f"{fn['name']}: {exc.message}")
    return CallCheck(len(tool_calls), True, True)


@dataclass
class ToolCallStats:
    """Per-reply counts -> the rates a report prints (a reply counts once, however many calls)."""

    replies: int = 0
    with_calls: int = 0
    parsed: int = 0
    valid: int = 0
    errors: list[str] = field(default_factory=list)

    def add(self, check: CallCheck) -> None:
        self.replies += 1
        self.with_calls += check.calls > 0
        self.parsed += check.parsed
        self.valid += check.valid
        if check.error is not None:
            self.errors.append(check.error)

    def summary(self) -> dict:
        n = max(self.replies, 1)
        return {"replies": self.replies, "call_rate": self.with_calls / n, "parse_rate": self.parsed / n,
                "valid_rate": self.valid / n, "first_errors": self.errors[:5]}  # fmt: skip


def fold_tool_call_deltas(deltas: Iterable[dict]) -> list[dict]:
    """Streaming ``delta.tool_calls`` entries -> whole calls, ordered by index."""
    calls: dict[int, dict] = {}
    for d in deltas:
        call = calls.setdefault(
            d["index"], {"id": None, "type": "function", "function": {"name": "", "arguments": ""}}
        )
        call["id"] = d.get("id") or call["id"]
        fn = d.get("function") or {}
        call["function"]["name"] += fn.get("name") or ""
        call["function"]["arguments"] += fn.get("arguments") or ""
    return [calls[i] for i in sorted(calls)]


def synthetic_result(rng: random.Random, call: dict, n: int) -> str:
    """A JSON object of exactly `n` ASCII bytes (at least the fixed part) answering `call`."""
    head = json.dumps({"tool": call["function"]["name"], "data": ""})
    filler = "".join(rng.choice("abcdefghijklmnopqrstuvwxyz ") for _ in range(max(0, n - len(head))))
    return json.dumps({"tool": call["function"]["name"], "data": filler})


class ToolTask:
    """One agent conversation of `cfg.turns` forced tool calls (`next_spec` / `observe`, like `Task`)."""

    def __init__(self, cfg: ToolWorkloadConfig, task_id: int, stats: ToolCallStats) -> None:
        self.cfg, self.task_id, self.agent_id, self.stats = cfg, task_id, task_id, stats
        self.rng = random.Random(cfg.seed * 1_000_003 + task_id)
        self.turn = 0
        words = "".join(self.rng.choice("abcdefghijklmnopqrstuvwxyz ") for _ in range(cfg.input_len))
        self.messages: list[dict] = [{"role": "user", "content": words}]

    def tool_choice(self) -> str | dict:
        if not self.cfg.named:
            return "required"
        name = TOOLS[(self.task_id + self.turn) % len(TOOLS)]["function"]["name"]
        return {"type": "function", "function": {"name": name}}

    def next_spec(self) -> RequestSpec | None:
        cfg = self.cfg
        if self.turn >= cfg.turns:
            return None
        body = {"model": cfg.model, "messages": json.loads(json.dumps(self.messages)), "tools": TOOLS,
                "tool_choice": self.tool_choice(), "parallel_tool_calls": False, "max_tokens": cfg.max_tokens, "temperature": cfg.temperature,
                "return_token_ids": True,
                "seed": cfg.seed * 7919 + self.task_id * 131 + self.turn}  # fmt: skip
        return RequestSpec("/v1/chat/completions", body, request_id=f"tool{self.task_id}-{self.turn}",
                           agent_id=self.agent_id, task_id=self.task_id, turn=self.turn)  # fmt: skip

    def observe(self, rec: RequestRecord) -> str | None:
        """Check the reply's calls (folded from its streamed deltas), "execute" them and append the
        results; advance the turn."""
        tool_calls = fold_tool_call_deltas(rec.tool_call_deltas)
        self.stats.add(check_calls(tool_calls))
        self.turn += 1
        calls = [c for c in tool_calls if c.get("id")]
        if not calls:  # nothing to answer: continue as a user nudge so the next turn is still a call
            self.messages.append({"role": "assistant", "content": rec.text})
            self.messages.append({"role": "user", "content": "Use a tool."})
            return None
        self.messages.append({"role": "assistant", "content": rec.text or None, "tool_calls": list(calls)})
        for call in calls:
            result = synthetic_result(self.rng, call, self.cfg.tool_result_tokens)
            self.messages.append({"role": "tool", "tool_call_id": call["id"], "content": result})
        return None


def make_tool_tasks(
    cfg: ToolWorkloadConfig, n_tasks: int, first_id: int = 0
) -> tuple[list[ToolTask], ToolCallStats]:
    """`n_tasks` tasks sharing one `ToolCallStats`; deterministic in cfg.seed."""
    stats = ToolCallStats()
    return [ToolTask(cfg, first_id + i, stats) for i in range(n_tasks)], stats
