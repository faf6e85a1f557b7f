"""Why int8 KV's step-time effect shrank: E2B decode benches (revalidate's CPU defaults, batch 4,
ctx 8192, donated) with bf16 and int8 KV, each with the blocked attention the CPU engine now uses
and with one attention pass (what every earlier revalidate run measured), on one copy of the
weights, their samples interleaved in one process (harness/timing.py) so host drift lands on all
four alike.

Usage: python int8_attention_probe.py [SAMPLES]
"""

import statistics
import sys

import numpy as np

from g4bench.engine.bench import DecodeCase, make_decode_bench
from harness.isolate import configure_jax_cache
from harness.timing import measure_benches, pin_threads

samples = int(sys.argv[1]) if len(sys.argv) > 1 else 10
pin_threads(None)
configure_jax_cache()
names, benches = [], []
for kv in ("bf16", "int8"):
    for block, label in (("auto", "blocked"), (None, "one-pass")):
        case = DecodeCase(model="e2b", layers="f32", batch=4, ctx=8192, kv_dtype=kv, donate=True)
        names.append(f"kv-{kv}/{label}")
        benches.append(make_decode_bench(case, seed=0, attention_block=block))
params = benches[0].materialize()
for b in benches:
    b.params = params
results = measure_benches(benches, samples, 2, np.random.default_rng(0))
by_name = {n: r["step_ms_samples"] for n, r in zip(names, results, strict=True)}
med = {n: statistics.median(x) for n, x in by_name.items()}
for n, x in by_name.items():
    print(f"{n:18s} median {med[n]:8.1f} ms  samples {' '.join(f'{t:.0f}' for t in x)}")
for label in ("blocked", "one-pass"):
    print(f"{label}: bf16 ÷ int8 KV step {med[f'kv-bf16/{label}'] / med[f'kv-int8/{label}']:.3f}")
print(f"bf16 KV: one pass ÷ blocked {med['kv-bf16/one-pass'] / med['kv-bf16/blocked']:.3f}; "
      f"int8 KV: {med['kv-int8/one-pass'] / med['kv-int8/blocked']:.3f}")
