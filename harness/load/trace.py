"""Load traces for `serve-load --trace FILE`: parse, build prompts, and say what reuse they imply.

Two JSONL formats, told apart by the first non-blank line (a file holds one of them):

Mooncake / AIPerf request trace, one request per line::

    {"timestamp": 27482, "input_length": 6955, "output_length": 52, "hash_ids": [46, 47, 48]}

`timestamp` is the send time in ms from the trace's start, `input_length` / `output_length` are
prompt and reply tokens, `hash_ids` name the prompt's blocks of `block_size` (512) tokens in order:
the same id means the same block, so requests whose ids agree share a prefix. The last block may be
partial; a prompt longer than its blocks gets request-unique tokens after them. Other keys on a line
are ignored (published traces carry extra fields); lines are replayed in timestamp order.

Agent-session trace (g4bench's own), one session per line::

    {"session_id": "a1", "start_ms": 0, "prefix_hash_ids": [7, 8],
     "turns": [{"input_length": 300, "output_length": 32},
               {"tool_result_length": 200, "output_length": 32, "think_ms": 1500},
               {"input_length": 40, "output_length": 64, "think_ms": 4000}]}

A session is one agent conversation. Turn 0 is sent at `start_ms`; turn k ≥ 1 is sent `think_ms`
after turn k − 1's reply ended (the tool or the user's time). Every turn resends the whole history:
the optional shared system prompt (`prefix_hash_ids`, blocks as above: sessions naming the same ids
share it), turn 0's `input_length` user tokens, and for each later turn the model's real reply, a
tool result of `tool_result_length` tokens and `input_length` new user tokens (either may be 0, not
both). Keys are checked: an unknown key is an error, so a typo cannot change the workload.

Errors name the line and field (`TraceError`: "trace.jsonl:7: output_length: must be an integer ≥
1, got 0"). Tokens are synthetic: block `h` is the same `block_size` ids in every request and run
(seeded by h and the workload seed), in the printable-ASCII id range of workloads.py, so with
`--api chat` a block is the same text (one character per token under our synthetic tokenizer).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np

from harness.load.workloads import TOKEN_HI, TOKEN_LO

BLOCK_SIZE = 512  # Mooncake's block: hash_ids name 512-token blocks
_SESSION_KEYS = {"session_id", "start_ms", "prefix_hash_ids", "turns"}
_TURN_KEYS = {"input_length", "output_length", "tool_result_length", "think_ms"}
# SeedSequence tags: blocks, request-unique tails, session-unique text never draw the same stream
_BLOCK, _TAIL, _SESSION = 0, 1, 2


class TraceError(ValueError):
    """A trace line is malformed; the message names the file, line and field."""


@dataclass(frozen=True)
class TraceRequest:
    """One Mooncake row (`index`: its position in send order)."""

    index: int
    line: int
    timestamp_ms: float
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...] = ()


@dataclass(frozen=True)
class SessionTurn:
    input_length: int
    output_length: int
    tool_result_length: int = 0
    think_ms: float = 0.0


@dataclass(frozen=True)
class Session:
    index: int
    line: int
    session_id: str
    start_ms: float
    turns: tuple[SessionTurn, ...]
    prefix_hash_ids: tuple[int, ...] = ()


@dataclass(frozen=True)
class Trace:
    path: str
    format: Literal["mooncake", "sessions"]
    requests: tuple[TraceRequest, ...] = ()
    sessions: tuple[Session, ...] = ()
    block_size: int = BLOCK_SIZE
    notes: tuple[str, ...] = field(default=())

    @property
    def num_requests(self) -> int:
        return len(self.requests) if self.format == "mooncake" else sum(len(s.turns) for s in self.sessions)

    @property
    def span_s(self) -> float:
        """Last scheduled start (request timestamp or session start), seconds."""
        times = [r.timestamp_ms for r in self.requests] or [s.start_ms for s in self.sessions]
        return max(times, default=0.0) / 1e3

    @property
    def max_messages(self) -> int:
        """Most chat messages one request carries (system, first user, then reply + user per turn)."""
        if self.format == "mooncake":
            return 1
        return max(bool(s.prefix_hash_ids) + 2 * len(s.turns) - 1 for s in self.sessions)

    @property
    def max_context(self) -> int:
        """Largest prompt + reply of any request (sizes the self-started server's max_len)."""
        if self.format == "mooncake":
            return max((r.input_length + r.output_length for r in self.requests), default=0)
        best = 0
        for s in self.sessions:
            ctx = len(s.prefix_hash_ids) * self.block_size
            for t in s.turns:
                ctx += t.tool_result_length + t.input_length + t.output_length
            best = max(best, ctx)
        return best


# ----------------------------------------------------------------------------------------- parsing


def _where(path: str, line: int) -> str:
    return f"{path}:{line}"


def _int(obj: dict[str, Any], key: str, where: str, minimum: int, default: int | None = None) -> int:
    v = obj.get(key, default)
    if v is None:
        raise TraceError(f"{where}: {key}: missing")
    if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
        raise TraceError(f"{where}: {key}: must be an integer ≥ {minimum}, got {v!r}")
    return v


def _ms(obj: dict[str, Any], key: str, where: str, default: float | None = None) -> float:
    v = obj.get(key, default)
    if v is None:
        raise TraceError(f"{where}: {key}: missing")
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or v < 0:
        raise TraceError(f"{where}: {key}: must be a number of ms ≥ 0, got {v!r}")
    return float(v)


def _ids(obj: dict[str, Any], key: str, where: str) -> tuple[int, ...]:
    v = obj.get(key, [])
    if not isinstance(v, list) or any(isinstance(h, bool) or not isinstance(h, int) for h in v):
        raise TraceError(f"{where}: {key}: must be a list of integers, got {json.dumps(v)[:80]}")
    return tuple(v)


def _mooncake(obj: dict[str, Any], index: int, line: int, where: str, block_size: int) -> TraceRequest:
    req = TraceRequest(index, line, _ms(obj, "timestamp", where), _int(obj, "input_length", where, 1),
                       _int(obj, "output_length", where, 1), _ids(obj, "hash_ids", where))  # fmt: skip
    need = -(-req.input_length // block_size)
    if len(req.hash_ids) > need:
        raise TraceError(
            f"{where}: hash_ids: {len(req.hash_ids)} blocks of {block_size} tokens, but input_length "
            f"{req.input_length} fills only {need}"
        )
    return req


def _session(obj: dict[str, Any], index: int, line: int, where: str) -> Session:
    if bad := sorted(set(obj) - _SESSION_KEYS):
        raise TraceError(f"{where}: {bad[0]}: unknown key (a session has {sorted(_SESSION_KEYS)})")
    sid = obj.get("session_id", f"s{index}")
    if not isinstance(sid, str | int) or isinstance(sid, bool):
        raise TraceError(f"{where}: session_id: must be a string, got {sid!r}")
    turns_raw = obj.get("turns")
    if not isinstance(turns_raw, list) or not turns_raw:
        raise TraceError(f"{where}: turns: must be a non-empty list of turns")
    turns = []
    for k, t in enumerate(turns_raw):
        at = f"{where}: turns[{k}]"
        if not isinstance(t, dict):
            raise TraceError(f"{at}: must be an object")
        if bad := sorted(set(t) - _TURN_KEYS):
            raise TraceError(f"{at}.{bad[0]}: unknown key (a turn has {sorted(_TURN_KEYS)})")
        turn = SessionTurn(_int(t, "input_length", at, 0, 0), _int(t, "output_length", at, 1),
                           _int(t, "tool_result_length", at, 0, 0), _ms(t, "think_ms", at, 0.0))  # fmt: skip
        if k == 0 and (turn.tool_result_length or turn.think_ms):
            key = "tool_result_length" if turn.tool_result_length else "think_ms"
            raise TraceError(f"{at}.{key}: the first turn has no tool result and starts at start_ms")
        if k > 0 and turn.input_length + turn.tool_result_length == 0:
            raise TraceError(f"{at}.input_length: a later turn adds input_length or tool_result_length tokens")
        turns.append(turn)
    prefix = _ids(obj, "prefix_hash_ids", where)
    if turns[0].input_length == 0 and not prefix:
        raise TraceError(f"{where}: turns[0].input_length: the first prompt is empty")
    return Session(index, line, str(sid), _ms(obj, "start_ms", where, 0.0), tuple(turns), prefix)


def parse_trace(lines: Iterable[str], path: str = "<trace>", block_size: int = BLOCK_SIZE) -> Trace:
    """Parse JSONL lines (see the module docstring); raises `TraceError` naming line and field."""
    fmt: str | None = None
    reqs: list[TraceRequest] = []
    sessions: list[Session] = []
    for line, text in enumerate(lines, start=1):
        if not text.strip():
            continue
        where = _where(path, line)
        try:
            obj = json.loads(text)
        except json.JSONDecodeError as e:
            raise TraceError(f"{where}: not JSON ({e.msg} at column {e.colno})") from None
        if not isinstance(obj, dict):
            raise TraceError(f"{where}: a line must be a JSON object")
        kind = "sessions" if "turns" in obj else "mooncake"
        if fmt is None:
            fmt = kind
        elif kind != fmt:
            why = ("missing (this is a session trace: every line is a session)" if fmt == "sessions"
                   else "unexpected (this is a Mooncake trace: every line is one request)")  # fmt: skip
            raise TraceError(f"{where}: turns: {why}")
        if kind == "sessions":
            sessions.append(_session(obj, len(sessions), line, where))
        else:
            reqs.append(_mooncake(obj, len(reqs), line, where, block_size))
    if fmt is None:
        raise TraceError(f"{path}: empty trace")
    notes: list[str] = []
    if fmt == "mooncake":
        order = sorted(reqs, key=lambda r: r.timestamp_ms)
        if order != reqs:
            notes.append("rows were not in timestamp order; replayed in timestamp order")
        reqs = [TraceRequest(i, r.line, r.timestamp_ms, r.input_length, r.output_length, r.hash_ids)
                for i, r in enumerate(order)]  # fmt: skip
        return Trace(path, "mooncake", requests=tuple(reqs), block_size=block_size, notes=tuple(notes))
    ids = [s.session_id for s in sessions]
    if len(set(ids)) != len(ids):
        dup = next(s for s in sessions if ids.count(s.session_id) > 1 and ids.index(s.session_id) != s.index)
        raise TraceError(f"{_where(path, dup.line)}: session_id: {dup.session_id!r} repeats an earlier session")
    return Trace(path, "sessions", sessions=tuple(sessions), block_size=block_size)


def load_trace(path: str | Path, block_size: int = BLOCK_SIZE) -> Trace:
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as e:
        raise TraceError(f"{p}: cannot read ({e.strerror})") from None
    return parse_trace(text.splitlines(), str(p), block_size)


# --------------------------------------------------------------------------------------- prompts


def _draw(tag: int, seed: int, a: int, b: int, n: int) -> list[int]:
    rng = np.random.default_rng(np.random.SeedSequence([tag, seed % 2**32, a % 2**64, b % 2**64]))
    return rng.integers(TOKEN_LO, TOKEN_HI, size=n).tolist()


class BlockTokens:
    """hash id → its `block_size` synthetic token ids (memoized; the same ids in every run)."""

    def __init__(self, block_size: int = BLOCK_SIZE, seed: int = 0) -> None:
        self.block_size, self.seed = block_size, seed
        self._cache: dict[int, list[int]] = {}

    def __call__(self, hash_id: int) -> list[int]:
        if hash_id not in self._cache:
            self._cache[hash_id] = _draw(_BLOCK, self.seed, hash_id, 0, self.block_size)
        return self._cache[hash_id]

    def prompt(self, hash_ids: Sequence[int], length: int, unique_key: tuple[int, int]) -> list[int]:
        """`length` ids: the named blocks in order (the last cut short if need be), then tokens unique
        to `unique_key` for what the blocks do not cover."""
        ids = [t for h in hash_ids for t in self(h)][:length]
        if len(ids) < length:
            ids += _draw(_TAIL, self.seed, unique_key[0], unique_key[1], length - len(ids))
        return ids

    def request_prompt(self, req: TraceRequest) -> list[int]:
        return self.prompt(req.hash_ids, req.input_length, (req.index, 0))

    def session_tokens(self, session: int, turn: int, part: int, n: int) -> list[int]:
        """Unique ids of one session's turn (`part` 0: user input, 1: tool result)."""
        return _draw(_SESSION, self.seed, session, turn * 2 + part, n)


def as_text(ids: Sequence[int]) -> str:
    """Synthetic ids as text, one printable character each (the synthetic tokenizer's inverse)."""
    return "".join(chr(i - 3) for i in ids)


# ------------------------------------------------------------------------------- implied reuse


def implied_block_reuse(
    blocks: Sequence[tuple[Sequence[int], int]], block_size: int = BLOCK_SIZE
) -> list[dict[str, int]]:
    """Per prompt, in send order (each `(hash_ids, prompt_length)`): the prompt tokens in blocks an
    earlier prompt already had (`repeated`), and in the longest run of leading blocks an earlier
    prompt began with too (`prefix`: what a prefix cache can reuse at best; never more than
    `repeated`). A partial block counts only as many tokens as an earlier prompt had of it."""
    seen: dict[int, int] = {}  # hash id → most tokens of it any earlier prompt held
    seen_prefix: dict[int, int] = {}  # chained hash of a block prefix → tokens of its last block
    out = []
    for hash_ids, length in blocks:
        repeated = prefix = 0
        chain, open_prefix = 0, True
        used_here: list[tuple[int, int, int]] = []
        for i, h in enumerate(hash_ids):
            used = max(0, min(block_size, length - i * block_size))
            chain = hash((chain, h))
            repeated += min(used, seen.get(h, 0))
            if open_prefix and chain in seen_prefix:
                prefix += min(used, seen_prefix[chain])
                open_prefix = used <= seen_prefix[chain]
            else:
                open_prefix = False
            used_here.append((h, chain, used))
        for h, c, used in used_here:
            seen[h] = max(seen.get(h, 0), used)
            seen_prefix[c] = max(seen_prefix.get(c, 0), used)
        out.append({"prompt": length, "repeated": repeated, "prefix": prefix})
    return out
