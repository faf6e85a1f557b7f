"""Typed result records: one pydantic model per record kind, and the JSON Schema generated from them.

Every line of a run folder's results.jsonl is one of these models (field names carry the units:
``step_ms_median``, ``agg_tok_per_s``, ``weights_bytes``). The writers still build plain dicts
(harness/revalidate/records.py and verdicts.py, harness/roofline/main.py, harness/capacity/probes.py
and main.py, harness/load/report.py); harness/results.py validates each against harness/schema/result.schema.json,
which `record_schema` generates from the models below (`python -m harness.records` rewrites it;
tests/harness/test_records.py fails when the committed file is stale).

Which model a record must satisfy is chosen by `SELECTORS`: its ``kind``, and within a kind the
``name`` prefix (roofline) or the ``record`` field (capacity). A record with a ``failure`` block
(`Failure`: the child did not complete) carries only the common fields, except a capacity probe,
whose failure is its answer ("does not fit"). Models allow extra fields: a record may add context
(XLA figures, memory breakdowns) that no reader relies on.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field
from pydantic.json_schema import SkipJsonSchema, models_json_schema

from harness.results import SCHEMA_PATH

Kind = Literal["revalidate", "ratio", "summary", "roofline", "capacity", "serve-load", "engine-steps"]
FailureKind = Literal["oom", "timeout", "crash", "no_result"]
NonNeg = Annotated[float, Field(ge=0)]
Pos = Annotated[float, Field(gt=0)]
NonNegInt = Annotated[int, Field(ge=0)]
PosInt = Annotated[int, Field(ge=1)]
# `X | Omit = None`: the field may be left out, but when present it must be an X (never null).
Omit = SkipJsonSchema[None]


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow")


class Env(_Open):
    """Where and with what a record was measured (harness/env.py builds it)."""

    g4bench_version: str
    git_rev: str | None = Field(description="git rev-parse --short HEAD, plus -dirty; null outside git")
    jax_version: str | None
    jaxlib_version: str | None
    python_version: str | Omit = None
    os: str | Omit = None
    platform: str | None = Field(
        description="jax backend (cpu, tpu, gpu); null when the child never reported"
    )
    device_kind: str | None
    device_count: NonNegInt | None = None
    host: str
    config_hash: str = Field(pattern=r"^[0-9a-f]{16}$")
    timestamp_utc: str = Field(pattern=r"^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}Z$")


class Failure(BaseModel):
    """A measurement that did not complete: OOM, timeout, crash, or no result line (harness/isolate.py)."""

    model_config = ConfigDict(extra="forbid")

    kind: FailureKind
    detail: str
    stderr_tail: str
    returncode: int | None = Field(
        description="child exit status; negative = killed by that signal; null if unknown"
    )
    exception_type: str | Omit = Field(
        default=None, description="Python exception class, when the child reported one"
    )


class GateMetric(BaseModel):
    """A per-record override of one field the gate compares."""

    model_config = ConfigDict(extra="forbid")

    direction: Literal["lower", "higher"]
    noise_pct_field: str | Omit = None


class Record(_Open):
    """The fields every record has; a failure record has only these."""

    schema_version: Literal[1]
    kind: Kind
    name: str = Field(min_length=1, description="configuration name, unique per kind within a run; the gate matches runs by (kind, name)")  # fmt: skip
    run_id: str = Field(min_length=1)
    env: Env
    config: dict[str, Any] = Field(description="the parameters that define this measurement (model, formats, batch, ctx, ...)")  # fmt: skip
    failure: Failure | Omit = None
    wall_s: NonNeg | Omit = Field(default=None, description="child process wall time, start to exit")
    gate_metrics: dict[str, GateMetric] | Omit = None


class _DecodeStats(Record):
    """Pooled statistics of a decode step's timed samples, and what the step holds."""

    batch: PosInt
    ctx: PosInt
    step_ms_median: Pos
    step_ms_min: NonNeg
    step_ms_max: NonNeg
    step_ms_q1: NonNeg
    step_ms_q3: NonNeg
    step_rel_iqr_pct: NonNeg
    step_ms_samples: list[NonNeg] = Field(min_length=1)
    n_samples: PosInt
    agg_tok_per_s: NonNeg
    weights_bytes: NonNegInt
    kv_bytes: NonNegInt
    compile_s: NonNeg
    # bytes moved and FLOPs by part (g4bench/model/costs.py describe()); older runs lack them
    model_bytes: NonNegInt | Omit = None
    model_bytes_by_part: dict[str, NonNegInt] | Omit = None
    model_flops: NonNeg | Omit = None
    model_flops_by_part: dict[str, NonNeg] | Omit = None
    flop_per_byte: NonNeg | Omit = None
    streamed_weight_bytes: NonNegInt | Omit = None


