"""The prefix-sharing check on the simulator: results/reference/prefix-share-cpu-small/run.sh's ratios, priced by a target's profile.

    rows = prefix_share_ratios(resolve_target("tpu-v6e"), concurrencies=(4, 8))

Per concurrency, three serve-load workloads on fresh simulated servers (harness/sim/simulate.py):
cold `input_len`-token prompts (fixed), `agents` agents sharing a `prefix_len`-token system prompt
with the lead agent's first turn alone (shared-prefix), and the same agents released together
(`lead_agent=False`). The ratios are run.sh's: first-turn TTFT of the agents after the lead (all of
them when released together) ÷ the cold prompts', median ÷ median and max ÷ max, and prompt tokens
computed ÷ new (serve-load's `computed_over_new_prompt_tokens`, the shared prompt counted once).

Released together, every agent but one waits for the prefix that one computes, so the max is at
least that prefix's prefill over a cold prompt's TTFT on any host; the lead agent's own TTFT is
printed beside it. As every simulated figure, no HTTP and no host work between engine calls.
"""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path
from typing import Annotated, Any

import typer

from harness.args import ModelOption, ProfileOption, TargetOption
from harness.load.report import build_summary
from harness.load.runner import LoadConfig
from harness.load.workloads import Kind, WorkloadConfig
from harness.sim.simulate import ServerShape, simulate


def _records(kind: Kind, conc: int, shape: ServerShape, pricer: Any, n: int, **wl: Any) -> tuple[list, dict]:
    cfg = LoadConfig(base_url="simulated", workload=WorkloadConfig(kind=kind, **wl), concurrencies=[conc], num_tasks=n,
                     rate=math.inf)  # fmt: skip
    result, _ = simulate(cfg, shape, pricer)
    return result.levels[0].records, build_summary(result, {"env": {}})["levels"][0]


def prefix_share_ratios(
    target: Any,
    *,
    concurrencies: tuple[int, ...] = (4, 8),
    agents: int = 16,
    prefix_len: int = 2000,
    input_len: int = 200,
    output_len: int = 16,
    turns: int = 2,
    max_slots: int = 8,
    max_len: int = 8192,
) -> list[dict[str, Any]]:
    """One row per (concurrency, arrival: "after the lead" | "released together"); see the module docstring."""
    shape = ServerShape(model=target.model, max_slots=max_slots, max_len=max_len)
    pricer = target.pricer_for(shape)
    rows = []
    for conc in concurrencies:
        cold, _ = _records(
            "fixed", conc, shape, pricer, agents, input_len=input_len, output_len=output_len, turns=1
        )
        cold_ttft = [r.chunk_times[0] for r in cold if r.ok]
        cmed, cmax = statistics.median(cold_ttft), max(cold_ttft)
        for lead in (True, False):
            recs, level = _records("shared-prefix", conc, shape, pricer, agents, input_len=input_len,
                                   output_len=output_len, turns=turns, prefix_len=prefix_len,
                                   lead_agent=lead)  # fmt: skip
            first = [r for r in recs if r.ok and r.turn == 0]
            opener = min(first, key=lambda r: r.send_s)
            rest = [r.chunk_times[0] for r in first if not (lead and r is opener)]
            rows.append({
                "conc": conc,
                "arrival": "after the lead" if lead else "released together",
                "cold_ttft_ms": [1e3 * cmed, 1e3 * cmax],
                "ttft_ms": [1e3 * statistics.median(rest), 1e3 * max(rest)],
                "over_cold": [statistics.median(rest) / cmed, max(rest) / cmax],
                "first_agent_ttft_ms": 1e3 * opener.chunk_times[0],
                "computed_over_new": level["computed_over_new_prompt_tokens"],
            })  # fmt: skip
    return rows


def ratio_line(row: dict[str, Any]) -> str:
    (cmed, cmax), (med, mx), (rmed, rmax) = row["cold_ttft_ms"], row["ttft_ms"], row["over_cold"]
    return (f"c={row['conc']} {row['arrival']}: cold TTFT median {cmed:.1f} / max {cmax:.1f} ms; agents "
            f"{med:.1f} / {mx:.1f} ms → ÷ cold {rmed:.2f} / {rmax:.2f}; the first agent {row['first_agent_ttft_ms']:.1f} "
            f"ms; prompt tokens computed ÷ new {row['computed_over_new']:.3f}")  # fmt: skip


def main(
    target: TargetOption = "local",
    model: ModelOption = None,
    profile: ProfileOption = None,
    out: Annotated[Path | None, typer.Option(help="Write the rows to OUT/prefix-share-sim.json.")] = None,
) -> None:
    """`python -m harness.sim.prefix_share`: run.sh's prefix-sharing ratios, simulated on a target's profile."""
    from harness.sim.planner import cli_target

    t = cli_target(target, profile, model)
    rows = prefix_share_ratios(t)
    for row in rows:
        print(ratio_line(row))
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        doc = {"target": t.id, "assumptions": t.assumptions, "rows": rows}
        (out / "prefix-share-sim.json").write_text(json.dumps(doc, indent=2))


if __name__ == "__main__":
    typer.run(main)
