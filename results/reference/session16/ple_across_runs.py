"""Is the PLE format's effect on the step real? Its ratio (bf16 ÷ quantized PLE, probe-adjusted where
the run allows, harness/visit_noise.py) averaged over the four KV × donation pairs of each recorded
separate-visit E2B run, then across runs: a real effect would keep one sign from run to run.

Usage: python results/reference/session16/ple_across_runs.py
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
from harness.visit_noise import compare_pooled, pooled_noise

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from probe_covariate import load  # noqa: E402

runs = sorted(p for p in HERE.parent.glob("revalidate-cpu-e2b-s1[3-9]*") if "shared" not in p.name)
by_format: dict[str, list[float]] = {"int8": [], "int4": []}
for run in runs:
    steps, probe = load(run)
    noise = pooled_noise(steps, probe=probe)
    assert noise is not None
    cells = []
    for q, logs in by_format.items():
        pairs = [(a, a.replace("ple-bf16/", f"ple-{q}/")) for a in steps if a.startswith("ple-bf16/")]
        logs.append(float(np.mean([np.log(compare_pooled(a, b, noise, floor=0.02).ratio) for a, b in pairs])))
        cells.append(f"ple-{q} {np.exp(logs[-1]):.3f}")
    print(f"{run.name:34} rounds {noise.rounds:>2}  " + "  ".join(cells))
for q, logs in by_format.items():
    v = np.array(logs)
    t = v.mean() / (v.std(ddof=1) / np.sqrt(v.size))
    print(f"ple-{q}: geometric mean over {v.size} runs {np.exp(v.mean()):.3f}, sd across runs "
          f"{100 * v.std(ddof=1):.1f}%, t {t:+.2f}")  # fmt: skip