class RevalidateMeasurement(_DecodeStats):
    """One grid point of `g4bench revalidate`, pooled over its rounds (one fresh child per round)."""

    kind: Literal["revalidate"]
    step_ms_iqr: NonNeg
    warmup: NonNegInt
    step_ms_ci95_lo: NonNeg | Omit = None
    step_ms_ci95_hi: NonNeg | Omit = None
    step_ci95_half_width_pct: NonNeg | Omit = None
    rounds: PosInt | Omit = None
    compile_s_by_round: list[NonNeg] | Omit = None
    step_ms_by_round: list[Annotated[list[NonNeg], Field(min_length=1)]] | Omit = Field(
        default=None, min_length=1
    )
    host_other_cores_by_round: list[list[NonNeg]] | Omit = None
    host_steal_frac_by_round: list[list[NonNeg]] | Omit = None
    host_mem_gbs_by_round: list[list[Pos]] | Omit = Field(
        default=None, description="GB/s of the memory bandwidth probe read after each sample's window"
    )
    minor_faults_by_round: list[list[NonNegInt]] | Omit = None
    contaminated_samples: NonNegInt | Omit = None
    cpus: list[int] | None = None
    visit_group: str | Omit = Field(
        default=None, description="the visit group it was measured in: every member shares one process per round"
    )
    ci_method: Literal["pooled", "bootstrap"] | Omit = Field(
        default=None,
        description="pooled: the run's visit-to-visit noise pooled over its configurations "
        "(harness/revalidate/visit_noise.py); bootstrap: hierarchical bootstrap over this point's rounds and samples",
    )


class Ratio(Record):
    """A within-run comparison of two configurations (harness/revalidate/verdicts.py).

    ratio = median(numerator) / median(denominator) step time, so ratio > 1 means the denominator
    configuration is faster; with ``ci_method: "pooled"`` the ratio is the geometric mean over rounds of
    the per-round ratio of visit medians and ci95_lo/hi the block-design interval from the run's
    pooled visit noise (harness/revalidate/visit_noise.py), with "pooled+probe" that ratio adjusted to equal
    host memory bandwidth (the probe as the design's covariate); with "bootstrap" the ratio of
    pooled medians and a paired hierarchical bootstrap over rounds and samples;
    verdict faster | slower | equivalent | inconclusive (runs made before interleaved rounds carry the
    2×IQR rule's real | within noise); rule_2iqr = that rule; noise_pct = the larger relative IQR."""

    kind: Literal["ratio"]
    effect: str
    numerator: str
    denominator: str
    numerator_ms: Pos | Omit = None
    denominator_ms: Pos | Omit = None
    ratio: Pos
    noise_pct: NonNeg
    verdict: Literal["faster", "slower", "equivalent", "inconclusive", "real", "within noise"]
    direction: Literal["lower", "higher"] = Field(
        description="which way of `ratio` the gate treats as better"
    )
    ci95_lo: Pos | Omit = None
    ci95_hi: Pos | Omit = None
    floor_pct: NonNeg | Omit = None
    rounds: PosInt | Omit = None
    rounds_to_settle: PosInt | None = None
    contaminated_excluded: bool | Omit = None
    rule_2iqr: Literal["real", "within noise"] | Omit = None
    same_process: bool | Omit = Field(
        default=None, description="both sides measured in one process per round, their samples interleaved"
    )
    ci_method: Literal["pooled", "pooled+probe", "bootstrap"] | Omit = Field(
        default=None,
        description="pooled: the run's visit-to-visit noise pooled over its configurations; pooled+probe: "
        "the same with the memory bandwidth probe as a covariate (the ratio at equal host bandwidth; "
        "harness/revalidate/visit_noise.py); bootstrap: paired hierarchical bootstrap over rounds and samples",
    )


