"""A step-time model: predicted milliseconds of one decode (or prefill) step from its bytes and FLOPs.

The form (one per device and program, coefficients fitted by harness/calibrate/main.py)::

    t = c
      + smax_p( weights_GB · w ,  linear_TFLOP · f )             layer matmuls + LM head
      + smax_p( kv_GB · k      ,  attention_TFLOP · a )          attention over the cache (+ copy)
      + logits_GB · k                                            the [B, V] logits, streamed
    smax_p(x, y) = (x^p + y^p)^(1/p)

Inputs come from g4bench.model.costs (`StepCost`): `weights_GB` = streamed weights + LM head,
`kv_GB` = KV read + KV write + whole-cache copy (copying step), `linear_TFLOP` = layer linears +
LM head, `attention_TFLOP` = q·kᵀ and p·v. Coefficients are times per unit (ms per GB = the
inverse of an effective bandwidth, ms per TFLOP = the inverse of an effective FLOP rate).

Why this shape: an op class runs at the slower of its memory stream and its compute; `smax_p`
is a max that is smooth near the ridge (imperfect overlap; p → ∞ is the plain roofline max, p = 1
the plain sum). Decode attention is where this matters: with grouped-query heads the MXU sees only
`n_rep` query rows (8 on E2B), so its FLOP rate is a few per cent of peak and an int8 cache — half
the bytes of bf16, the same FLOPs — is compute-bound where bf16 is memory-bound. A bytes-only
model therefore under-predicts int8 steps at long context, and over-predicts the cost of a
copying step's whole-cache copy for int8 (the copy streams while attention computes). Linears are
weights-bound at small batch and compute-bound at large batch, the same way. No term refers to a
particular measured point.

`c` is the per-step constant (launch, norms, gathers, the sampler) and absorbs anything whose
bytes never vary in the fit set (for one model and weight format, the weight stream).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

GB = 1e9
TFLOP = 1e12
COEFFS = ("const_ms", "weights_ms_per_gb", "linear_ms_per_tflop", "kv_ms_per_gb", "attention_ms_per_tflop")
FEATURES = ("weights_gb", "linear_tflop", "kv_gb", "attention_tflop", "logits_gb")
PROGRAMS = ("decode", "prefill", "mixed")  # the engine calls a profile may fit, each its own [section]


def features_of(cost: Any) -> dict[str, float]:
    """The model's inputs from a costs.StepCost (bytes and FLOPs by part)."""
    b, f = cost.bytes_by_part, cost.flops_by_part
    return {
        "weights_gb": (b.get("weights", 0) + b.get("lm_head", 0)) / GB,
        "linear_tflop": (f.get("linears", 0) + f.get("lm_head", 0)) / TFLOP,
        "kv_gb": (b.get("kv_read", 0) + b.get("kv_write", 0) + b.get("kv_copy", 0)) / GB,
        "attention_tflop": f.get("attention", 0) / TFLOP,
        "logits_gb": b.get("logits", 0) / GB,
    }


def smax(x: np.ndarray, y: np.ndarray, p: float) -> np.ndarray:
    """(x^p + y^p)^(1/p), computed stably (x, y ≥ 0)."""
    m = np.maximum(np.maximum(x, y), 1e-30)
    return m * ((x / m) ** p + (y / m) ** p) ** (1.0 / p)


def predict_ms(coef: np.ndarray | list[float], p: float, feats: dict[str, np.ndarray]) -> np.ndarray:
    """Vectorized model: `coef` in COEFFS order, `feats` arrays keyed by FEATURES."""
    c, w, f, k, a = (float(x) for x in coef)
    x = {n: np.asarray(feats[n], float) for n in FEATURES}
    linears = smax(x["weights_gb"] * w, x["linear_tflop"] * f, p)
    attention = smax(x["kv_gb"] * k, x["attention_tflop"] * a, p)
    return c + linears + attention + x["logits_gb"] * k


@dataclass(frozen=True)
class StepModel:
    """One program's fitted model: coefficients, overlap exponent, and its validation figures."""

    coef: dict[str, float]
    overlap_p: float
    validation: dict[str, Any] = field(default_factory=dict)

    def predict(self, cost: Any) -> float:
        feats = {k: np.array([v]) for k, v in features_of(cost).items()}
        return float(predict_ms([self.coef[n] for n in COEFFS], self.overlap_p, feats)[0])

    @property
    def error_band_pct(self) -> float | None:
        """The band quoted beside a prediction: max |error| on held-out points if any, else LOO."""
        v = self.validation
        for key in ("holdout_max_abs_pct", "loo_max_abs_pct"):
            if v.get(key) is not None:
                return float(v[key])
        return None

    def rates(self) -> dict[str, float | None]:
        """Coefficients as effective rates (GB/s, TFLOP/s); None where the coefficient is 0."""

        def inv(ms: float) -> float | None:
            return 1e3 / ms if ms > 0 else None

        return {
            "weights_gb_per_s": inv(self.coef["weights_ms_per_gb"]),
            "linear_tflop_per_s": inv(self.coef["linear_ms_per_tflop"]),
            "kv_gb_per_s": inv(self.coef["kv_ms_per_gb"]),
            "attention_tflop_per_s": inv(self.coef["attention_ms_per_tflop"]),
        }


@dataclass(frozen=True)
class Profile:
    """A device's step-time profile (configs/profiles/<device>.toml): decode and optionally prefill."""

    device: str
    engine: str
    programs: dict[str, StepModel]
    provenance: dict[str, Any] = field(default_factory=dict)
    step: dict[str, Any] = field(default_factory=dict)  # the served step fitted on (harness/calibrate/step_record.py)

    def model(self, program: str = "decode") -> StepModel | None:
        return self.programs.get(program)
