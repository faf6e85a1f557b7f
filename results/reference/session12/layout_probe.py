"""Decode step of the small model at batch B (default 8), ctx 8192, full-length sliding KV (revalidate's layout
shape): contiguous vs paged engines on the same params, timed interleaved in one process.

Usage: python layout_probe.py [REPS] [BATCH]
"""

import statistics
import sys
import time

import jax
import numpy as np

from g4bench.engine.engine import Engine, EngineConfig
from g4bench.engine.loading import load_engine

reps = int(sys.argv[1]) if len(sys.argv) > 1 else 9
batch = int(sys.argv[2]) if len(sys.argv) > 2 else 8
base = dict(max_slots=batch, max_len=8192, sliding_kv="full")
contiguous, _ = load_engine("small", EngineConfig(**base, kv_layout="contiguous"))
paged = Engine(contiguous.cfg, contiguous.params, EngineConfig(**base, kv_layout="paged"))
engines = {"contiguous": contiguous, "paged": paged}
tokens, positions, active = np.full(batch, 5, np.int32), np.full(batch, 8191, np.int32), np.ones(batch, bool)


def timed(engine):
    t0 = time.perf_counter()
    engine.decode(tokens, positions, active)
    return time.perf_counter() - t0


for engine in engines.values():
    timed(engine)
    timed(engine)
times = {name: [] for name in engines}
for _ in range(reps):
    for name, engine in engines.items():
        times[name].append(timed(engine))
c, p = (statistics.median(times[name]) * 1e3 for name in engines)
print(f"small decode b{batch} ctx8192 sliding full: contiguous {c:.1f} ms, paged {p:.1f} ms, "
      f"contiguous ÷ paged {c / p:.3f} (n={reps}, median; {jax.devices()[0].platform})")  # fmt: skip
