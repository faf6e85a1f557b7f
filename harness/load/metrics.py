"""Request, turn and task metrics from `RequestRecord`s, in DESIGN.md's (= vLLM's) vocabulary.

Per request (only `ok` records enter latency statistics; failures are counted, never dropped):
- TTFT  = send → first chunk carrying generated output (ms).
- E2E   = send → last output chunk (ms); the trailing usage chunk and [DONE] do not extend it.
- TPOT  = (E2E − TTFT)/(N − 1), N = output tokens from the server's usage (else the stream); only
          requests with N > 1 enter TPOT statistics (for goodput N ≤ 1 counts as TPOT = 0, as vLLM).
- ITL   = every gap between consecutive output chunks, pooled over requests, one sample per chunk
          (vLLM's definition); tokens per chunk are kept so multi-token chunks show up
          (`mean_tokens_per_chunk` > 1 means ITL percentiles are per chunk, not per token).
- client queue = actual send − scheduled send (time spent waiting for a concurrency slot).

Aggregates per load level use vLLM's summary field names (completed, failed, request_throughput,
request_goodput, output_throughput, total_token_throughput, {mean,median,std,p90,p99}_{ttft,tpot,itl,
e2el}_ms) plus a 95% bootstrap interval for every median/p90/p99 (`*_ci95_lo/hi`) and a warning whenever a
percentile rests on too few samples (p99 of fewer than 100 samples is the maximum in all but name).
Goodput = completed requests meeting every SLO ÷ level duration; attainment = good ÷ (completed +
failed), so failures count against it (AIPerf's convention; vLLM leaves them out of denominators).
Agent metrics: by turn index, per task (completion time = first send → last output chunk), TTFT
against uncached prompt tokens (least-squares line), and the DistServe-style capacity: the largest
concurrency whose attainment stays ≥ the target (0.9) at it and every lower level.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any, cast

import numpy as np

from harness.load.client import RequestRecord
from harness.load.slo import SLO
from harness.stats import bootstrap_ci

PCTS = (50, 90, 99)


def ttft_ms(r: RequestRecord) -> float | None:
    return r.chunk_times[0] * 1e3 if r.chunk_times else None


def e2el_ms(r: RequestRecord) -> float | None:
    return r.chunk_times[-1] * 1e3 if r.chunk_times else None


def tpot_ms(r: RequestRecord) -> float | None:
    n = r.output_tokens
    if not r.chunk_times or n <= 1:
        return None
    return (r.chunk_times[-1] - r.chunk_times[0]) * 1e3 / (n - 1)


def itls_ms(r: RequestRecord) -> list[float]:
    return [(b - a) * 1e3 for a, b in zip(r.chunk_times, r.chunk_times[1:], strict=False)]


def percentile_ci(x: np.ndarray, q: float, seed: int = 0) -> tuple[float | None, float | None]:
    """95% percentile-bootstrap interval of the q-th percentile (harness.stats' bootstrap, np.percentile's
    linear rule); None with fewer than 2 samples."""
    if len(x) < 2:
        return (None, None)
    lo, hi = bootstrap_ci(x, lambda a: np.percentile(a, q, axis=1), n_resamples=1000, seed=seed)
    return (lo, hi)


# Samples below which a percentile is its top sample or two, not a tail estimate.
FEW_FOR = {90: 10, 99: 100}
# What one sample of each distribution is (for the warning line).
SAMPLE_UNITS = {"itl": "gaps", "task_completion": "tasks"}


def few_samples_line(few: dict[str, int]) -> str | None:
    """One warning for a level's distributions whose p90/p99 rest on too few samples, e.g.
    "few samples: p90/p99 of ttft, tpot, e2el (8 requests), task_completion (2 tasks); p99 of itl
    (56 gaps) (p90 needs ≥ 10, p99 ≥ 100: read them as maxima)". `few`: name -> sample count."""
    by_pct: dict[str, dict[tuple[int, str], list[str]]] = defaultdict(lambda: defaultdict(list))
    for name, n in few.items():
        bad = "/".join(f"p{q}" for q, need in FEW_FOR.items() if n < need)
        if bad:
            by_pct[bad][(n, SAMPLE_UNITS.get(name, "requests"))].append(name)
    if not by_pct:
        return None
    parts = []
    for pcts in sorted(by_pct, key=len, reverse=True):
        groups = sorted(by_pct[pcts].items(), key=lambda g: -g[0][0])
        parts.append(
            f"{pcts} of " + ", ".join(f"{', '.join(names)} ({n} {unit})" for (n, unit), names in groups)
        )
    need = ", ".join(f"p{q} needs ≥ {n}" for q, n in FEW_FOR.items())
    return f"few samples: {'; '.join(parts)} ({need}: read them as maxima)"


