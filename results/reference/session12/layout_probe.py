"""Decode step of the small model at batch 8, ctx 8192, full-length sliding KV (revalidate's layout
shape): contiguous vs paged engines on the same params, timed interleaved in one process.

Usage: python layout_probe.py [REPS]
"""

import statistics
import sys
import time

import jax
import numpy as np

from g4bench.engine.engine import Engine, EngineConfig
from g4bench.engine.loading import load_engine

reps = int(sys.argv[1]) if len(sys.argv) > 1 else 9
base = dict(max_slots=8, max_len=8192, sliding_kv="full")
contiguous, _ = load_engine("small", EngineConfig(**base, kv_layout="contiguous"))
paged = Engine(contiguous.cfg, contiguous.params, EngineConfig(**base, kv_layout="paged"))
engines = {"contiguous": contiguous, "paged": paged}
tokens, positions, active = np.full(8, 5, np.int32), np.full(8, 8191, np.int32), np.ones(8, bool)


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
print(f"small decode b8 ctx8192 sliding full: contiguous {c:.1f} ms, paged {p:.1f} ms, "
      f"contiguous ÷ paged {c / p:.3f} (n={reps}, median; {jax.devices()[0].platform})")  # fmt: skip
