"""Workloads: what each simulated client sends, turn by turn.

Every workload is a stream of *tasks*; a task is a short conversation of one or more requests
(`RequestSpec`s) sent one after another, each built after the previous reply arrived. The runner only
sees tasks: closed loop = `c` workers pulling tasks; open loop = tasks arriving by a gamma process.

- fixed: one request per task, a prompt of exactly `input_len` tokens and `output_len` generated
  tokens forced with `ignore_eos` (and `min_tokens`), as `vllm bench serve --dataset-name random`.
- agent: a task runs `turns` turns. Turn 0 sends `input_len` tokens; every later turn resends the
  whole conversation (previous prompt + the model's reply + a synthetic tool result of
  `tool_result_tokens` tokens), so the prompt grows by `output_len + tool_result_tokens` per turn
  (defaults 500 → 7,796 over 20 turns). The tool result is random per task, so one agent's prefix is
  never reused by another.
- shared-prefix: the agent workload where every task starts with the same `prefix_len`-token system
  prompt (a server with prefix sharing computes it once). In a closed loop the first agent's first
  turn goes alone and the other workers start when it has ended (`lead_agent`, default): the fleet's
  steady state, where the system prompt is already cached. Without it every worker starts at once
  and those arriving with the first wait for its prefix prefill (the server never computes it twice).

Two transports (`api`):
- "tokens" (default; exact): POST /v1/completions with `prompt` as a list of token ids and
  `return_token_ids: true`; the client appends the server's returned generated ids to its history, so
  turn n's prompt is by construction a token prefix of turn n+1's, and checks.py can compare the
  server's `cached_tokens` against the exact reusable length. Needs a server that returns
  `choices[0].token_ids` in stream chunks (vLLM does; our server is asked to).
- "chat" (any OpenAI-compatible server): POST /v1/chat/completions with text messages (tool results
  sent as user messages, as SGLang's agentic dataset does); the server tokenizes, so prompt lengths
  come from `usage` and prefix reuse can only be judged from `cached_tokens`. Text of "N tokens" is N
  ASCII characters: exact for the synthetic tokenizer of our synthetic models, about N/4 tokens elsewhere.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from harness.load.client import RequestRecord, RequestSpec

# tools: harness/load/tool_workload.py; trace (Mooncake rows) and sessions (agent sessions): trace.py
Kind = Literal["fixed", "agent", "shared-prefix", "tools", "trace", "sessions"]
Api = Literal["auto", "tokens", "chat"]  # "auto": the runner probes and picks one
# Token ids drawn for synthetic prompts: printable ASCII in the synthetic tokenizer (char c -> ord(c)+3),
# ordinary ids in any real vocabulary too.
TOKEN_LO, TOKEN_HI = 3 + 32, 3 + 127


@dataclass(frozen=True)
class WorkloadConfig:
    kind: Kind = "agent"
    api: Api = "tokens"
    model: str = "default"
    input_len: int = 500
    output_len: int = 64
    turns: int = 20
    tool_result_tokens: int = 320
    prefix_len: int = 0  # shared system prompt tokens (shared-prefix only)
    # shared-prefix, closed loop: the first agent's first turn runs alone, the rest start once it has
    # ended (the system prompt is cached: a running fleet's steady state, not a cold burst)
    lead_agent: bool = True
    seed: int = 0
    ignore_eos: bool = True
    # Fixed workload: every request constrained to this JSON Schema (`response_format` json_schema);
    # the grammar ends the reply, so ignore_eos / min_tokens are left out of those requests.
    json_schema: dict | None = field(default=None, hash=False)

    @property
    def lead_opens(self) -> bool:
        """Whether a closed-loop level opens with one agent's first turn alone (module docstring)."""
        return self.kind == "shared-prefix" and self.lead_agent and self.prefix_len > 0

    @property
    def single_request(self) -> bool:
        """Every task is one request (no per-task or per-turn metrics)."""
        return self.kind in ("fixed", "trace")

    @property
    def turns_per_task(self) -> int:
        return 1 if self.single_request else self.turns

    @property
    def max_context(self) -> int:
        """Largest prompt + output any request of this workload needs (sizes the server's max_len)."""
        t = self.turns_per_task
        if self.kind == "tools":
            from harness.load.tool_workload import tools_prompt_tokens

            return tools_prompt_tokens() + self.input_len + t * (self.output_len + self.tool_result_tokens)
        return (
            self.prefix_len
            + self.input_len
            + (t - 1) * (self.output_len + self.tool_result_tokens)
            + (self.output_len)
        )

    def prompt_len(self, turn: int) -> int:
        """Prompt tokens the workload intends at `turn` (token transport; exact when outputs are full)."""
        return self.prefix_len + self.input_len + turn * (self.output_len + self.tool_result_tokens)


