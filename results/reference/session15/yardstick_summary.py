"""Between-process and within-process spread of the step, raw and divided by each yardstick.

Usage: python results/reference/session15/yardstick_summary.py RUNS.jsonl
"""

import json
import sys
from pathlib import Path

import numpy as np

lines = Path(sys.argv[1]).read_text().splitlines()
runs = np.array([json.loads(line) for line in lines if line.startswith("[")])  # [process, round, 4]
step, weights, matmul, gbs = (runs[..., i] for i in range(4))
variants = {"step": step, "step/weight-read": step / weights, "step/matmul": step / matmul, "step*probe": step * gbs}
print(f"{len(runs)} processes × {runs.shape[1]} rounds; step medians per process: {np.round(np.median(step, 1)).tolist()}")
for name, x in variants.items():
    logs = np.log(x)
    between = 100 * np.log(np.median(x, 1)).std(ddof=1)
    within = 100 * logs.std(1, ddof=1).mean()
    print(f"{name:17} between processes sd {between:5.1f}%   within a process sd {within:5.1f}%")
