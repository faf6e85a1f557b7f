"""Revalidate's visits: which points one child measures together, and the child that measures them.

A visit is one fresh child process in one round. ``--visit separate`` gives every point its own;
``--visit shared-weights`` puts the points that share weights and shape (they differ only in
`ENGINE_FIELDS`) in one, where `revalidate_child` builds the weights once and interleaves their
samples (harness/timing.py). harness/revalidate/main.py plans the rounds over these groups and logs one
line per point.

Data flow::

    visit_groups(points, settings) ──▶ {label: [Point]}
    child_payload(group) ──run.child(CHILD_TARGET)──▶ revalidate_child ──▶ {"results": {name: result}}
    split_results(outcome, group) ──▶ {name: result or the visit's failure}
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

CHILD_TARGET = "harness.revalidate.visits:revalidate_child"
# Fields one process can vary over the same weights; points that differ only in these can share a
# visit (``--visit shared-weights``).
ENGINE_FIELDS = frozenset({"kv_dtype", "donate", "kv_layout", "sliding_kv", "block_size"})


@dataclass(frozen=True)
class Point:
    """One thing to measure: a unique name and its full DecodeCase fields (with model, batch, ctx)."""

    name: str
    case: dict[str, Any]


class VisitSettings(Protocol):
    """What a visit reads of a run's settings (harness/revalidate/main.py's SweepSettings)."""

    @property
    def visit(self) -> str: ...

    @property
    def aa(self) -> int: ...

    @property
    def samples(self) -> int: ...

    @property
    def warmup(self) -> int: ...

    @property
    def seed(self) -> int: ...

    @property
    def cpus(self) -> tuple[int, ...] | None: ...


def visit_groups(points: Sequence[Point], settings: VisitSettings) -> dict[str, list[Point]]:
    """The points each visit measures together in one process, by a label naming the group.

    ``separate``: every point alone (the label is its name). ``shared-weights``: points with the
    same weights and shape (they differ only in `ENGINE_FIELDS`) form one group, so every ratio of
    those fields compares samples taken in the same processes; an A/A run's pairs (aa<i>-A, aa<i>-B)
    each form one. Points keep their order within a group."""
    if settings.visit == "separate":
        return {p.name: [p] for p in points}
    groups: dict[str, list[Point]] = {}
    if settings.aa:
        for p in points:
            groups.setdefault(p.name.rsplit("-", 1)[0], []).append(p)
        return groups
    for p in points:
        groups.setdefault(_weights_label(p.case), []).append(p)
    return groups


def _weights_label(case: dict[str, Any]) -> str:
    """What a case holds besides ENGINE_FIELDS, e.g. "e2b/f32/ple-bf16/b4/ctx8192"."""
    held = {k: v for k, v in case.items() if k not in ENGINE_FIELDS and v is not None}
    named = [str(held.pop("model", "")), str(held.pop("layers", "")), f"ple-{held.pop('ple', '')}"]
    shape = [f"b{held.pop('batch', '')}", f"ctx{held.pop('ctx', '')}"]
    return "/".join([*named, *(f"{k}-{held[k]}" for k in sorted(held)), *shape])


def revalidate_child(payload: dict[str, Any]) -> dict[str, Any]:
    """Isolated-child target: pin threads, build a DecodeBench per point of ``payload["points"]``
    (points of one model and weight format share one copy of the weights), measure them with their
    samples interleaved (harness/timing.py); returns ``{"results": {name: result}}``."""
    from harness.timing import measure_benches, pin_threads

    cpus = pin_threads(payload.get("cpus"))
    import numpy as np

    from harness.env import device_info
    from harness.isolate import configure_jax_cache

    configure_jax_cache()
    from g4bench.engine.bench import DecodeCase, make_decode_bench

    seed = int(payload.get("seed", 0))
    members = payload["points"]
    # build, warm and step in an order fresh to each round, so no member is always first
    rng = np.random.default_rng([seed, int(payload.get("round", 0)), len(members)])
    order = rng.permutation(len(members)).tolist()
    benches = [make_decode_bench(DecodeCase(**members[i]["case"]), seed=seed) for i in order]
    weights: dict[Any, Any] = {}
    for b in benches:
        key = (b.case.model, b.case.weight_format)
        if key not in weights:
            weights[key] = b.materialize()
        b.params = weights[key]
    measured = measure_benches(benches, int(payload["samples"]), int(payload["warmup"]), rng)
    device = device_info()
    results = {}
    for i, result in zip(order, measured, strict=True):
        results[members[i]["name"]] = {**result, "device": device, "cpus": cpus, "visit_size": len(members)}
    return {"results": results}


def child_payload(group: Sequence[Point], settings: VisitSettings) -> dict[str, Any]:
    """The JSON the child receives: each point's name and full DecodeCase, the sampling plan, the
    seed and CPU set."""
    return {
        "points": [{"name": p.name, "case": p.case} for p in group],
        "samples": settings.samples,
        "warmup": settings.warmup,
        "seed": settings.seed,
        "cpus": list(settings.cpus) if settings.cpus else None,
    }


def split_results(outcome: dict[str, Any], group: Sequence[Point]) -> dict[str, dict[str, Any]]:
    """{name: result} from a child's outcome; a failure (the child died, or returned something
    else) is every member's failure, and a member the child left out fails with a "crash"."""
    from harness.results import is_failure

    if is_failure(outcome):
        return {p.name: outcome for p in group}
    results = outcome.get("results") if isinstance(outcome, dict) else None
    if not isinstance(results, dict):
        results = {}
    out = {}
    for p in group:
        if p.name in results:
            out[p.name] = {**results[p.name], "wall_s": outcome.get("wall_s", 0.0) / len(group)}
        else:
            detail = f"the child returned no result for {p.name!r}"
            out[p.name] = {"failure": {"kind": "crash", "detail": detail}, "wall_s": outcome.get("wall_s", 0.0)}
    return out
