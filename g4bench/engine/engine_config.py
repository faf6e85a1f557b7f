"""The engine's static configuration, and the call shapes it implies.

    ecfg = EngineConfig(max_slots=8, max_len=8192)          # the served defaults: paged, ring, mixed
    layout = ecfg.layout_for(cfg)                            # the KV cache's layout (kv_cache.py)
    kv_len = bucket_for(n, ecfg.kv_buckets)                  # the compiled KV length a call reads

What the engine (engine.py), the scheduler and the simulator's stand-in (virtual_engine.py) agree
on: slots, lengths, KV layout and dtype, donation, chunk / KV / row buckets, the token budget and
prefill policy, the static block tables a paged engine starts with, and the checks that refuse a
call before it is compiled. `ServedStep` (served_step.py) names the subset that defines the step
`serve` runs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from g4bench.engine.mixed import row_buckets
from g4bench.model.config import SLIDING, ModelConfig
from g4bench.model.kv_cache import CacheLayout
from g4bench.model.paged_kv import window_read_blocks


@dataclass(frozen=True)
class EngineConfig:
    max_slots: int = 8
    max_len: int = 8192
    kv_dtype: str = "bf16"
    sliding_kv: str = "ring"  # "ring": window-sized ring for sliding layers; "full": max_len for every layer
    chunk_size: int = 256
    donate: bool = True
    min_kv_bucket: int = 512
    kv_layout: str = "paged"  # "paged": block pools + block tables; "contiguous": slots × max_len rows
    block_size: int = 16
    kv_blocks: int | None = None  # paged "full"-group blocks; None: max_slots × max_len / block_size
    cached_windows: int = 4  # paged: cached sliding windows per slot, beyond the running sequences'
    # One call's token budget (decode rows + prefill tokens) and how the scheduler fills it:
    # "mixed" (decode + budgeted chunks of several prompts in one call; paged only) or "chunk" (one
    # prefill chunk per loop turn beside a separate decode call); None: mixed when paged.
    # See g4bench/engine/mixed.py and served_step.py.
    max_batched_tokens: int = 512
    prefill_policy: str | None = None
    # Decode also returns its f32 [slots, V] logits (Engine.last_logits: tests, verify). Off when
    # serving: at 170 slots × 262,144 that output alone is 0.18 GB of HBM that could hold KV.
    keep_logits: bool = False

    def __post_init__(self) -> None:
        if self.sliding_kv not in ("ring", "full"):
            raise ValueError(f"sliding_kv must be 'ring' or 'full', got {self.sliding_kv!r}")
        if self.kv_layout not in ("paged", "contiguous"):
            raise ValueError(f"kv_layout must be 'paged' or 'contiguous', got {self.kv_layout!r}")
        if self.prefill_policy not in (None, "mixed", "chunk"):
            raise ValueError(f"prefill_policy must be 'mixed' or 'chunk', got {self.prefill_policy!r}")
        if self.prefill_policy == "mixed" and not self.paged:
            raise ValueError("prefill_policy 'mixed' needs the paged KV layout (kv_layout='paged')")
        if self.max_batched_tokens < 1:
            raise ValueError(f"max_batched_tokens must be positive, got {self.max_batched_tokens}")
        if self.max_slots < 1 or self.max_len < 1 or self.chunk_size < 1:
            raise ValueError("max_slots, max_len and chunk_size must be positive")
        if self.paged and self.block_size < 1:
            raise ValueError(f"block_size must be positive, got {self.block_size}")
        if self.paged and self.kv_blocks is not None and self.kv_blocks < -(-self.max_len // self.block_size):
            raise ValueError(f"kv_blocks {self.kv_blocks} cannot hold one max_len sequence")

    @property
    def paged(self) -> bool:
        return self.kv_layout == "paged"

    @property
    def policy(self) -> str:
        """The prefill policy the scheduler runs: the one set, else mixed when paged."""
        return self.prefill_policy or ("mixed" if self.paged else "chunk")

    @property
    def row_buckets(self) -> tuple[int, ...]:
        """Mixed step: the piece-row counts a call may carry (g4bench/engine/mixed.py)."""
        return row_buckets(self.max_batched_tokens, self.chunk_size)

    def window_blocks_per_seq(self, cfg: ModelConfig) -> int:
        """Paged: the most window blocks one sequence holds at once (keys within W of a chunk)."""
        return min(
            -(-self.max_len // self.block_size),
            window_read_blocks(cfg.sliding_window, self.chunk_size, self.block_size),
        )

    def layout_for(self, cfg: ModelConfig) -> CacheLayout:
        ring = self.sliding_kv == "ring"
        if not self.paged:
            return CacheLayout(max_len=self.max_len, kv_dtype=self.kv_dtype, ring=ring)
        full = self.kv_blocks or self.max_slots * -(-self.max_len // self.block_size)
        windowed = (
            ring
            and cfg.sliding_window < self.max_len
            and SLIDING in cfg.layer_types[: cfg.first_kv_shared_layer]
        )
        per_seq = self.window_blocks_per_seq(cfg)
        window = self.max_slots * (per_seq + self.cached_windows * -(-cfg.sliding_window // self.block_size))
        return CacheLayout(
            max_len=self.max_len,
            kv_dtype=self.kv_dtype,
            ring=ring,
            paged=True,
            block_size=self.block_size,
            blocks=full + 1,
            window_blocks=window + 1 if windowed else 0,
        )

    @property
    def kv_buckets(self) -> tuple[int, ...]:
        """KV lengths a step may read: powers of two from `min_kv_bucket` up to 2048, then alternating
        ×1.5 / ×4/3 steps (2048, 3072, 4096, 6144, 8192, …), capped by max_len: a long context is
        read at most 1.5× over, with a bounded number of compiled programs."""
        sizes, n = [], min(self.min_kv_bucket, self.max_len)
        while n < self.max_len:
            sizes.append(n)
            n = n * 2 if n < 2048 else (n * 3 // 2 if n & (n - 1) == 0 else n * 4 // 3)
        return (*sizes, self.max_len)

    @property
    def chunk_buckets(self) -> tuple[int, ...]:
        """Prefill chunk shapes: chunk/8 (short agent-turn suffixes), chunk/2 and the full chunk."""
        return tuple(sorted({max(1, self.chunk_size // 8), max(1, self.chunk_size // 2), self.chunk_size}))


def default_tables(cfg: ModelConfig, ecfg: EngineConfig, layout: CacheLayout) -> dict[str, np.ndarray]:
    """Paged block tables i32[max_slots, max_len / block_size] per group, before any block manager
    sets them: slot s owns full blocks 1 + s·MB + j (a static partition), and window blocks
    1 + s·R + (j mod R), a ring of R blocks that covers every window read. With these tables the
    paged engine behaves exactly like the contiguous one (Engine.generate, benchmarks)."""
    if not layout.paged:
        return {}
    S, MB = ecfg.max_slots, layout.table_len
    j = np.arange(MB, dtype=np.int32)[None, :]
    s = np.arange(S, dtype=np.int32)[:, None]
    tables = {"full": np.where(1 + s * MB + j < layout.blocks, 1 + s * MB + j, 0).astype(np.int32)}
    if layout.window_blocks:
        R = ecfg.window_blocks_per_seq(cfg)
        tables["window"] = (1 + s * R + j % R).astype(np.int32)
    return tables


def check_prefill(ecfg: EngineConfig, slot: int, tokens: Sequence[int], start: int) -> int:
    """The number of tokens of a valid `prefill` call; ValueError naming what is out of range.
    Shared with the simulator's stand-in (virtual_engine.py) so both refuse the same calls."""
    n = len(tokens)
    if not 0 < n <= ecfg.chunk_size:
        raise ValueError(f"prefill chunk of {n} tokens; must be 1..{ecfg.chunk_size}")
    if not 0 <= slot < ecfg.max_slots:
        raise ValueError(f"slot {slot} out of range 0..{ecfg.max_slots - 1}")
    if start < 0 or start + n > ecfg.max_len:
        raise ValueError(f"positions {start}..{start + n - 1} exceed max_len {ecfg.max_len}")
    return n


def decode_kv_len(ecfg: EngineConfig, positions: np.ndarray, active: np.ndarray) -> int:
    """The KV bucket a decode step over `active` slots at `positions` reads; ValueError past max_len.
    Shared with the simulator's stand-in (virtual_engine.py) so both price the same shape."""
    top = int(positions[active].max()) + 1 if active.any() else 1
    if top > ecfg.max_len:
        raise ValueError(f"decode position {top - 1} exceeds max_len {ecfg.max_len}")
    return bucket_for(top, ecfg.kv_buckets)


def bucket_for(n: int, buckets: Sequence[int]) -> int:
    for b in buckets:
        if n <= b:
            return b
    raise ValueError(f"{n} exceeds the largest bucket {buckets[-1]}")
