"""Measured: a verify step (k+1 query tokens per sequence) against a decode step, per batch.

    PYTHONPATH=. python -m harness.calibrate.verify_steps --model small --ctx 8192 --batches 1,4,8,32 --k 3

Data flow, per batch B: one Engine (synthetic weights in the platform's format, paged KV, B slots,
max_len ctx + 64; the cache is left as garbage, as `warmup` does: timing needs shapes, not values)
→ a compile call each, then `reps` interleaved rounds timing (a) `Engine.decode` at position ctx for every slot,
(b) `Verifier.verify_all` with k+1 tokens per slot at ctx (g4bench/engine/spec_decode.py), (c) one
drafter step (`draft_step`, the `<model>-assistant` preset, synthetic weights) reading target KV of
the shapes it reads in serving (ctx keys for full layers, W + 1 for sliding) → medians → the same
break-even arithmetic as `plan --spec-k` (harness/sim/speculative.py). Every call's result is
read back to the host, so the clock stops after the device finished. Writes a JSON document.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np


def _medians_s(fns: list[Any], reps: int) -> list[float]:
    """Median seconds of each function, compiled first, then timed in interleaved rounds (decode,
    verify, draft, decode, ...) so load from other processes on a shared host drifts onto all
    three alike rather than onto whichever ran during a busy spell."""
    for fn in fns:
        jax.block_until_ready(fn())  # compile
    times: list[list[float]] = [[] for _ in fns]
    for _ in range(reps):
        for fn, ts in zip(fns, times, strict=True):
            t = time.perf_counter()
            jax.block_until_ready(fn())
            ts.append(time.perf_counter() - t)
    return [statistics.median(ts) for ts in times]


def measure(model: str, ctx: int, batches: list[int], k: int, reps: int) -> dict[str, Any]:
    from g4bench.engine.loading import default_format
    from g4bench.model.config import load_config
    from g4bench.model.drafter import init_drafter, load_drafter_config
    from g4bench.model.params import init_params

    cfg = load_config(model)
    fmt = default_format(cfg)
    params = init_params(cfg, fmt)
    dc = load_drafter_config(f"{model}-assistant")
    dparams = init_drafter(dc, fmt)
    rows = [_measure_batch(cfg, params, dc, dparams, b, ctx, k, reps) for b in batches]
    return {"model": model, "ctx": ctx, "k": k, "reps": reps, "device": jax.devices()[0].device_kind,
            "weights": fmt.name, "drafter": dc.name, "rows": rows}  # fmt: skip


def _measure_batch(cfg: Any, params: Any, dc: Any, dparams: Any, b: int, ctx: int, k: int, reps: int) -> dict:
    """Decode, batch verify and drafter step medians for batch `b` (see the module docstring)."""
    from g4bench.engine.engine import Engine
    from g4bench.engine.engine_config import EngineConfig
    from g4bench.engine.spec_decode import Verifier
    from g4bench.model.config import FULL
    from g4bench.model.drafter import TargetKV, draft_step
    from harness.sim.speculative import break_even, expected_tokens

    engine = Engine(cfg, params, EngineConfig(max_slots=b, max_len=ctx + 64, chunk_size=max(16, k + 1)))
    verifier = Verifier(engine)
    pos = np.full(b, ctx, np.int32)
    tokens = np.full(b, 3, np.int32)
    active = np.ones(b, bool)
    vt = np.full((b, k + 1), 3, np.int32)
    cdt = engine.compute_dtype
    kv = {}
    for ltype in set(dc.text.layer_types):
        keys = ctx if ltype == FULL else cfg.sliding_window + 1
        d = cfg.global_head_dim if ltype == FULL else cfg.head_dim
        z = jnp.zeros((b, cfg.num_key_value_heads, keys, d), cdt)
        kv[ltype] = TargetKV(z, z, jnp.broadcast_to(jnp.arange(keys, dtype=jnp.int32), (b, keys)),
                             jnp.ones((b, keys), bool))  # fmt: skip
    step = jax.jit(draft_step, static_argnames=("dc", "compute_dtype"))
    emb = jnp.zeros((b, cfg.hidden_size), cdt)
    p = jnp.full((b,), ctx, jnp.int32)
    decode_s, verify_s, draft_s = _medians_s(
        [
            lambda: engine.decode(tokens, pos, active),
            lambda: np.asarray(verifier.verify_all(vt, pos)),
            lambda: np.asarray(step(dparams, dc, emb, emb, p, kv, compute_dtype=cdt)[0]),
        ],
        reps,
    )
    round_over = (k * draft_s + verify_s) / decode_s
    return {
        "batch": b, "decode_ms": 1e3 * decode_s, "verify_ms": 1e3 * verify_s, "draft_ms": 1e3 * draft_s,
        "verify_over_decode": verify_s / decode_s, "break_even_accept": break_even(round_over, k),
        "speedup_at_0.7": expected_tokens(0.7, k) / round_over,
    }  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="small")
    ap.add_argument("--ctx", type=int, default=8192)
    ap.add_argument("--batches", default="1,4,8,32")
    ap.add_argument("--k", type=int, default=3)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args(argv)
    doc = measure(a.model, a.ctx, [int(x) for x in a.batches.split(",")], a.k, a.reps)
    for r in doc["rows"]:
        be = "never" if r["break_even_accept"] is None else f"{r['break_even_accept']:.2f}"
        print(f"B={r['batch']:>3}  decode {r['decode_ms']:8.2f} ms  verify(k={a.k}) {r['verify_ms']:8.2f} ms "
              f"({r['verify_over_decode']:.2f}×)  draft {r['draft_ms']:7.2f} ms  break-even α {be}")  # fmt: skip
    if a.out:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(json.dumps(doc, indent=2) + "\n")
        print(f"written: {a.out}")


if __name__ == "__main__":
    main()
