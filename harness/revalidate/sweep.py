"""The rounds of a revalidate sweep: visit every group of points once per round in fresh processes,
log each result, and rewrite the run's records after every round (harness/revalidate/main.py builds the
points and settings; this module runs them).

Data flow::

    [Point] + settings ──visit_groups──▶ {label: [Point]} ──plan_visits(rounds)──▶ [Visit]
        run_visits: one child per visit (RunFolder.child) → visits.jsonl, a progress line each
        after each round: write_outcome → measurement, ratio and summary records (results.jsonl,
        summary.csv); with a time budget, round_visits adds a round until stopping.py says stop
        (settled, precise, the round cap or the budget; the reason printed and in the summary)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from time import monotonic as sweep_clock  # a module attribute, so a test can put a fake clock here
from typing import Any

from harness.revalidate.visits import Point, child_payload, split_results, visit_groups
from harness.run import RunFolder


@dataclass
class SweepOutcome:
    """What a sweep produced: the run folder, its records, and what was skipped or failed."""

    run_dir: Path
    measurements: list[dict[str, Any]] = field(default_factory=list)
    ratios: list[dict[str, Any]] = field(default_factory=list)
    summary: dict[str, Any] = field(default_factory=dict)

    @property
    def records(self) -> list[dict[str, Any]]:
        return [*self.measurements, *self.ratios, *([self.summary] if self.summary else [])]

    @property
    def failures(self) -> list[dict[str, Any]]:
        from harness.results import is_failure

        return [r for r in self.measurements if is_failure(r)]


def run_sweep(
    points: Sequence[Point],
    settings: Any,
    run: RunFolder,
    *,
    target: str,
    console: Any = None,
) -> SweepOutcome:
    """Visit every group of points once per round (fresh random order each round, one child per
    visit), log each point's result, and rewrite the run's records after every round; returns the
    final outcome. `settings`: harness/revalidate/main.py's SweepSettings; `target`: the child function.

    Rounds: `settings.rounds`, then, with `settings.budget_s` on a fresh run, one more after each round
    until harness/revalidate/stopping.py says stop: every comparison settled or the precision target
    met (from its minimum round on), `settings.max_rounds`, or no room in the budget for another round
    of the average length so far (timed on `sweep_clock`). The reason is printed and stored as the
    summary's ``stop_reason``. A resumed run finishes the rounds it began and adds none."""
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    from harness.revalidate.rounds import Visit, pending, plan_visits, read_visits, round_visits, run_visits
    from harness.revalidate.stopping import StopRule, cap_reason, settled_reason

    console = console or Console(stderr=True)
    groups = visit_groups(points, settings)
    names = list(groups)
    members = {label: [p.name for p in group] for label, group in groups.items()}
    logged = read_visits(run.path)
    rounds = max(settings.rounds, max((ln["round"] for ln in logged), default=-1) + 1)
    budget = settings.budget_s if not logged else None
    rule = StopRule(max_rounds=settings.max_rounds)
    plan = plan_visits(names, rounds, settings.seed)
    todo = pending(plan, logged, members)
    if len(todo) < len(plan):
        console.print(f"[dim]resume: {len(plan) - len(todo)} visit(s) already measured in {run.path}[/dim]")
    columns = (
        TextColumn("{task.description}"),
        BarColumn(bar_width=20),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("eta"),
        TimeRemainingColumn(),
    )

    def measure(visit: Visit) -> dict[str, dict[str, Any]]:
        group = groups[visit.name]
        payload = child_payload(group, settings) | {"round": visit.round}
        return split_results(run.child(target, payload, f"{visit.name}-r{visit.round}"), group)

    with Progress(*columns, console=console, transient=False) as progress:
        total = sum(len(members[v.name]) for v in todo)
        task = progress.add_task("revalidate", total=total)

        def on_visit(visit: Visit, result: dict[str, Any]) -> None:
            progress.console.print(_one_line(visit, result, f"{rounds}{'+' if budget else ''}"))
            progress.advance(task)

        started = sweep_clock()
        done, stop = 0, None
        while done < rounds:
            for visit in (v for v in todo if v.round == done):
                progress.update(task, description=f"r{visit.round + 1} {visit.name}")
                run_visits([visit], run.path, measure, on_visit, members)
            done += 1
            # a round is complete: refresh the records
            outcome = write_outcome(points, settings, run, rounds=done)
            if done < rounds:
                continue
            if budget is None:
                stop = f"{done} rounds, as {'the resumed run began' if logged else 'asked'} (no time budget)"
                break
            stop = settled_reason(outcome.measurements, outcome.ratios, done, rule) or cap_reason(
                done, sweep_clock() - started, rule, budget
            )
            if stop is None:  # unsettled, and another round of the average length still fits
                rounds += 1
                todo.extend(round_visits(names, done, settings.seed))
                total += sum(len(m) for m in members.values())
                progress.update(task, total=total)
    console.print(f"[bold]stopped[/bold]: {stop}")
    return write_outcome(points, settings, run, rounds=rounds, stop_reason=stop)


