"""Prefill of a 200-token suffix after 2,000 cached tokens vs the same 200 tokens cold, with one-pass
prefill attention (block None) and key-blocked attention (the CPU default) — two engines on the same
params, timed interleaved.

Usage: python blockprobe.py MODEL [REPS]
"""

import statistics
import sys
import time

import jax

from g4bench.engine.engine import Engine, EngineConfig
from g4bench.engine.loading import load_engine

model = sys.argv[1]
reps = int(sys.argv[2]) if len(sys.argv) > 2 else 5
engine_config = EngineConfig(max_slots=8, max_len=4096)
blocked, _ = load_engine(model, engine_config)
onepass = Engine(blocked.cfg, blocked.params, engine_config, prefill_attention_block=None)
engines = {"blocked": blocked, "one-pass": onepass}
prefix, suffix = list(range(10, 2010)), list(range(3000, 3200))


def timed(engine, slot, tokens, start):
    t0 = time.perf_counter()
    engine.prefill(slot, tokens, start)
    jax.block_until_ready(engine.cache)
    return time.perf_counter() - t0


for engine in engines.values():  # slot 1 holds the cached prefix; warm both shapes
    for offset in range(0, 2000, 256):
        engine.prefill(1, prefix[offset : offset + 256], offset)
    timed(engine, 0, suffix, 0)
    timed(engine, 1, suffix, 2000)

times: dict[tuple[str, str], list[float]] = {}
for _ in range(reps):
    for name, engine in engines.items():
        times.setdefault((name, "cold"), []).append(timed(engine, 0, suffix, 0))
        times.setdefault((name, "cached"), []).append(timed(engine, 1, suffix, 2000))
for name in ("one-pass", "blocked"):
    cold = statistics.median(times[(name, "cold")])
    cached = statistics.median(times[(name, "cached")])
    print(
        f"{model} {name}: 200 tokens cold {cold * 1e3:.1f} ms, after 2,000 cached {cached * 1e3:.1f} ms, "
        f"ratio {cached / cold:.2f} (n={reps}; {jax.devices()[0].platform}, "
        f"block {engines[name].prefill_attention_block})"
    )
