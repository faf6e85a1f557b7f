"""Decode step at batch 8 (small model by default) with blocked attention (the CPU default) vs one
pass, two engines on the same params, timed interleaved, at KV buckets 512, 2048 and 3072.

Usage: python decode_probe.py [MODEL] [REPS]
"""

import statistics
import sys
import time

import jax
import numpy as np

from g4bench.engine.engine import Engine, EngineConfig, decode_kv_len
from g4bench.engine.loading import load_engine

model = sys.argv[1] if len(sys.argv) > 1 else "small"
reps = int(sys.argv[2]) if len(sys.argv) > 2 else 7
engine_config = EngineConfig(max_slots=8, max_len=4096)
blocked, _ = load_engine(model, engine_config)
onepass = Engine(blocked.cfg, blocked.params, engine_config, attention_block=None)
engines = {"blocked": blocked, "one-pass": onepass}
tokens = np.full(8, 5, np.int32)
cases = {
    "8 active at 300": (np.full(8, 300), np.ones(8, bool)),
    "8 active at 1900": (np.full(8, 1900), np.ones(8, bool)),
    "8 active at 2200": (np.full(8, 2200), np.ones(8, bool)),
    "4 active at 2200": (np.full(8, 2200), np.arange(8) < 4),
}


def timed(engine, positions, active):
    t0 = time.perf_counter()
    engine.decode(tokens, positions, active)
    return time.perf_counter() - t0


for engine in engines.values():  # compile and warm every shape
    for positions, active in cases.values():
        timed(engine, positions, active)
        timed(engine, positions, active)
times: dict[tuple[str, str], list[float]] = {}
for _ in range(reps):
    for name, engine in engines.items():
        for case, (positions, active) in cases.items():
            times.setdefault((name, case), []).append(timed(engine, positions, active))
platform = jax.devices()[0].platform
for case, (positions, active) in cases.items():
    kv = decode_kv_len(engine_config, positions, active)
    b, o = (statistics.median(times[(name, case)]) * 1e3 for name in ("blocked", "one-pass"))
    print(f"{model} decode, {case} (KV bucket {kv}): blocked {b:.1f} ms, one pass {o:.1f} ms, "
          f"one pass ÷ blocked {o / b:.2f} (n={reps}, median; {platform})")  # fmt: skip
