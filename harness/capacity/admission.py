"""Agent-fleet admission: does N agents × C tokens of context each fit, and with how much room?

Data flow: the decode ceilings of a capacity run (one per KV dtype × sliding mode, donated step)
give the compiled program's non-KV bytes at its ceiling,

    overhead = peak − KV bytes       (weights + compiled temporaries + logits; TPU: from the
                                      compiler; local: the probe's peak address space, runtime included)

and each fleet cell is arithmetic on top of it:

    need(N, C)   = overhead + N · row(C)        row(C) = cache bytes of one sequence of C positions
    fits         = need ≤ limit
    headroom     = limit − need  (bytes, and % of the limit)
    max_agents(C) = ⌊(limit − overhead) ÷ row(C)⌋

With a shared prefix of S tokens (`--shared-prefix`: every agent's context starts with the same S
tokens, as with a common system prompt), the paged engine keeps those blocks once:

    shared(S)     = S · b          b = bytes per position of the layers that keep every position
                                   (full-attention layers; sliding ones too unless they are a ring)
    need(N, C, S) = overhead + shared(S) + N · (row(C) − shared(S))

A ring's sliding window is per agent either way. Block rounding (under one block per agent) and
the paged engine's cached-window reserve are not counted.

The overhead is taken at the ceiling batch, where the temporaries that scale with the batch
(logits, sampling) are largest, so a smaller fleet is judged conservatively. A (dtype, sliding)
pair without a measured ceiling falls back to weights only and says so (`overhead_source`).
"""

from __future__ import annotations

import csv
from collections.abc import Sequence
from pathlib import Path
from typing import Any

AGENTS = (2, 4, 8, 16, 32)
AGENT_CTX = (4096, 8192, 16384, 32768)
CSV_FIELDS = (
    "model", "target", "kv_dtype", "sliding_kv", "agents", "agent_ctx", "row_bytes", "overhead_bytes",
    "overhead_source", "need_bytes", "limit_bytes", "fits", "headroom_bytes", "headroom_pct", "max_agents",
    "shared_prefix", "shared_bytes",
    "step_ms", "step_basis", "tok_per_s", "usd_per_m_tokens", "meets_tpot",
)  # fmt: skip


def row_bytes(model: str, kv_dtype: str, sliding: str, ctx: int) -> int:
    """Cache bytes of one sequence holding `ctx` positions (g4bench.model.kv_cache.cache_bytes)."""
    from g4bench.model.config import load_config
    from g4bench.model.kv_cache import CacheLayout, cache_bytes

    return cache_bytes(
        load_config(model), 1, CacheLayout(max_len=ctx, kv_dtype=kv_dtype, ring=sliding == "ring")
    )


def overhead_of(ceiling: dict[str, Any]) -> int | None:
    """Non-KV bytes of a donated decode ceiling record (None when it did not fit at batch 1)."""
    if not ceiling.get("max_batch") or "kv_bytes" not in ceiling:
        return None
    peak = (
        ceiling.get("host_vm_peak_bytes")
        if ceiling["config"]["target"] == "local"
        else ceiling.get("peak_bytes")
    )
    return None if peak is None else int(peak) - int(ceiling["kv_bytes"])


def shared_bytes(model: str, kv_dtype: str, sliding: str, ctx: int, shared: int) -> int:
    """Bytes of `shared` positions kept once for every agent (0 when shared is 0): the positions'
    cost in the layers that keep every position, one position's row increment past the window."""
    if shared <= 0:
        return 0
    if shared >= ctx:
        raise ValueError(f"shared prefix {shared} must be shorter than the context {ctx}")
    per_pos = row_bytes(model, kv_dtype, sliding, ctx) - row_bytes(model, kv_dtype, sliding, ctx - 1)
    return shared * per_pos


def admission_cell(overhead: int, row: int, agents: int, limit: int, shared: int = 0) -> dict[str, Any]:
    """One fleet cell; `shared`: bytes of a common prefix held once (included in `row`)."""
    private = row - shared
    need = overhead + shared + agents * private
    return {
        "need_bytes": need,
        "fits": need <= limit,
        "headroom_bytes": limit - need,
        "headroom_pct": round(100.0 * (limit - need) / limit, 2),
        "max_agents": max(0, (limit - overhead - shared) // private),
        "shared_bytes": shared,
    }


def admission_rows(
    ceilings: Sequence[dict[str, Any]],
    settings: Any,
    agents: Sequence[int] = AGENTS,
    contexts: Sequence[int] = AGENT_CTX,
    shared_prefix: int = 0,
) -> list[dict[str, Any]]:
    """One row per (kv dtype, sliding, agents, context per agent), from the run's donated decode
    ceilings of its first KV layout; with `shared_prefix`, contexts longer than it are also given
    with it shared."""
    from g4bench.engine.bench import DecodeCase
    from g4bench.model.config import load_config
    from g4bench.model.params import param_bytes

    layout = settings.kv_layouts[0]
    rows = []
    for kv in settings.kv:
        for sliding in settings.sliding:
            match = [
                c for c in ceilings
                if c["config"]["program"] == "decode" and c["config"]["donate"] and c["config"]["kv_dtype"] == kv
                and c["config"]["sliding_kv"] == sliding and c["config"]["ple"] == settings.ple[0]
                and c["config"].get("kv_layout", "contiguous") == layout
            ]  # fmt: skip
            overhead = overhead_of(match[0]) if match else None
            source = "compiled ceiling" if overhead is not None else "weights only (no measured ceiling)"
            if overhead is None:
                case = DecodeCase(model=settings.model, layers=settings.layers, ple=settings.ple[0])
                overhead = param_bytes(load_config(settings.model), case.weight_format)
            limit = int(match[0]["limit_bytes"]) if match else settings.limit_bytes
            for ctx in contexts:
                row = row_bytes(settings.model, kv, sliding, ctx)
                for prefix in sorted({0, shared_prefix} if shared_prefix < ctx else {0}):
                    shared = shared_bytes(settings.model, kv, sliding, ctx, prefix)
                    for n in agents:
                        rows.append({
                            "model": settings.model, "target": settings.target, "kv_dtype": kv,
                            "sliding_kv": sliding, "agents": n, "agent_ctx": ctx, "row_bytes": row,
                            "overhead_bytes": overhead, "overhead_source": source, "limit_bytes": limit,
                            "shared_prefix": prefix, **admission_cell(overhead, row, n, limit, shared),
                        })  # fmt: skip
    return rows


def write_admission_csv(path: Path, rows: Sequence[dict[str, Any]]) -> Path:
    with Path(path).open("w", newline="", encoding="utf-8") as fh:
        w = csv.DictWriter(fh, fieldnames=CSV_FIELDS)
        w.writeheader()
        for r in rows:
            w.writerow({k: r.get(k) for k in CSV_FIELDS})
    return Path(path)