def distribution(name: str, values: Sequence[float], few: dict[str, int], seed: int = 0) -> dict[str, Any]:
    """mean/median/std/p90/p99 `_{name}_ms` with `_ci95` intervals; records the sample count in
    `few` when a tail percentile rests on too few samples (see `few_samples_line`)."""
    x = np.asarray(values, dtype=float)
    out: dict[str, Any] = {f"n_{name}": int(len(x))}
    if len(x) == 0:
        for k in ("mean", "median", "std", "p90", "p99"):
            out[f"{k}_{name}_ms"] = None
        return out
    out[f"mean_{name}_ms"] = float(x.mean())
    out[f"std_{name}_ms"] = float(x.std())
    for q in PCTS:
        key = "median" if q == 50 else f"p{q}"
        out[f"{key}_{name}_ms"] = float(np.percentile(x, q))
        out[f"{key}_{name}_ms_ci95_lo"], out[f"{key}_{name}_ms_ci95_hi"] = percentile_ci(x, q, seed=seed)
    if len(x) < max(FEW_FOR.values()):
        few[name] = int(len(x))
    return out


def is_good(r: RequestRecord, slo: SLO) -> bool:
    """A completed request meeting every request-level objective (TPOT of N ≤ 1 counts as 0)."""
    if not r.ok:
        return False
    checks = ((slo.ttft_ms, ttft_ms(r)), (slo.tpot_ms, tpot_ms(r) or 0.0), (slo.e2el_ms, e2el_ms(r)))
    return all(limit is None or (v is not None and v <= limit) for limit, v in checks)


def summarize_requests(records: Sequence[RequestRecord], duration_s: float, slo: SLO) -> dict[str, Any]:
    """One load level's vLLM-style summary over its request records."""
    ok = [r for r in records if r.ok]
    few: dict[str, int] = {}
    n_in = sum((r.prompt_tokens if r.prompt_tokens is not None else (r.input_len or 0)) for r in ok)
    n_out = sum(r.output_tokens for r in ok)
    good = sum(is_good(r, slo) for r in records)
    chunks = sum(len(r.chunk_tokens) for r in ok)
    out: dict[str, Any] = {
        "num_prompts": len(records),
        "completed": len(ok),
        "failed": len(records) - len(ok),
        "failed_by_kind": _count_kinds(records),
        "duration": duration_s,
        "total_input_tokens": n_in,
        "total_output_tokens": n_out,
        "request_throughput": len(ok) / duration_s if duration_s > 0 else None,
        "request_goodput": good / duration_s if duration_s > 0 else None,
        "good_requests": good,
        "slo_attainment": good / len(records) if records else None,
        "output_throughput": n_out / duration_s if duration_s > 0 else None,
        "total_token_throughput": (n_in + n_out) / duration_s if duration_s > 0 else None,
        "mean_tokens_per_chunk": (sum(r.streamed_tokens for r in ok) / chunks) if chunks else None,
    }
    out |= distribution("ttft", [v for r in ok if (v := ttft_ms(r)) is not None], few)
    out |= distribution("tpot", [v for r in ok if (v := tpot_ms(r)) is not None], few)
    out |= distribution("itl", [g for r in ok for g in itls_ms(r)], few)
    out |= distribution("e2el", [v for r in ok if (v := e2el_ms(r)) is not None], few)
    out |= distribution("client_queue", [r.queue_s * 1e3 for r in records], few)
    out["few_samples"] = few
    return out


def _count_kinds(records: Sequence[RequestRecord]) -> dict[str, int]:
    kinds: dict[str, int] = defaultdict(int)
    for r in records:
        if not r.ok:
            kinds[r.error_kind or "unknown"] += 1
    return dict(kinds)


def uncached_tokens(r: RequestRecord) -> int | None:
    if r.prompt_tokens is None:
        return None
    return r.prompt_tokens - (r.cached_tokens or 0)


