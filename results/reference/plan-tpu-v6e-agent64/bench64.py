"""One 64-agent × 20-turn agent simulation on the v6e profile, timed (issue 11: under 30 s on the 2-core CPU).

Run from the repository root: python results/reference/plan-tpu-v6e-agent64/bench64.py"""

import time

from harness.load.defaults import server_max_len
from harness.load.runner import LoadConfig
from harness.load.workloads import WorkloadConfig
from harness.sim.planner import resolve_target
from harness.sim.simulate import ServerShape, simulate

t = resolve_target("tpu-v6e")
wl = WorkloadConfig(kind="agent", input_len=500, output_len=64, turns=20, tool_result_tokens=320)
shape = ServerShape(
    model=t.model, max_slots=64, max_len=server_max_len(wl.max_context), kv_dtype="bf16", sliding_kv="ring"
)
cfg = LoadConfig(base_url="simulated", workload=wl, concurrencies=[64], num_tasks=64)
t0 = time.perf_counter()
result, engines = simulate(cfg, shape, t.pricer_for(shape))
dt = time.perf_counter() - t0
lv = result.levels[0]
print(
    f"64 agents x 20 turns: {len(lv.records)} requests, {len(engines[0].calls)} engine calls, simulated {lv.duration_s:.1f} s of serving in {dt:.2f} s wall"
)
