"""int8 vs bf16 KV (and copying vs donated) in one process, samples interleaved, paired step by step.

Four benches on one copy of the weights: bf16-A and bf16-B (identical: an A/A pair), int8 and a
copying bf16 step; each pass steps all four in a fresh random order (harness/timing.py). Prints each
bench's median and the paired log differences. Session 15, `small 32 30`: inproc_small_b32.txt
(samples in inproc_small_b32.json).

Usage: JAX_PLATFORMS=cpu python results/reference/session15/inproc_probe.py MODEL BATCH PASSES
"""

import sys

import numpy as np

from harness.timing import measure_benches, pin_threads

pin_threads(None)
from g4bench.engine.bench import DecodeCase, make_decode_bench  # noqa: E402
from harness.isolate import configure_jax_cache  # noqa: E402

configure_jax_cache()
model, batch, passes = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
cases = [("bf16-A", "bf16", True), ("bf16-B", "bf16", True), ("int8", "int8", True), ("bf16-copy", "bf16", False)]
benches = [
    make_decode_bench(DecodeCase(model=model, layers="f32", batch=batch, ctx=8192, kv_dtype=kv, donate=donate))
    for _, kv, donate in cases
]
params = benches[0].materialize()
for b in benches:
    b.params = params
measured = measure_benches(benches, passes, 2, np.random.default_rng(0))
samples = {name: np.array(r["step_ms_samples"]) for (name, _, _), r in zip(cases, measured, strict=True)}
for name, s in samples.items():
    print(f"{name:10} median {np.median(s):.1f} ms, sd {100 * np.log(s).std():.1f}%")
for a, b in (("bf16-A", "bf16-B"), ("bf16-A", "int8"), ("bf16-copy", "bf16-A")):
    d = np.log(samples[a]) - np.log(samples[b])
    half = 1.96 * d.std(ddof=1) / np.sqrt(len(d))
    print(f"{a} ÷ {b}: ratio of medians {np.median(samples[a]) / np.median(samples[b]):.3f}; paired log "
          f"difference {d.mean():.3f} ± {half:.3f} (95%), sd {d.std(ddof=1):.3f} a pair")  # fmt: skip
