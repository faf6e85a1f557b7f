"""The served step a step-time profile was fitted on, and `plan`'s check against the step it simulates.

    calibrate: fit points' configs ──fitted_step──▶ {field: value, or the sorted values seen} ──▶ [step] in the TOML
    plan:      Profile.step (or, for a profile written before the record, what its fit notes say) ──check──▶
               StepMismatchError naming each difference and the command that fits the right profile

Only the fields a profile's features cannot price are checked (`CHECKED`): the KV layout and the
prefill policy (and the token budget when both run the mixed step). KV dtype, sliding KV and donation
enter the cost model's bytes, so one profile may cover several of them. A profile of the reference
engine (tpu-v6e) is a transfer of another engine's rates onto our step's costs, never a fit of our
step: it is not refused (plan's assumptions say so). Records from before the mixed
step carry no prefill policy: they ran the one-chunk-per-turn policy, the only one there was.
revalidate/roofline records time the bare decode step, which has no prefill policy: a profile of
them alone records none, and plan prices its prefill and mixed calls with the decode rates (calibrate
prints the engine-steps run that adds them).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from g4bench.engine.served_step import ServedStep

CHECKED = ("kv_layout", "prefill_policy")
# The reference JAX engine's step (configs/baselines): contiguous rows, full-length sliding KV, no mixed step.
REFERENCE_STEP = {"kv_layout": "contiguous", "sliding_kv": "full", "prefill_policy": "chunk"}
FIT_SERVED = "g4bench engine-steps --out RUN && g4bench calibrate RUN"


def config_step(config: dict[str, Any]) -> dict[str, Any]:
    """The step fields of one measured record's config (engine-steps records time the served engine:
    paged unless they say otherwise; revalidate/roofline records: contiguous unless they say otherwise)."""
    engine = "program" in config
    layout = config.get("kv_layout") or ("paged" if engine else "contiguous")
    return {
        "kv_layout": layout,
        "sliding_kv": config.get("sliding_kv", "full"),
        "kv_dtype": config.get("kv_dtype", "bf16"),
        "donate": bool(config.get("donate", True)),
        "chunk_size": int(config.get("chunk_size", 256)),
        # revalidate/roofline time the decode step alone: no prefill policy to record (None)
        "prefill_policy": config.get("prefill_policy") or ("chunk" if engine else None),
        "max_batched_tokens": int(config["max_batched_tokens"]) if "max_batched_tokens" in config else None,
    }


def fitted_step(configs: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """{field: the one value seen, or the sorted list of values} over the fit points' configs."""
    seen: dict[str, set[Any]] = {}
    for c in configs:
        for k, v in config_step(c).items():
            if v is not None:
                seen.setdefault(k, set()).add(v)
    return {k: next(iter(v)) if len(v) == 1 else sorted(v, key=str) for k, v in seen.items()}


def profile_step(profile: Any) -> tuple[dict[str, Any] | None, str]:
    """(the step a profile was fitted on, where that came from); (None, why) when it cannot be told."""
    if profile.step:
        return dict(profile.step), "its step record"
    if profile.engine.startswith("reference"):
        return dict(REFERENCE_STEP), "its fit notes (the reference JAX engine's contiguous step)"
    from harness.results import read_records

    configs = [r["config"] for d in profile.provenance.get("runs", []) if Path(d).is_dir()
               for r in read_records(Path(d)) if isinstance(r.get("config"), dict)]  # fmt: skip
    if configs:
        return fitted_step(configs), f"its fit runs ({', '.join(profile.provenance['runs'])})"
    return None, "it has no step record and its fit runs are not here"


def differences(fitted: dict[str, Any], step: ServedStep) -> list[str]:
    """`field: simulated vs fitted` for every checked field the profile does not cover."""
    want = step.to_dict()
    names = list(CHECKED)
    if want["prefill_policy"] == "mixed" and fitted.get("prefill_policy") == "mixed":
        names.append("max_batched_tokens")
    out = []
    for n in names:
        have = fitted.get(n)
        if have is None:
            continue
        covered = want[n] in have if isinstance(have, list) else want[n] == have
        if not covered:
            out.append(f"{n}: {want[n]} vs {have}")
    return out


class StepMismatchError(ValueError):
    """A profile fitted on another step than the one to predict (plan exits 2 with this message)."""


def check(profile: Any, step: ServedStep) -> None:
    """Raise StepMismatchError when `profile` was fitted on another step than `step` (the one simulated)."""
    if profile.engine.startswith("reference"):
        return  # another engine's rates transferred onto our step's costs: an assumption plan prints, not a fit
    fitted, source = profile_step(profile)
    if fitted is None:
        return
    diff = differences(fitted, step)
    if diff:
        raise StepMismatchError(
            f"profile {profile.device} was fitted on another step than the one simulated ({step.describe()}): "
            f"{'; '.join(diff)} (simulated vs fitted, from {source}). Fit a profile on the served step: "
            f"`{FIT_SERVED}` on the step plan simulates, then `g4bench plan --profile PATH`"
        )
