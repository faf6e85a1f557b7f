"""Checks run on every serve-load run; their verdicts go into the summary, never silently dropped.

1. Output tokens: the server's `usage.completion_tokens` against the tokens the stream carried. With
   exact per-chunk counts (token_ids or continuous usage) a difference is a mismatch; with the
   one-token-per-chunk assumption a difference means chunks carry several tokens, so per-chunk ITL
   is not per-token latency (reported as `chunks_per_token`).
2. Prefix stability of agent tasks: with token-id prompts, turn n's prompt + reply must be a token
   prefix of turn n+1's prompt (exact check on ids); with text (chat) prompts only usage is visible,
   so turn n+1 must have at least turn n's prompt + reply tokens. Each later turn is labelled by its
   server-reported `cached_tokens`: warm (≥ the previous turn's prompt), partial (some), cold (none),
   unknown (no `cached_tokens`). A server claiming more cached tokens than the prompts share, or than
   the prompt has, is flagged inconsistent.
3. Failures and timeouts: counted by kind, with examples (the records stay in the JSONL).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import Any

from harness.load.client import RequestRecord

MAX_EXAMPLES = 5


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def check_output_tokens(records: Sequence[RequestRecord]) -> dict[str, Any]:
    """Usage vs streamed token counts over completed requests."""
    out: dict[str, Any] = {
        "checked": 0,
        "no_usage": 0,
        "mismatches": 0,
        "multi_token_streams": 0,
        "examples": [],
    }
    chunks = tokens = 0
    for r in records:
        if not r.ok:
            continue
        out["checked"] += 1
        chunks += len(r.chunk_tokens)
        if r.completion_tokens is None:
            out["no_usage"] += 1
            continue
        tokens += r.completion_tokens
        if r.completion_tokens == r.streamed_tokens:
            continue
        if r.chunk_tokens_source == "assumed":
            out["multi_token_streams"] += 1
        else:
            out["mismatches"] += 1
            if len(out["examples"]) < MAX_EXAMPLES:
                out["examples"].append(
                    f"{r.request_id}: usage {r.completion_tokens} vs streamed {r.streamed_tokens}"
                )
    out["chunks_per_token"] = chunks / tokens if tokens else None
    return out


def cache_state(cached: int | None, prev_prompt: int | None) -> str:
    if cached is None:
        return "unknown"
    if prev_prompt is not None and cached >= prev_prompt:
        return "warm"
    return "partial" if cached > 0 else "cold"


def _turn(r: RequestRecord) -> int:
    """The turn index of an agent-task record (only those are grouped into tasks)."""
    assert r.turn is not None
    return r.turn


def check_prefixes(records: Sequence[RequestRecord]) -> tuple[dict[str, Any], dict[str, str]]:
    """Prefix and cache-consistency verdicts per agent task; returns (summary, request_id -> state)."""
    tasks: dict[int, list[RequestRecord]] = defaultdict(list)
    for r in records:
        if r.turn is not None and r.task_id is not None and r.ok:
            tasks[r.task_id].append(r)
    out: dict[str, Any] = {"pairs": 0, "exact": 0, "not_prefix": 0, "cache_inconsistent": 0, "examples": []}
    counts = {"warm": 0, "partial": 0, "cold": 0, "unknown": 0}
    states: dict[str, str] = {}

    def flag(key: str, msg: str) -> None:
        out[key] += 1
        if len(out["examples"]) < MAX_EXAMPLES:
            out["examples"].append(msg)

    for rs in tasks.values():
        rs.sort(key=_turn)
        for prev, cur in zip(rs, rs[1:], strict=False):
            if _turn(cur) != _turn(prev) + 1:
                continue
            out["pairs"] += 1
            shared: int | None = None
            if prev.prompt_ids is not None and cur.prompt_ids is not None and prev.output_ids is not None:
                out["exact"] += 1
                expected = prev.prompt_ids + prev.output_ids
                shared = _common_prefix(expected, cur.prompt_ids)
                if shared < len(expected):
                    flag("not_prefix", f"{cur.request_id}: diverges from turn {prev.turn} at token {shared}")
            elif (
                prev.prompt_tokens is not None
                and cur.prompt_tokens is not None
                and cur.prompt_tokens < prev.prompt_tokens + prev.output_tokens
            ):
                flag(
                    "not_prefix",
                    f"{cur.request_id}: {cur.prompt_tokens} prompt tokens < previous "
                    f"{prev.prompt_tokens} + reply {prev.output_tokens}",
                )
            state = cache_state(cur.cached_tokens, prev.prompt_tokens)
            counts[state] += 1
            states[cur.request_id] = state
            c = cur.cached_tokens
            if c is not None and cur.prompt_tokens is not None and c > cur.prompt_tokens:
                flag("cache_inconsistent", f"{cur.request_id}: cached {c} > prompt {cur.prompt_tokens}")
    return out | counts, states


def check_failures(records: Sequence[RequestRecord]) -> dict[str, Any]:
    kinds: dict[str, int] = defaultdict(int)
    examples: list[str] = []
    for r in records:
        if not r.ok:
            kinds[r.error_kind or "unknown"] += 1
            if len(examples) < MAX_EXAMPLES:
                examples.append(f"{r.request_id}: {r.error}")
    return {"failed": sum(kinds.values()), "by_kind": dict(kinds), "examples": examples}


def run_checks(records: Sequence[RequestRecord]) -> tuple[dict[str, Any], dict[str, str]]:
    """All checks; returns (summary block, request_id -> cache state for the JSONL rows)."""
    prefix, states = check_prefixes(records)
    block = {
        "output_tokens": check_output_tokens(records),
        "prefix": prefix,
        "failures": check_failures(records),
    }
    return block, states


def check_warnings(block: dict[str, Any]) -> list[str]:
    """Human-readable warnings for the checks that failed."""
    w = []
    ot, px = block["output_tokens"], block["prefix"]
    if ot["mismatches"]:
        w.append(f"{ot['mismatches']} requests: usage.completion_tokens differs from the streamed tokens")
    if ot["multi_token_streams"]:
        w.append(
            f"{ot['multi_token_streams']} streams carried several tokens per chunk "
            f"(chunks/token {ot['chunks_per_token']:.2f}): ITL is per chunk, not per token"
        )
    if ot["no_usage"]:
        w.append(f"{ot['no_usage']} requests had no usage block: output tokens counted from the stream")
    if px["not_prefix"]:
        w.append(f"{px['not_prefix']} agent turns were not a prefix extension of the previous turn")
    if px["cache_inconsistent"]:
        w.append(f"{px['cache_inconsistent']} turns report cached_tokens inconsistent with their prompts")
    if block["failures"]["failed"]:
        w.append(f"{block['failures']['failed']} requests failed: {block['failures']['by_kind']}")
    return w