def by_turn(records: Sequence[RequestRecord]) -> list[dict[str, Any]]:
    """Per turn index: TTFT/E2E median and p90, prompt, cached and uncached tokens (agent runs)."""
    groups: dict[int, list[RequestRecord]] = defaultdict(list)
    for r in records:
        if r.turn is not None:
            groups[r.turn].append(r)
    rows = []
    for turn in sorted(groups):
        rs = groups[turn]
        ok = [r for r in rs if r.ok]
        tt = [ttft_ms(r) for r in ok]
        ee = [e2el_ms(r) for r in ok]
        # ok records carry chunk times, so these hold no None
        tt_ms, ee_ms = cast(list[float], tt), cast(list[float], ee)
        pt = [r.prompt_tokens for r in ok if r.prompt_tokens is not None]
        ct = [r.cached_tokens or 0 for r in ok if r.prompt_tokens is not None]
        rows.append(
            {
                "turn": turn,
                "n": len(rs),
                "failed": len(rs) - len(ok),
                "median_ttft_ms": float(np.median(tt_ms)) if tt else None,
                "p90_ttft_ms": float(np.percentile(tt_ms, 90)) if tt else None,
                "median_e2el_ms": float(np.median(ee_ms)) if ee else None,
                "p90_e2el_ms": float(np.percentile(ee_ms, 90)) if ee else None,
                "mean_prompt_tokens": float(np.mean(pt)) if pt else None,
                "mean_cached_tokens": float(np.mean(ct)) if ct else None,
                "mean_uncached_tokens": float(np.mean(pt) - np.mean(ct)) if pt else None,
            }
        )
    return rows


def task_table(records: Sequence[RequestRecord], turns: int | Mapping[int, int], slo: SLO) -> list[dict[str, Any]]:
    """One row per task: turns done, ok, completion time, whether every turn and the task met the SLO.
    `turns`: every task's turn count, or each task id's (session traces)."""
    groups: dict[int, list[RequestRecord]] = defaultdict(list)
    for r in records:
        if r.task_id is not None:
            groups[r.task_id].append(r)
    rows = []
    for task_id in sorted(groups):
        rs = sorted(groups[task_id], key=lambda r: r.send_s)
        expected = turns if isinstance(turns, int) else turns.get(task_id, len(rs))
        ok = len(rs) == expected and all(r.ok for r in rs)
        done_ms = (rs[-1].end_s - rs[0].send_s) * 1e3 if ok and rs[-1].end_s is not None else None
        turns_good = ok and all(is_good(r, slo) for r in rs)
        task_ok = slo.task_e2e_ms is None or (done_ms is not None and done_ms <= slo.task_e2e_ms)
        rows.append(
            {
                "task_id": task_id,
                "agent_id": rs[0].agent_id,
                "turns_done": sum(r.ok for r in rs),
                "ok": ok,
                "completion_ms": done_ms,
                "good": bool(turns_good and task_ok),
            }
        )
    return rows


def summarize_tasks(tasks: Sequence[dict[str, Any]], duration_s: float) -> dict[str, Any]:
    """Task completion percentiles, task goodput and task SLO attainment."""
    few: dict[str, int] = {}
    good = sum(t["good"] for t in tasks)
    out = {
        "tasks": len(tasks),
        "tasks_completed": sum(t["ok"] for t in tasks),
        "tasks_failed": sum(not t["ok"] for t in tasks),
        "good_tasks": good,
        "task_goodput": good / duration_s if duration_s > 0 else None,
        "task_slo_attainment": good / len(tasks) if tasks else None,
    }
    done = [t["completion_ms"] for t in tasks if t["completion_ms"] is not None]
    out |= distribution("task_completion", done, few)
    out["task_few_samples"] = few
    return out


def ttft_vs_uncached(records: Sequence[RequestRecord]) -> dict[str, Any]:
    """Least-squares TTFT = intercept + slope · uncached prompt tokens over completed requests."""
    pts = [(u, ttft_ms(r)) for r in records if r.ok and (u := uncached_tokens(r)) is not None]
    out: dict[str, Any] = {"n": len(pts), "ms_per_uncached_token": None, "intercept_ms": None, "r2": None}
    if len(pts) < 3 or len({u for u, _ in pts}) < 2:
        return out
    x = np.array([p[0] for p in pts], dtype=float)
    y = np.array([p[1] for p in pts], dtype=float)
    slope, icept = np.polyfit(x, y, 1)
    resid = y - (slope * x + icept)
    ss_tot = float(((y - y.mean()) ** 2).sum())
    r2 = 1 - float((resid**2).sum()) / ss_tot if ss_tot > 0 else None
    return out | {"ms_per_uncached_token": float(slope), "intercept_ms": float(icept), "r2": r2}


def _turn(r: RequestRecord) -> int:
    """The turn index of an agent-task record (only those are grouped into tasks)."""
    assert r.turn is not None
    return r.turn


