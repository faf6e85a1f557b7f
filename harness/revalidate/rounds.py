"""Interleaved fresh-process rounds: every configuration once per round, in a fresh random order.

Why: samples taken in one block per configuration put any drift of the host (another job starting,
thermal throttling, a noisy neighbour) entirely on one side of a comparison. Visiting every
configuration once per round, in a new random order each round, one fresh child process per visit,
spreads drift over all of them, and lets the statistics treat process-to-process variation as the
noise it is (harness/revalidate/compare.py resamples rounds).

Data flow::

    plan_visits(names, rounds, seed) ──▶ [Visit(round, slot, name)]   round-major, shuffled per round
                                         (round_visits: one round; a time-budgeted run adds rounds)
    run_visits(plan, measure, log)   for each visit not yet in `log`: result = measure(visit)
        every result is appended to RUN_DIR/visits.jsonl at once (flushed): a killed sweep keeps it,
        and `--resume` skips the visits already there (a failed visit is measured again)
        (with `members`, a planned name is a group measured in one process: one line per member)
    group_by_name(log) ──▶ {name: [result of round 0, round 1, ...]}

A result is the child's dict (`step_ms_samples`, host load, ...) or a failure record
(harness/isolate.py); `visit_key` names it by (round, name).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from harness.results import is_failure

VISITS_FILE = "visits.jsonl"


@dataclass(frozen=True)
class Visit:
    round: int  # 0-based
    slot: int  # position within its round
    name: str


def round_visits(names: Sequence[str], round_index: int, seed: int = 0) -> list[Visit]:
    """Round `round_index` (0-based) over `names` in its own random order (reproducible from `seed`
    and the round alone, so a run that adds rounds keeps the earlier ones' orders)."""
    if len(set(names)) != len(names):
        raise ValueError("configuration names must be unique")
    order = np.random.default_rng([seed, round_index]).permutation(len(names))
    return [Visit(round_index, slot, names[i]) for slot, i in enumerate(order)]


def plan_visits(names: Sequence[str], rounds: int, seed: int = 0) -> list[Visit]:
    """`rounds` rounds over `names`, each in a fresh random order (`round_visits`)."""
    if rounds < 1:
        raise ValueError(f"rounds must be >= 1, got {rounds}")
    return [v for r in range(rounds) for v in round_visits(names, r, seed)]


def read_visits(run_dir: Path) -> list[dict[str, Any]]:
    """Every visit logged in RUN_DIR/visits.jsonl (empty when there is none yet)."""
    path = Path(run_dir) / VISITS_FILE
    if not path.exists():
        return []
    out = []
    for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if line.strip():
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{lineno}: not JSON ({exc.msg})") from exc
    return out


def append_visit(run_dir: Path, visit: Visit, result: dict[str, Any]) -> dict[str, Any]:
    """Log one visit's result (with its round, slot and name) and return the logged line."""
    line = {"round": visit.round, "slot": visit.slot, "name": visit.name, "result": result}
    with (Path(run_dir) / VISITS_FILE).open("a", encoding="utf-8") as fh:
        fh.write(json.dumps(line, allow_nan=False, separators=(",", ":")) + "\n")
        fh.flush()
        os.fsync(fh.fileno())
    return line


def latest_visits(lines: Iterable[dict[str, Any]]) -> dict[tuple[int, str], dict[str, Any]]:
    """(round, name) → the last logged line for it (a resumed visit replaces its failed attempt)."""
    return {(ln["round"], ln["name"]): ln for ln in lines}


def succeeded(line: dict[str, Any]) -> bool:
    return not is_failure(line["result"])


def pending(
    plan: Sequence[Visit], lines: Iterable[dict[str, Any]], members: Mapping[str, Sequence[str]] | None = None
) -> list[Visit]:
    """The visits of `plan` without a successful logged result (with `members`: for some member)."""
    done = {k for k, ln in latest_visits(lines).items() if succeeded(ln)}
    names = members or {}
    return [v for v in plan if any((v.round, n) not in done for n in names.get(v.name, (v.name,)))]


def run_visits(
    plan: Sequence[Visit],
    run_dir: Path,
    measure: Callable[[Visit], Any],
    on_visit: Callable[[Visit, dict[str, Any]], None] | None = None,
    members: Mapping[str, Sequence[str]] | None = None,
) -> list[dict[str, Any]]:
    """Measure every pending visit of `plan` in order, logging each at once; returns all lines.

    Plain plans: `measure(visit)` returns the visit's result. With `members` (a unit's name → the
    names one visit of it measures together, in one process), `measure` returns {name: result}
    and each member is logged as its own line with the unit's round and slot; `on_visit` then gets
    one call per member."""
    lines = read_visits(run_dir)
    for visit in pending(plan, lines, members):
        if members is None:
            outcome = {visit.name: measure(visit)}
        else:
            outcome = measure(visit)
            missing = set(members[visit.name]) - set(outcome)
            if missing:
                raise ValueError(f"visit {visit.name!r} returned no result for {sorted(missing)}")
        for name in members[visit.name] if members is not None else (visit.name,):
            logged = Visit(visit.round, visit.slot, name)
            lines.append(append_visit(run_dir, logged, outcome[name]))
            if on_visit is not None:
                on_visit(logged, lines[-1]["result"])
    return lines


def group_by_name(lines: Iterable[dict[str, Any]], rounds: int) -> dict[str, list[dict[str, Any] | None]]:
    """name → its results by round (None for a round not measured yet)."""
    out: dict[str, list[dict[str, Any] | None]] = {}
    for (r, name), ln in sorted(latest_visits(lines).items()):
        if r < rounds:
            out.setdefault(name, [None] * rounds)[r] = ln["result"]
    return out
