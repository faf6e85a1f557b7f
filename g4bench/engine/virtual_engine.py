"""An engine stand-in on a virtual clock: the `Engine` call protocol, no device, no weights.

    clock = VirtualClock()
    engine = VirtualEngine(cfg, EngineConfig(max_slots=8, max_len=512), price, clock)
    scheduler = Scheduler(engine, warmup=False, clock=clock)   # the real scheduler, stepped by hand

The simulator (harness/sim/) drives the real `Scheduler` with this object in place of `Engine`.
Every call does the engine's own argument checks and shape arithmetic — the same `EngineConfig`
(buckets, paged layout, block tables), the same `bucket_for` — and then, instead of running a
program, advances `clock` by `price(call)` seconds, where `call` is the `EngineCall` the real engine
would have run: program, rows, chunk bucket, KV-length bucket. So a schedule costs exactly the
compiled shapes the server would have dispatched; `calls` keeps them in order (tests compare this
sequence with a recording of the real engine on the same requests).

Sampled tokens are a fixed function of (slot, position) that is never an EOS id: the simulated
workloads force their output lengths (`ignore_eos`), so token values never steer the schedule.
`copy_slot` (contiguous prefix sharing) is priced as program "copy" (rows 1, tokens = max_len); the
mixed step (`step`) as program "mixed": its piece-row bucket × PIECE_TOKENS plus max_slots decode rows.

Why it lives beside engine.py: the scheduler may only call what `Engine` offers; keeping the
stand-in's methods next to the real ones (and a test that runs both) keeps them from drifting.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from g4bench.engine.engine import Engine
from g4bench.engine.engine_config import (
    EngineConfig,
    bucket_for,
    check_prefill,
    decode_kv_len,
    default_tables,
)
from g4bench.engine.mixed import PIECE_TOKENS, Piece, check_pieces
from g4bench.engine.sampling import SamplingParams
from g4bench.model.config import ModelConfig


@dataclass(frozen=True)
class EngineCall:
    """One dispatched program: `rows` sequences × `tokens` positions attending over `kv_len`."""

    program: str  # "decode" | "prefill" | "mixed" | "copy"
    rows: int  # mixed: piece rows (the row bucket)
    tokens: int  # mixed: tokens per piece row
    kv_len: int
    active: int = 0  # decode / mixed: decode rows that carry a live stream (the rest are discarded)
    decode_rows: int = 0  # mixed: the decode rows computed beside the pieces (max_slots)

    @property
    def batched_tokens(self) -> int:
        """Token positions the call computes (padding included)."""
        return self.rows * self.tokens + self.decode_rows


class VirtualClock:
    """Seconds since the simulation started; only the engine stand-in and the simulator move it."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError(f"cannot move the clock back by {seconds} s")
        self.now += seconds

    def advance_to(self, t: float) -> None:
        self.now = max(self.now, t)


class VirtualEngine:
    """`Engine`'s public API (prefill, decode, step, copy_slot, set_block_table, can_resume,
    set_suppress_eos, warmup, and the attributes the scheduler reads); see the module docstring."""

    def __init__(
        self,
        cfg: ModelConfig,
        ecfg: EngineConfig,
        price: Callable[[EngineCall], float],
        clock: VirtualClock,
    ) -> None:
        self.cfg = cfg
        self.ecfg = ecfg
        self.layout = ecfg.layout_for(cfg)
        self.tables = default_tables(cfg, ecfg, self.layout)
        self.eos_token_ids = frozenset(cfg.eos_token_ids)
        self.price, self.clock = price, clock
        self.calls: list[EngineCall] = []
        self.busy_s = 0.0
        self._token = next(t for t in range(3, cfg.vocab_size) if t not in self.eos_token_ids)

    def _run(self, call: EngineCall) -> None:
        seconds = self.price(call)
        self.calls.append(call)
        self.busy_s += seconds
        self.clock.advance(seconds)

    # Pure table bookkeeping: the real engine's own methods, which read only cfg, ecfg, layout, tables.
    set_block_table = Engine.set_block_table
    can_resume = Engine.can_resume

    def prefill(
        self, slot: int, tokens: Sequence[int], start: int, sampling: SamplingParams | None = None
    ) -> int | None:
        n = check_prefill(self.ecfg, slot, tokens, start)
        chunk = bucket_for(n, self.ecfg.chunk_buckets)
        self._run(EngineCall("prefill", 1, chunk, bucket_for(start + n, self.ecfg.kv_buckets)))
        return self._token if sampling is not None else None

    def decode(self, tokens: np.ndarray, positions: np.ndarray, active: np.ndarray) -> np.ndarray:
        active = np.asarray(active, bool)
        positions = np.asarray(positions, np.int32)
        kv_len = decode_kv_len(self.ecfg, positions, active)
        self._run(EngineCall("decode", self.ecfg.max_slots, 1, kv_len, int(active.sum())))
        return np.full(self.ecfg.max_slots, self._token, np.int32)

    def step(
        self,
        tokens: np.ndarray,
        positions: np.ndarray,
        active: np.ndarray,
        pieces: Sequence[Piece],
        *,
        decode_logits: bool = False,
    ) -> tuple[np.ndarray, dict[int, int]]:
        if decode_logits:
            raise ValueError(
                "the virtual engine has no logits (simulated requests use no grammar or logprobs)"
            )
        active = np.asarray(active, bool)
        positions = np.asarray(positions, np.int32)
        e = self.ecfg
        n_rows = check_pieces(pieces, max_slots=e.max_slots, chunk_size=e.chunk_size, max_len=e.max_len,
                              active=active)  # fmt: skip
        if not pieces:
            raise ValueError("a mixed step needs at least one prefill piece (use decode otherwise)")
        top = max(p.start + len(p.tokens) for p in pieces)
        kv_len = bucket_for(max(top, decode_kv_len(e, positions, active)), e.kv_buckets)
        rows = bucket_for(n_rows, e.row_buckets)
        self._run(EngineCall("mixed", rows, PIECE_TOKENS, kv_len, int(active.sum()), e.max_slots))
        first = {p.slot: self._token for p in pieces if p.sampling is not None}
        return np.full(e.max_slots, self._token, np.int32), first

    @property
    def piece_tokens(self) -> int:
        return PIECE_TOKENS

    def set_suppress_eos(self, slot: int, on: bool) -> None:
        """Nothing to ban: the stand-in never samples an EOS id."""

    def copy_slot(self, src: int, dst: int) -> None:
        if self.layout.paged:
            raise ValueError("copy_slot: a paged cache shares blocks through block tables, not copies")
        self._run(EngineCall("copy", 1, self.ecfg.max_len, self.ecfg.max_len))

    def warmup(self) -> float:
        """No programs to compile; the simulated server starts warm."""
        return 0.0