class RunSummary(Record):
    """Revalidate's run-level facts: was the host quiet, how wide the CIs are, the A/A rates."""

    kind: Literal["summary"]
    samples_total: NonNegInt
    contaminated_samples: NonNegInt
    contaminated_threshold_cores: NonNeg
    contaminated_threshold_steal: NonNeg | Omit = None
    host_quiet: bool = Field(description="CPU-quiet and, where the probe read, a steady memory bandwidth")
    host_cpu_quiet: bool | Omit = Field(default=None, description="≤ 5% of samples flagged busy by CPU time")
    median_ci95_half_width_pct: NonNeg | None
    host_mem_gbs_median: Pos | Omit = None
    host_mem_rel_iqr_pct: NonNeg | Omit = Field(
        default=None, description="spread of the memory bandwidth probe over the run (relative IQR)"
    )
    step_mem_corr: Annotated[float, Field(ge=-1, le=1)] | Omit = Field(
        default=None,
        description="Pearson r of each sample's log step time and log inverse probe bandwidth, both "
        "centred per configuration: how closely step times follow the host's memory bandwidth",
    )
    host_mem_steady: bool | Omit = None
    host_mem_steady_threshold_pct: NonNeg | Omit = None
    visit_noise_pct: NonNeg | Omit = Field(
        default=None,
        description="sd (%) of a visit's log median step time after configuration and round effects, pooled "
        "over the run's configurations measured in their own processes (harness/revalidate/visit_noise.py)",
    )
    visit_noise_df: PosInt | Omit = None
    visit_noise_before_probe_pct: NonNeg | Omit = Field(
        default=None,
        description="the pooled visit noise (%) without the memory bandwidth probe as its covariate, where "
        "the visits read the probe (visit_noise_pct is then the noise after it, if probe_used)",
    )
    probe_slope: float | Omit = Field(
        default=None, description="d log(step) / d log(probe GB/s) within configurations and rounds"
    )
    probe_corr: Annotated[float, Field(ge=-1, le=1)] | Omit = None
    probe_config_effect_p: Annotated[float, Field(ge=0, le=1)] | Omit = Field(
        default=None, description="F test's p that the configurations moved the probe (then it is not used)"
    )
    probe_used: bool | Omit = None
    detectable_effect_pct: NonNeg | Omit = Field(
        default=None, description="the smallest speedup (%) this run calls faster with 80% probability at its noise"
    )
    target_effect_pct: NonNeg | Omit = None
    rounds_for_target_effect: PosInt | None = Field(
        default=None, description="rounds (in all) a target_effect_pct speedup would need for 80% power"
    )
    target_median_half_width_pct: NonNeg | Omit = None
    rounds_for_target_median: PosInt | None = Field(
        default=None, description="rounds (in all) for a configuration median's 95% CI of ± that half-width"
    )
    round_wall_s: NonNeg | Omit = Field(default=None, description="wall time of one round, on average")
    rounds_done: PosInt | Omit = Field(
        default=None, description="rounds measured (a time budget may take more than the minimum `rounds`)"
    )
    verdict_counts: dict[str, NonNegInt]
    aa_comparisons: NonNegInt | Omit = None
    aa_false_positives: NonNegInt | Omit = None
    aa_false_positive_rate: NonNeg | Omit = None
    aa_ci_excludes_one: NonNegInt | Omit = None
    aa_rule_2iqr_real: NonNegInt | Omit = None


class RooflineCalibration(Record):
    """The device's calibrated streaming (read) bandwidth: the best reduction kernel, and every kernel."""

    kind: Literal["roofline"]
    calibrated_gb_per_s: Pos
    calibration_kernel: str
    calibration_buffer_bytes: NonNegInt
    calibration_kernels: list[dict[str, Any]]
    device_memory_bytes: NonNegInt