def write_outcome(
    points: Sequence[Point],
    settings: Any,
    run: RunFolder,
    *,
    rounds: int | None = None,
    stop_reason: str | None = None,
) -> SweepOutcome:
    """Records from every logged visit of the first `rounds` rounds (default `settings.rounds`):
    measurements, ratios, the run summary (with `stop_reason`, why no more rounds were added) →
    results.jsonl, summary.csv (atomically rewritten, so a killed sweep keeps the last complete round)."""
    from harness.results import rewrite_records, write_summary
    from harness.revalidate.records import measurement_record, summary_record, with_pooled_median_ci
    from harness.revalidate.rounds import group_by_name, read_visits
    from harness.revalidate.verdicts import ratio_records, run_noise

    run_id, base_env = run.run_id, run.base_env
    grouped = group_by_name(read_visits(run.path), rounds or settings.rounds)
    shared = {p.name: label for label, group in visit_groups(points, settings).items() if len(group) > 1 for p in group}
    meas = []
    for p in points:
        results = [r for r in grouped.get(p.name, []) if r is not None]
        if results:
            rec = measurement_record(p, results, settings, run_id=run_id, base_env=base_env)
            if p.name in shared:
                rec["visit_group"] = shared[p.name]
            meas.append(rec)
    noise = run_noise(meas)
    with_pooled_median_ci(meas, noise)
    ratios = ratio_records(meas, run_id=run_id, base_env=base_env, floor=settings.floor, seed=settings.seed)
    summary = summary_record(meas, ratios, settings, run_id=run_id, base_env=base_env, noise=noise)
    if stop_reason is not None:
        summary["stop_reason"] = stop_reason
    outcome = SweepOutcome(run_dir=run.path, measurements=meas, ratios=ratios, summary=summary)
    rewrite_records(run.path, outcome.records)
    write_summary(run.path, outcome.records)
    return outcome


def _one_line(visit: Any, result: dict[str, Any], rounds: str) -> str:
    """Progress line for one finished visit (rich markup)."""
    import statistics

    from harness.run import failure_line

    tag = f"r{visit.round + 1}/{rounds} {visit.name}"
    if (line := failure_line(tag, result)) is not None:
        return line
    med = statistics.median(result["step_ms_samples"])
    from harness.hostload import contaminated

    loads = result.get("host_other_cores") or []
    steal = result.get("host_steal_frac") or [0.0] * len(loads)
    n = sum(contaminated(o, s) for o, s in zip(loads, steal, strict=False))
    flag = f" [yellow](host busy in {n} of {len(loads)} samples)[/yellow]" if n else ""
    mem = result.get("host_mem_gbs")
    bandwidth = f", memory {statistics.median(mem):.1f} GB/s" if mem else ""
    return f"[green]✓[/green] {tag}: median {med:.3f} ms{bandwidth}{flag}"
