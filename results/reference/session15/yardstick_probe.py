"""Does an in-process yardstick explain the visit-to-visit spread of a decode step on this VM?

One fresh process per call: E2B (f32 layers, batch 4, ctx 8192, bf16 KV, donated), then 6 rounds of
[one decode step, one jitted read of every transformer-layer weight, one jitted f32 matmul chain,
the 256 MiB numpy read probe of harness/hostload.py]. Prints one JSON line: per round
[step ms, weight-read ms, matmul ms, probe GB/s]. With PIN=<cpu> the process is pinned to one core
(one XLA thread).

Run 8 (or 6) times in a row and read the lines with `yardstick_summary.py`. Session 15's runs:
yardstick_runs_2threads.jsonl and yardstick_runs_1thread.jsonl (PIN=1), taken with a first draft of
this script (the same steps in the same order); summary in yardstick.txt.

Usage: JAX_PLATFORMS=cpu python results/reference/session15/yardstick_probe.py
"""

import json
import os
import time

if "PIN" in os.environ:
    os.sched_setaffinity(0, {int(os.environ["PIN"])})

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from g4bench.engine.bench import DecodeCase, make_decode_bench  # noqa: E402
from harness.hostload import MemoryProbe  # noqa: E402
from harness.isolate import configure_jax_cache  # noqa: E402

configure_jax_cache()
bench = make_decode_bench(DecodeCase(model="e2b", layers="f32", batch=4, ctx=8192, kv_dtype="bf16", donate=True))
bench.compile()
layers = bench.params["layers"]
read_weights = jax.jit(lambda tree: sum(jnp.sum(x.astype(jnp.float32)) for x in jax.tree_util.tree_leaves(tree)))
a = jnp.ones((1024, 1024), jnp.float32)


@jax.jit
def matmuls(x: jax.Array) -> jax.Array:
    y = x
    for _ in range(6):
        y = jnp.tanh(y @ x * 1e-3)
    return y.sum()


def timed_ms(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return (time.perf_counter() - t0) * 1e3


probe = MemoryProbe()
read_weights(layers).block_until_ready()
matmuls(a).block_until_ready()
state = bench.fresh_inputs()
for _ in range(2):
    state = bench.advance(state)
rows = []
for _ in range(6):
    t0 = time.perf_counter()
    state = bench.advance(state)
    step_ms = (time.perf_counter() - t0) * 1e3
    rows.append([
        step_ms,
        timed_ms(lambda: read_weights(layers).block_until_ready()),
        timed_ms(lambda: matmuls(a).block_until_ready()),
        probe.read_gbs(),
    ])  # fmt: skip
print(json.dumps(rows))
