"""Service-level objectives for goodput: read from a TOML file (configs/slo/agent.toml).

Layout: `attainment_target` (default 0.9), `[turn]` with `ttft_ms`, `tpot_ms`, `e2el_ms` applied to
every request (each agent turn is a request), `[task]` with `e2e_ms` for a whole agent task. A missing
key means "no objective on this metric". Unknown keys are an error, so a typo cannot silently turn an
objective off.
"""

from __future__ import annotations

import tomllib
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

_TURN_KEYS = {"ttft_ms", "tpot_ms", "e2el_ms"}
_TASK_KEYS = {"e2e_ms"}


@dataclass(frozen=True)
class SLO:
    ttft_ms: float | None = None
    tpot_ms: float | None = None
    e2el_ms: float | None = None
    task_e2e_ms: float | None = None
    attainment_target: float = 0.9
    source: str | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    def describe(self) -> str:
        parts = [
            f"{k}≤{v:g}"
            for k, v in (
                ("TTFT ms", self.ttft_ms),
                ("TPOT ms", self.tpot_ms),
                ("E2E ms", self.e2el_ms),
                ("task ms", self.task_e2e_ms),
            )
            if v is not None
        ]
        return ", ".join(parts) or "none"


def load_slo(path: str | Path) -> SLO:
    """Parse an SLO TOML file; raises ValueError naming an unknown section or key."""
    data = tomllib.loads(Path(path).read_text())
    unknown = set(data) - {"attainment_target", "turn", "task"}
    turn, task = data.get("turn", {}), data.get("task", {})
    bad = (
        unknown
        | {f"turn.{k}" for k in set(turn) - _TURN_KEYS}
        | {f"task.{k}" for k in set(task) - _TASK_KEYS}
    )
    if bad:
        raise ValueError(f"{path}: unknown SLO keys {sorted(bad)}")
    return SLO(
        ttft_ms=turn.get("ttft_ms"),
        tpot_ms=turn.get("tpot_ms"),
        e2el_ms=turn.get("e2el_ms"),
        task_e2e_ms=task.get("e2e_ms"),
        attainment_target=float(data.get("attainment_target", 0.9)),
        source=str(path),
    )