def _ids(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(TOKEN_LO, TOKEN_HI) for _ in range(n)]


def _text(rng: random.Random, n: int) -> str:
    """n ASCII characters of lowercase pseudo-words (n tokens under the synthetic tokenizer)."""
    out: list[str] = []
    letters = "abcdefghijklmnopqrstuvwxyz"
    while len(out) < n:
        out.extend(rng.choice(letters) for _ in range(rng.randint(2, 7)))
        out.append(" ")
    return "".join(out[:n])


class Task:
    """One conversation: `next_spec()` builds the next request, `observe(record)` feeds the reply back.

    `next_spec` returns None once all turns are sent. `observe` returns an error string when the reply
    cannot be continued (e.g. no token ids in token transport); the runner then fails the task.
    """

    def __init__(self, cfg: WorkloadConfig, task_id: int, agent_id: int, shared_prefix: list[int]) -> None:
        self.cfg, self.task_id, self.agent_id = cfg, task_id, agent_id
        self.rng = random.Random(cfg.seed * 1_000_003 + task_id)
        self.turn = 0
        prefix = shared_prefix if cfg.kind == "shared-prefix" else []
        if cfg.api == "tokens":
            self.ids: list[int] = prefix + _ids(self.rng, cfg.input_len)
        else:
            self.messages: list[dict[str, str]] = []
            if prefix:
                self.messages.append({"role": "system", "content": "".join(chr(i - 3) for i in prefix)})
            self.messages.append({"role": "user", "content": _text(self.rng, cfg.input_len)})

    def next_spec(self) -> RequestSpec | None:
        cfg = self.cfg
        if self.turn >= cfg.turns_per_task:
            return None
        body: dict = {"model": cfg.model, "max_tokens": cfg.output_len, "temperature": 0.0}
        if cfg.json_schema is not None:
            body["response_format"] = {"type": "json_schema",
                                       "json_schema": {"name": "fixed", "schema": cfg.json_schema, "strict": True}}  # fmt: skip
        elif cfg.ignore_eos:
            body.update(ignore_eos=True, min_tokens=cfg.output_len)
        rid = f"t{self.task_id}-{self.turn}"
        turn = None if cfg.kind == "fixed" else self.turn
        common: dict[str, Any] = dict(request_id=rid, agent_id=self.agent_id, task_id=self.task_id, turn=turn)
        if cfg.api == "tokens":
            body.update(prompt=list(self.ids), return_token_ids=True)
            return RequestSpec(
                "/v1/completions", body, input_len=len(self.ids), prompt_ids=list(self.ids), **common
            )
        body["messages"] = [dict(m) for m in self.messages]
        return RequestSpec("/v1/chat/completions", body, **common)

    def observe(self, rec: RequestRecord) -> str | None:
        """Append the reply and the next tool result to the history; advance the turn."""
        self.turn += 1
        if self.turn >= self.cfg.turns_per_task:
            return None
        n_tool = self.cfg.tool_result_tokens
        if self.cfg.api == "tokens":
            if rec.output_ids is None:
                return "server returned no token_ids (needs `return_token_ids`); use --api chat"
            self.ids = self.ids + rec.output_ids + _ids(self.rng, n_tool)
        else:
            self.messages.append({"role": "assistant", "content": rec.text})
            self.messages.append({"role": "user", "content": _text(self.rng, n_tool)})
        return None


def make_tasks(cfg: WorkloadConfig, n_tasks: int, first_id: int = 0) -> list[Task]:
    """`n_tasks` tasks with ids first_id.. (each task is its own agent); deterministic in cfg.seed."""
    prefix = _ids(random.Random(cfg.seed - 1), cfg.prefix_len) if cfg.kind == "shared-prefix" else []
    return [Task(cfg, first_id + i, first_id + i, prefix) for i in range(n_tasks)]


def arrival_times(n: int, rate: float, burstiness: float = 1.0, seed: int = 0) -> np.ndarray:
    """Open-loop send times (s from start) of n arrivals at `rate`/s, as vLLM's `--burstiness`.

    Inter-arrival gaps are gamma(shape=B, scale=1/(rate·B)): mean 1/rate always; B = 1 is Poisson,
    B < 1 burstier, B > 1 smoother. rate = inf sends everything at t = 0.
    """
    if n <= 0:
        return np.zeros(0)
    if not np.isfinite(rate):
        return np.zeros(n)
    if rate <= 0 or burstiness <= 0:
        raise ValueError("rate and burstiness must be > 0")
    gaps = np.random.default_rng(seed).gamma(burstiness, 1.0 / (rate * burstiness), size=n)
    gaps[0] = 0.0
    return np.cumsum(gaps)
