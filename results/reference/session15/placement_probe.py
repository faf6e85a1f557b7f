"""Is the spread a matter of where a process's memory lands? 8 buffers of 512 MiB in one process,
each read 6 times in turn: their bandwidths differ by 1.1% (sd), while the same buffer's readings
over the rounds spread 4.9% (session 15, placement.txt). So no: it is time, not placement.

Usage: python results/reference/session15/placement_probe.py
"""

import time

import numpy as np

buffers = [np.ones(512 * 2**20 // 4, dtype=np.float32) for _ in range(8)]
for b in buffers:
    b.sum()
gbs = np.zeros((6, len(buffers)))
for rep in range(6):
    for i, b in enumerate(buffers):
        t0 = time.perf_counter()
        b.sum()
        gbs[rep, i] = b.nbytes / (time.perf_counter() - t0) / 1e9
logs = np.log(gbs)
print(np.round(gbs, 1))
print(f"between buffers sd {100 * logs.mean(0).std(ddof=1):.1f}%; one buffer over the rounds sd "
      f"{100 * logs.std(0, ddof=1).mean():.1f}%; between rounds sd {100 * logs.mean(1).std(ddof=1):.1f}%")  # fmt: skip