class RooflineStep(_DecodeStats):
    """One decode shape against the byte model (costs.py) and the calibrated bandwidth."""

    kind: Literal["roofline"]
    model_bytes: NonNegInt
    model_bytes_by_part: dict[str, NonNegInt]
    achieved_gb_per_s: NonNeg
    xla_bytes_accessed: float | None = None
    xla_flops: float | None = None
    xla_over_model_bytes: float | None = None
    xla_scope: str | Omit = None
    calibrated_gb_per_s: Pos | Omit = None
    fraction_of_calibrated: NonNeg | Omit = None


class SlopePair(BaseModel):
    ctx_from: PosInt
    ctx_to: PosInt
    time_rise_pct: float
    used: bool
    gb_per_s: float | None


class RooflineSlope(Record):
    """The marginal KV bandwidth at one batch, from adjacent contexts whose step time rose enough."""

    kind: Literal["roofline"]
    batch: PosInt
    pairs: list[SlopePair]
    min_rise_pct: NonNeg
    marginal_kv_gb_per_s: float | None
    intercept_ms: float | None
    slope_note: str


class RooflineBreakdown(Record):
    """The step's parts timed alone and multiplied out, against the whole step."""

    kind: Literal["roofline"]
    parts: list[dict[str, Any]]
    parts_ms_total: NonNeg
    step_ms_median: Pos | Omit = None
    rest_ms: float | Omit = None
    rest_note: str | Omit = None


class CapacityProbe(Record):
    """One bisection probe: a fresh child at one batch; `fits`, or a failure ("oom" = does not fit)."""

    kind: Literal["capacity"]
    record: Literal["probe"]
    batch: PosInt
    fits: bool | Omit = None
    compile_s: NonNeg | Omit = None
    peak_bytes: NonNegInt | Omit = None
    host_vm_peak_bytes: NonNegInt | Omit = None
    oom_required_bytes: NonNegInt | Omit = None
    oom_available_bytes: NonNegInt | Omit = None


class CapacityCeiling(Record):
    """A configuration's residency ceiling, with the memory breakdown and step time measured at it."""

    kind: Literal["capacity"]
    record: Literal["ceiling"]
    max_batch: NonNegInt
    bracket_hi: NonNegInt | None
    n_probes: NonNegInt
    probes: list[tuple[int, bool]]
    limit_bytes: NonNegInt
    kv_tokens: NonNegInt
    per_seq_kv_bytes: NonNegInt
    step_ms_median: NonNeg | Omit = None
    model_bytes: NonNegInt | Omit = None
    roofline_step_ms: NonNeg | Omit = None
    predicted_max_batch: NonNegInt | Omit = None
    prediction_error: str | Omit = None


class CapacityLatency(Record):
    """A ceiling read against a TPOT objective (harness/capacity/latency.py)."""

    kind: Literal["capacity"]
    record: Literal["latency"]
    memory_ceiling: NonNegInt
    step_ms_at_memory: NonNeg | None
    tok_per_s: NonNeg | None
    usd_per_m_tokens: NonNeg | None


class CapacityAdmission(Record):
    """Whether N agents at a context fit under a ceiling's memory (harness/capacity/admission.py)."""

    kind: Literal["capacity"]
    record: Literal["admission"]
    fits: bool
    max_agents: NonNegInt
    need_bytes: NonNegInt
    row_bytes: NonNegInt
    overhead_bytes: NonNegInt
    overhead_source: str
    limit_bytes: NonNegInt
    headroom_bytes: int
    headroom_pct: float


class ServeLoadLevel(Record):
    """One concurrency level of `g4bench serve-load` (harness/load/report.py): scalars only."""

    kind: Literal["serve-load"]
    median_ttft_ms: NonNeg | None = None
    median_tpot_ms: NonNeg | None = None
    output_throughput: NonNeg | None = None
    request_goodput: NonNeg | None = None


class EngineStep(Record):
    """One engine call shape timed by `g4bench engine-steps` (harness/calibrate/engine_steps.py): the served
    engine's own prefill or decode call, the simulator's calibration input."""

    kind: Literal["engine-steps"]
    step_ms_median: NonNeg
    step_ms_samples: list[NonNeg] | Omit = None
    step_ms_q1: NonNeg | Omit = None
    step_ms_q3: NonNeg | Omit = None
    compile_s: NonNeg | Omit = None


