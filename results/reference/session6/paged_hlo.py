"""What the paged KV read compiles to, beside the contiguous one: `small`, bf16 KV, donated decode
step at batch 8 and 32, ctx 8192, for this CPU (`local`) or a TPU compiled without one (`tpu-v6e`).

    python results/reference/session6/paged_hlo.py local
    TPU_SKIP_MDS_QUERY=1 JAX_PLATFORMS=cpu ALLOW_MULTIPLE_LIBTPU_LOAD=1 \
        python results/reference/session6/paged_hlo.py tpu-v6e

Prints, per layout and batch: the compiled temporaries and arguments (memory_analysis), XLA's bytes
accessed (cost_analysis), the number of gather ops and the largest 4-d shapes in the optimized HLO
(the TPU executable's HLO text cannot be read back with jax 0.10.2 / libtpu 0.0.52, so those two
columns stay empty there), and the bytes-moved model (g4bench/model/costs.py), which is the same
for both layouts. Output of session 6: paged_hlo.txt beside this file.
"""

import re
import sys

import jax.numpy as jnp
from harness.aot import cost_fields, memory_fields, program_for, target_device

target = sys.argv[1] if len(sys.argv) > 1 else "local"
for layout in ("contiguous", "paged"):
    for B in (8, 32):
        sharding, _ = target_device(target)
        case = {"model": "small", "layers": "f32" if target == "local" else "w4a16", "kv_dtype": "bf16",
                "batch": B, "ctx": 8192}  # fmt: skip
        if layout == "paged":
            case["kv_layout"] = "paged"
        fn, args, facts = program_for({"case": case}, sharding, jnp.float32 if target == "local" else jnp.bfloat16)
        compiled = fn.lower(*args).compile()
        mem, cost = memory_fields(compiled.memory_analysis()), cost_fields(compiled.cost_analysis())
        try:
            hlo = compiled.as_text()
        except Exception:  # noqa: BLE001 - the TPU executable's HLO does not round-trip here
            hlo = ""
        gathers = len(re.findall(r"= \S+ gather\(", hlo))
        shapes = {m for m in re.findall(r"(bf16|u16|s8|f32)\[(\d+),(\d+),(\d+),(\d+)\]", hlo)}
        big = sorted((m for m in shapes if int(m[1]) * int(m[2]) * int(m[3]) * int(m[4]) > 8 * 2**20),
                     key=lambda m: -int(m[1]) * int(m[2]) * int(m[3]) * int(m[4]))[:4]  # fmt: skip
        print(f"{target} {layout} b{B}: temps {mem['temp_bytes'] / 1e9:.3f} GB, args {mem['argument_bytes'] / 1e9:.3f} GB, "
              f"XLA bytes {cost.get('xla_bytes_accessed', 0) / 1e9:.3f} GB, model {facts['model_bytes'] / 1e9:.3f} GB, "
              f"gathers {gathers if hlo else '?'}, largest {['x'.join(m[1:]) + ' ' + m[0] for m in big] if hlo else '?'}",
              flush=True)  # fmt: skip
