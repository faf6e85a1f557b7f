"""Seconds of one engine call, from a step-time profile: what the virtual clock advances by.

    pricer = StepPricer.for_engine(profile, cfg, fmt, ecfg, hardware)
    pricer(EngineCall("decode", rows=8, tokens=1, kv_len=512))      # seconds

Data flow: an `EngineCall` (g4bench/engine/virtual_engine.py: program, rows, chunk bucket, KV
bucket) → its bytes and FLOPs from g4bench.model.costs (`decode_cost` at rows = max_slots,
`prefill_cost` at the chunk bucket, `mixed_cost` at the piece-row bucket beside max_slots decode
rows; the logical contiguous layout with the engine's KV dtype and
ring/full sliding KV: a paged read gathers the same positions) → the profile's fitted model for
that program (harness/calibrate/steptime.py) → milliseconds. Shapes repeat (a few buckets), so each is
priced once.

When the profile has no model for a program, the call is priced by the profile's *decode* model (a
mixed call by its *prefill* model when it has one): the same op classes at the same fitted rates
(weight stream, KV stream, linear and attention FLOP rates), and the basis says so; with no profile at all, by the hardware roofline
(max(bytes ÷ peak bandwidth, FLOPs ÷ peak FLOP/s): a lower bound, not a prediction). `basis`
records which was used per program, for the planner's assumption lines.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from g4bench.engine.virtual_engine import EngineCall
from harness.calibrate.steptime import Profile, StepModel


@dataclass
class StepPricer:
    """Callable: EngineCall → seconds. See the module docstring."""

    cfg: Any  # ModelConfig
    fmt: Any  # WeightFormat
    layout: Any  # CacheLayout (logical, contiguous)
    profile: Profile | None
    peak_bytes_per_s: float | None = None
    peak_flop_per_s: float | None = None
    basis: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._price = lru_cache(maxsize=None)(self._price_ms)

    @classmethod
    def for_engine(
        cls, profile: Profile | None, cfg: Any, fmt: Any, ecfg: Any, hardware: Any = None
    ) -> StepPricer:
        from g4bench.model.kv_cache import CacheLayout

        layout = CacheLayout(max_len=ecfg.max_len, kv_dtype=ecfg.kv_dtype, ring=ecfg.sliding_kv == "ring")
        bw = hardware.value("peak_bandwidth_bytes_per_s") if hardware is not None else None
        fl = hardware.value("peak_bf16_flop_per_s") if hardware is not None else None
        return cls(cfg, fmt, layout, profile, bw, fl)

    def model_for(self, program: str) -> tuple[StepModel | None, str]:
        """(model, basis) used for `program`."""
        if self.profile is None:
            return None, "hardware roofline (no profile: lower bound)"
        m = self.profile.model(program)
        if m is not None:
            return m, f"profile {self.profile.device} [{program}]"
        pre = self.profile.model("prefill") if program == "mixed" else None
        if pre is not None:  # a mixed call is mostly prefill tokens: their fitted rates
            return (
                pre,
                f"profile {self.profile.device} [prefill] rates applied to mixed bytes/FLOPs (no mixed fit)",
            )
        dec = self.profile.model("decode")
        if dec is None:
            return None, "hardware roofline (profile has no decode model)"
        return (
            dec,
            f"profile {self.profile.device} [decode] rates applied to {program} bytes/FLOPs (no {program} fit)",
        )

    def cost(self, call: EngineCall) -> Any:
        from g4bench.model import costs

        if call.program == "decode":
            return costs.decode_cost(self.cfg, self.fmt, self.layout, call.rows, call.kv_len)
        if call.program == "prefill":
            return costs.prefill_cost(self.cfg, self.fmt, self.layout, call.tokens, call.kv_len)
        if call.program == "mixed":
            return costs.mixed_cost(
                self.cfg, self.fmt, self.layout, call.decode_rows, call.rows, call.tokens, call.kv_len
            )
        if call.program == "copy":  # one slot's cache read and written
            from g4bench.model.kv_cache import cache_bytes

            return costs.StepCost(bytes_by_part={"kv_copy": 2 * cache_bytes(self.cfg, 1, self.layout)})
        raise ValueError(f"unknown engine program {call.program!r}")

    def _price_ms(self, call: EngineCall) -> float:
        program = "decode" if call.program == "copy" else call.program
        model, basis = self.model_for(program)
        self.basis[call.program] = basis
        cost = self.cost(call)
        if model is not None:
            return model.predict(cost)
        if not (self.peak_bytes_per_s and self.peak_flop_per_s):
            raise ValueError("no profile and no hardware peak figures: cannot price an engine call")
        return 1e3 * max(cost.bytes / self.peak_bytes_per_s, cost.flops / self.peak_flop_per_s)

    def __call__(self, call: EngineCall) -> float:
        # the decode shape does not depend on how many rows are live: price it without `active`
        key = EngineCall(call.program, call.rows, call.tokens, call.kv_len, decode_rows=call.decode_rows)
        return self._price(key) / 1e3

    def error_band_pct(self) -> dict[str, float | None]:
        """Validated |error| band per program the profile fits (None: unvalidated)."""
        if self.profile is None:
            return {}
        return {p: m.error_band_pct for p, m in self.profile.programs.items()}
