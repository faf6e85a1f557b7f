"""Within-process drift: one process steps E2B (batch 4, ctx 8192, donated, revalidate's CPU
defaults) and after every step times a one-thread sum over 1 GiB (a memory bandwidth probe); prints
one JSON line of (step ms, probe ms) pairs. Session 13 ran it four times back to back
(bf16, int8, bf16, int8 KV; 40 samples each) → drift_probe.jsonl, summarised by `--summary`.

Usage: python drift_probe.py KV_DTYPE SAMPLES  |  python drift_probe.py --summary drift_probe.jsonl
"""

import json
import os
import sys
import time
from pathlib import Path

import numpy as np


def measure(kv: str, n: int) -> None:
    from g4bench.engine.bench import DecodeCase, make_decode_bench
    from harness.isolate import configure_jax_cache

    configure_jax_cache()
    case = DecodeCase(model="e2b", layers="f32", batch=4, ctx=8192, kv_dtype=kv, donate=True)
    bench = make_decode_bench(case, seed=0)
    bench.params = bench.materialize()
    bench.compile()
    state = bench.fresh_inputs()
    for _ in range(2):
        state = bench.advance(state)
    buf = np.ones(256 * 2**20, dtype=np.float32)  # 1 GiB, touched before timing
    buf.sum()
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        state = bench.advance(state)
        t1 = time.perf_counter()
        buf.sum()
        out.append(((t1 - t0) * 1e3, (time.perf_counter() - t1) * 1e3))
    print(json.dumps({"kv": kv, "pid": os.getpid(), "samples": out}))


def summary(path: str) -> None:
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        d = json.loads(line)
        s = np.array(d["samples"])
        step, probe = s[:, 0], s[:, 1]
        lo, hi = np.quantile(step, [0.1, 0.9])
        print(f"kv {d['kv']}: step median {np.median(step):.0f} ms (p10 {lo:.0f}, p90 {hi:.0f}, "
              f"min {step.min():.0f}, max {step.max():.0f}); probe median {np.median(probe):.1f} ms; "
              f"r(step, probe) = {np.corrcoef(step, probe)[0, 1]:.2f}")  # fmt: skip


if __name__ == "__main__":
    if sys.argv[1] == "--summary":
        summary(sys.argv[2])
    else:
        measure(sys.argv[1], int(sys.argv[2]))