# (model, JSON Schema condition beyond its kind) — the first condition a record meets picks its model.
_NOT_FAILED: dict[str, Any] = {"not": {"required": ["failure"]}}
SELECTORS: tuple[tuple[type[Record], dict[str, Any]], ...] = (
    (RevalidateMeasurement, _NOT_FAILED),
    (Ratio, {}),
    (RunSummary, {}),
    (RooflineCalibration, {"properties": {"name": {"const": "calibration"}}, **_NOT_FAILED}),
    (RooflineStep, {"properties": {"name": {"pattern": "^decode/"}}, **_NOT_FAILED}),
    (RooflineSlope, {"properties": {"name": {"pattern": "^kv-slope/"}}, **_NOT_FAILED}),
    (RooflineBreakdown, {"properties": {"name": {"pattern": "^breakdown/"}}, **_NOT_FAILED}),
    (CapacityProbe, {"properties": {"record": {"const": "probe"}}, "required": ["record"]}),
    (
        CapacityCeiling,
        {"properties": {"record": {"const": "ceiling"}}, "required": ["record"], **_NOT_FAILED},
    ),
    (CapacityLatency, {"properties": {"record": {"const": "latency"}}, "required": ["record"]}),
    (CapacityAdmission, {"properties": {"record": {"const": "admission"}}, "required": ["record"]}),
    (ServeLoadLevel, {}),
    (EngineStep, _NOT_FAILED),
)
NEVER_FAIL: tuple[str, ...] = ("ratio", "summary")  # derived records: computed, never measured


def _kind_of(model: type[Record]) -> str:
    (kind,) = model.model_fields["kind"].annotation.__args__  # type: ignore[union-attr]
    return str(kind)


def _condition(model: type[Record], extra: dict[str, Any]) -> dict[str, Any]:
    cond: dict[str, Any] = {"properties": {"kind": {"const": _kind_of(model)}}, "required": ["kind"]}
    cond["properties"].update(extra.get("properties", {}))
    cond["required"] += extra.get("required", [])
    if "not" in extra:
        cond["not"] = extra["not"]
    return cond


def _tidy(node: Any) -> Any:
    """Drop pydantic's generated titles and null defaults (noise in a hand-read schema)."""
    if isinstance(node, dict):
        out = {k: _tidy(v) for k, v in node.items() if not (k == "title" and isinstance(v, str))}
        if out.get("default", 0) is None:
            del out["default"]
        return out
    if isinstance(node, list):
        return [_tidy(v) for v in node]
    return node


def record_schema() -> dict[str, Any]:
    """The result-record JSON Schema (draft 2020-12): the common `Record` fields at the top, then
    one if/then per entry of `SELECTORS` pointing at that model's definition."""
    models: list[type[BaseModel]] = [Record, *(m for m, _ in SELECTORS)]
    _, top = models_json_schema([(m, "validation") for m in models], ref_template="#/$defs/{model}")
    defs = top["$defs"]
    common = defs[Record.__name__]
    rules: list[dict[str, Any]] = [{"if": _condition(m, extra), "then": {"$ref": f"#/$defs/{m.__name__}"}}
                                   for m, extra in SELECTORS]  # fmt: skip
    rules.append(
        {
            "if": {"properties": {"kind": {"enum": list(NEVER_FAIL)}}, "required": ["kind"]},
            "then": _NOT_FAILED,
        }
    )
    schema = {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": "https://g4bench.invalid/schema/result.schema.json",
        "title": "g4bench result record",
        "description": "GENERATED from harness/records.py (python -m harness.records); do not edit. "
        + " ".join((__doc__ or "").split("\n\n")[0].split()),
        "type": "object",
        "required": common["required"],
        "properties": common["properties"],
        "additionalProperties": True,
        "allOf": rules,
        "$defs": dict(sorted(defs.items())),
    }
    return _tidy(schema)


def schema_text() -> str:
    """`record_schema` as the committed file's text."""
    return json.dumps(record_schema(), indent=2, ensure_ascii=False) + "\n"


def write_schema(path: Path = SCHEMA_PATH) -> Path:
    """Regenerate harness/schema/result.schema.json from the models."""
    path.write_text(schema_text(), encoding="utf-8")
    return path


if __name__ == "__main__":
    print(write_schema())
