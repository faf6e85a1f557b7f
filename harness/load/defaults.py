"""Defaults sized for the machine, chosen once and printed with their reason (never silently applied).

The agent workload is serve-load's default: the loop this project exists for (2–8 agents, growing
context, prefix reuse), and the one no other tool measures per task (serving-bench-anchors §4).

- Full size (an accelerator here, or any --url server whose hardware we cannot see): 20 turns,
  500-token first prompt, 64-token replies, 320-token tool results → context 500 → 7,796 tokens;
  one task per agent per level. Fixed: 1,024 in / 128 out, 100 requests per level (the vLLM v6e
  baseline's shape, so the overlay compares like with like).
- CPU (self-started server, no accelerator): 4 turns, 128-token first prompt, 16-token replies,
  48-token tool results (context 128 → 320) on the small synthetic model, so `--conc 2,4,8` ends in a
  few minutes on 2 cores. Fixed: 128 in / 32 out, 4 requests per concurrent stream.
- Tools (forced tool calls): as agent, but replies get up to 512 tokens (full size) / 320 (CPU):
  a call's arguments must fit, and the grammar ends the reply at the call's end, so the bound is
  rarely reached.
Anything given on the command line wins over these.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Sizing:
    turns: int
    input_len: int
    output_len: int
    tool_result_tokens: int
    prefix_len: int
    num_tasks: int | None  # per level; None → tasks_per_conc × concurrency
    tasks_per_conc: int
    reason: str


def choose(kind: str, full_size: bool) -> Sizing:
    """Workload sizes for `kind` at full size (accelerator or remote URL) or for a CPU host."""
    if full_size:
        reason = "full-size defaults (accelerator or --url server)"
        if kind == "fixed":
            return Sizing(
                1, 1024, 128, 0, 0, 100, 1, reason + ": 1,024 in / 128 out × 100, as the vLLM v6e baseline"
            )
        if kind == "tools":
            return Sizing(20, 500, 512, 320, 0, None, 1, reason + ": 20 forced tool calls, one task per agent")
        return Sizing(20, 500, 64, 320, 2048 if kind == "shared-prefix" else 0, None, 1,
                      reason + ": 20 turns, context 500 → 7,796 tokens, one task per agent")  # fmt: skip
    reason = "CPU defaults (no accelerator; small synthetic model)"
    if kind == "fixed":
        return Sizing(1, 128, 32, 0, 0, None, 4, reason + ": 128 in / 32 out, 4 requests per stream")
    if kind == "tools":
        return Sizing(4, 128, 320, 48, 0, None, 1, reason + ": 4 forced tool calls, one task per agent")
    return Sizing(4, 128, 16, 48, 128 if kind == "shared-prefix" else 0, None, 1,
                  reason + ": 4 turns, context 128 → 320 tokens, one task per agent, so --conc 2,4,8 takes minutes")  # fmt: skip


def server_max_len(max_context: int) -> int:
    """Server positions per slot: the workload's largest context plus slack, rounded up to 256."""
    return -(-(max_context + 16) // 256) * 256
