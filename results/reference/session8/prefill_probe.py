"""Issue 14's TTFT floor, in process: a 200-token suffix prefilled after a cached 2,000-token prefix
vs the same 200 tokens cold (start 0), for one model; interleaved repeats, medians and their ratio.

    python results/reference/session8/prefill_probe.py small|e2b [repeats]

The suffix must attend over 2,200 keys (kv bucket 3,072) where the cold prompt attends over 200
(bucket 512); how much that costs relative to the MLP decides whether a cached agent's first turn
can be ≤ 1.5× a cold 200-token prompt's at all.
"""

from __future__ import annotations

import statistics
import sys
import time

import jax

from g4bench.engine.engine import EngineConfig
from g4bench.engine.loading import load_engine

model = sys.argv[1]
repeats = int(sys.argv[2]) if len(sys.argv) > 2 else 5
engine, _ = load_engine(model, EngineConfig(max_slots=8, max_len=4096))
prefix, suffix = list(range(10, 2010)), list(range(3000, 3200))


def timed(slot: int, tokens: list[int], start: int) -> float:
    t0 = time.perf_counter()
    engine.prefill(slot, tokens, start)
    jax.block_until_ready(engine.cache)
    return time.perf_counter() - t0


for off in range(0, 2000, 256):  # the prefix, in the engine's chunks (slot 1 keeps it)
    engine.prefill(1, prefix[off : off + 256], off)
timed(0, suffix, 0), timed(1, suffix, 2000)  # compile both shapes
cold, warm = [], []
for _ in range(repeats):
    cold.append(timed(0, suffix, 0))
    warm.append(timed(1, suffix, 2000))
c, w = statistics.median(cold), statistics.median(warm)
print(f"{model}: 200 tokens cold {c * 1e3:.1f} ms, after 2,000 cached {w * 1e3:.1f} ms, ratio {w / c:.2f} "
      f"(n={repeats}; {jax.devices()[0].platform})")