def _new_prompt_tokens(prev: RequestRecord | None, cur: RequestRecord) -> int | None:
    """Tokens of `cur`'s prompt that were not in the previous turn's prompt + reply: exact from ids
    when both are known, else from usage counts; a first turn (or one after a gap) is all new."""
    if cur.prompt_tokens is None:
        return None
    if prev is None:
        return cur.prompt_tokens
    if prev.prompt_ids is not None and prev.output_ids is not None and cur.prompt_ids is not None:
        seen = prev.prompt_ids + prev.output_ids
        n = min(len(seen), len(cur.prompt_ids))
        shared = next((i for i in range(n) if seen[i] != cur.prompt_ids[i]), n)
        return len(cur.prompt_ids) - shared
    if prev.prompt_tokens is None:
        return cur.prompt_tokens
    return max(0, cur.prompt_tokens - prev.prompt_tokens - prev.output_tokens)


def prefix_reuse(
    records: Sequence[RequestRecord], turn_rows: Sequence[dict[str, Any]], shared_prefix: int = 0
) -> dict[str, Any]:
    """Agent turns (issue 5): prompt tokens the server computed vs reused, and two ratios.

    computed = Σ (prompt_tokens − cached_tokens) from usage; new = Σ tokens of each turn's prompt
    that were not in the previous turn's prompt + reply (the tool result and template tokens; a
    task's first turn counts whole, except a `shared_prefix` common to every task (the
    shared-prefix workload's system prompt), which counts once for the whole level). `computed_over_new_prompt_tokens` is 1 for a server that
    computes only new tokens (ours recomputes one more per turn: the reply's last token, which it
    never fed back); `ttft_last_turn_over_first` compares the per-turn median TTFTs of the last and
    the first turn (`turn_rows` from `by_turn`)."""
    tasks: dict[int, list[RequestRecord]] = defaultdict(list)
    for r in records:
        if r.task_id is not None and r.turn is not None and r.ok:
            tasks[r.task_id].append(r)
    prompt = cached = new = 0
    known = True
    for rs in tasks.values():
        rs.sort(key=_turn)
        prev = None
        for r in rs:
            n_new = _new_prompt_tokens(prev if prev is not None and _turn(r) == _turn(prev) + 1 else None, r)
            if n_new is None or r.cached_tokens is None:
                known = False
            else:
                if r is rs[0] and shared_prefix:
                    n_new -= min(shared_prefix, n_new)
                assert r.prompt_tokens is not None  # else _new_prompt_tokens returned None
                prompt, cached, new = prompt + r.prompt_tokens, cached + r.cached_tokens, new + n_new
            prev = r
    if tasks and shared_prefix:
        new += shared_prefix
    rows = [t for t in turn_rows if t.get("median_ttft_ms")]
    first, last = (rows[0], rows[-1]) if len(rows) >= 2 else (None, None)
    return _first_turns(tasks) | {
        "prompt_tokens_total": prompt if known else None,
        "prompt_tokens_reused": cached if known else None,
        "prompt_tokens_computed": prompt - cached if known else None,
        "new_prompt_tokens": new if known else None,
        "shared_prefix_tokens": shared_prefix,
        "computed_over_new_prompt_tokens": (prompt - cached) / new if known and new else None,
        "ttft_first_turn_ms": first["median_ttft_ms"] if first else None,
        "ttft_last_turn_ms": last["median_ttft_ms"] if last else None,
        "ttft_last_turn": last["turn"] if last else None,
        "ttft_last_turn_over_first": last["median_ttft_ms"] / first["median_ttft_ms"]
        if first and last
        else None,
    }


def _first_turns(tasks: dict[int, list[RequestRecord]]) -> dict[str, Any]:
    """First-turn TTFT of the task sent first (the lead, which computes a shared prefix) and the
    median and max over every other task's first turn."""
    firsts = sorted((rs[0] for rs in tasks.values() if rs and _turn(rs[0]) == 0), key=lambda r: r.send_s)
    rest = [t for r in firsts[1:] if (t := ttft_ms(r)) is not None]
    return {
        "ttft_first_turn_lead_ms": ttft_ms(firsts[0]) if firsts else None,
        "ttft_first_turn_rest_median_ms": float(np.median(rest)) if rest else None,
        "ttft_first_turn_rest_max_ms": max(rest) if rest else None,
    }


def max_concurrency_at_attainment(
    levels: Sequence[tuple[int, float | None]], target: float = 0.9
) -> int | None:
    """Largest concurrency c with attainment ≥ target at c and at every lower level (None if none)."""
    best = None
    for conc, att in sorted(levels):
        if att is None or att < target:
            break
        best = conc
    return best
