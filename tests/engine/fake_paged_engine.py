"""The hand-checkable fake model of tests/server/fake_engine.py over a paged cache whose blocks hold
token ids instead of K/V.

Every write goes through the slot's block tables into the pools, and every next token is computed
from what the tables READ back: the whole sequence through the "full" table, and (with a window)
the last `window` positions through the "window" table, which must agree with it. So a scheduler
or block cache that reuses a wrong or recycled block, forgets a window block, or lets one sequence
overwrite another's shared block produces different tokens than `reference()` (or a violation).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from g4bench.engine.sampling import SamplingParams
from g4bench.model.kv_cache import CacheLayout
from g4bench.model.paged_kv import window_read_blocks
from tests.server.fake_engine import EOS, FakeEngineConfig, next_token


@dataclass(frozen=True)
class FakePagedModelConfig:
    vocab_size: int = 512
    sliding_window: int = 1 << 30


class FakePagedEngine:
    def __init__(
        self,
        max_slots: int = 4,
        max_len: int = 256,
        chunk_size: int = 16,
        block_size: int = 4,
        window: int | None = None,
        blocks: int | None = None,
        cached_windows: int = 2,
        eos_mod: int = 0,
    ) -> None:
        W = window or (1 << 30)
        self.cfg = FakePagedModelConfig(sliding_window=W)
        self.ecfg = FakeEngineConfig(max_slots=max_slots, max_len=max_len, chunk_size=chunk_size)
        MB = max_len // block_size
        per_seq = min(MB, window_read_blocks(W, chunk_size, block_size))
        window_blocks = max_slots * (per_seq + cached_windows * -(-W // block_size)) + 1 if window else 0
        self.layout = CacheLayout(
            max_len=max_len,
            ring=window is not None,
            paged=True,
            block_size=block_size,
            blocks=(blocks or max_slots * MB) + 1,
            window_blocks=window_blocks,
        )
        self.window = window
        self.eos_token_ids = frozenset({EOS})
        self.eos_mod = eos_mod
        self.pools = {"full": {}, "window": {}}  # block → [token id or None] * block_size
        self.tables = {"full": np.zeros((max_slots, MB), np.int32)}
        if window:
            self.tables["window"] = np.zeros((max_slots, MB), np.int32)
        self.sampling: list[SamplingParams | None] = [None] * max_slots
        self.suppress = [False] * max_slots
        self.violations: list[str] = []
        self.calls: list[tuple] = []

    def warmup(self) -> float:
        return 0.0

    def set_block_table(self, slot: int, group: str, ids: Sequence[int]) -> None:
        row = self.tables[group][slot]
        row[:] = 0
        row[: len(ids)] = ids

    def _write(self, slot: int, pos: int, token: int) -> None:
        bs = self.layout.block_size
        for group, table in self.tables.items():
            block = int(table[slot, pos // bs])
            if block == 0:
                self.violations.append(f"slot {slot} writes position {pos} into the null {group} block")
                continue
            self.pools[group].setdefault(block, [None] * bs)[pos % bs] = token

    def _read(self, slot: int, length: int) -> list[int]:
        bs = self.layout.block_size
        ids = []
        for p in range(length):
            block = self.pools["full"].get(int(self.tables["full"][slot, p // bs]))
            ids.append(-1 if block is None or block[p % bs] is None else block[p % bs])
        if -1 in ids:
            self.violations.append(f"slot {slot} reads unwritten positions {ids.index(-1)}..")
        if self.window:
            for p in range(max(0, length - self.window), length):
                block = self.pools["window"].get(int(self.tables["window"][slot, p // bs]))
                if block is None or block[p % bs] != ids[p]:
                    self.violations.append(f"slot {slot}: window block disagrees at position {p}")
                    break
        return ids

    def prefill(self, slot: int, tokens: Sequence[int], start: int, sampling: SamplingParams | None = None):
        self.calls.append(("prefill", slot, start, len(tokens)))
        for i, t in enumerate(tokens):
            self._write(slot, start + i, int(t))
        ids = self._read(slot, start + len(tokens))
        if sampling is None:
            return None
        self.sampling[slot], self.suppress[slot] = sampling, sampling.suppress_eos
        return next_token(ids, sampling, self.eos_mod, self.suppress[slot])

    def decode(self, tokens: np.ndarray, positions: np.ndarray, active: np.ndarray) -> np.ndarray:
        self.calls.append(("decode", int(np.sum(active))))
        out = np.zeros(self.ecfg.max_slots, np.int32)
        for slot in np.flatnonzero(active):
            pos = int(positions[slot])
            self._write(slot, pos, int(tokens[slot]))
            ids = self._read(slot, pos + 1)
            out[slot] = next_token(ids, self.sampling[slot], self.eos_mod, self.suppress[slot])
        return out

    def set_suppress_eos(self, slot: int, on: bool) -> None:
        self.suppress[slot] = on
