"""The record models, the schema generated from them, and the committed run folders they must read."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest

from harness.checks.gate import gate_runs
from harness.records import SCHEMA_PATH, SELECTORS, Failure, record_schema, schema_text
from harness.results import RecordError, make_record, read_records, validate_record

REFERENCE = Path(__file__).resolve().parents[2] / "results" / "reference"
REFERENCE_RUNS = sorted(p.parent for p in REFERENCE.glob("*/results.jsonl"))
ENV = {
    "g4bench_version": "0", "git_rev": None, "jax_version": None, "jaxlib_version": None, "platform": "cpu",
    "device_kind": "cpu", "host": "h", "config_hash": "0123456789abcdef", "timestamp_utc": "2026-01-01T00:00:00Z",
}  # fmt: skip


def _model_for(record: dict) -> str | None:
    """The model whose selector condition `record` meets first (mirrors the schema's if/then)."""
    for model, extra in SELECTORS:
        cond = {"if": {"properties": {"kind": {"const": model.model_fields["kind"].annotation.__args__[0]}}}}
        cond["if"]["properties"].update(extra.get("properties", {}))
        cond["if"]["required"] = ["kind", *extra.get("required", [])]
        if "not" in extra:
            cond["if"]["not"] = extra["not"]
        if jsonschema.Draft202012Validator(cond["if"]).is_valid(record):
            return model.__name__
    return None


def test_committed_schema_is_generated_from_the_models():
    assert SCHEMA_PATH.read_text(encoding="utf-8") == schema_text(), (
        "harness/schema/result.schema.json is stale: run `python -m harness.records`"
    )
    jsonschema.Draft202012Validator.check_schema(record_schema())


def test_every_record_kind_has_a_model():
    kinds = set(record_schema()["properties"]["kind"]["enum"])
    modelled = {m.model_fields["kind"].annotation.__args__[0] for m, _ in SELECTORS}
    assert modelled == kinds


@pytest.mark.parametrize("run", REFERENCE_RUNS, ids=lambda p: p.name)
def test_reference_runs_validate_against_their_models(run):
    records = read_records(run)  # validates each line against the generated schema
    assert records
    for rec in records:
        if "failure" in rec:
            Failure.model_validate(rec["failure"])
            continue
        name = _model_for(rec)
        assert name is not None, (rec["kind"], rec["name"])
        model = next(m for m, _ in SELECTORS if m.__name__ == name)
        model.model_validate(rec)  # pydantic agrees with the schema generated from it


def test_reference_runs_cover_the_measured_kinds():
    seen = {_model_for(r) for run in REFERENCE_RUNS for r in read_records(run) if "failure" not in r}
    assert {"RevalidateMeasurement", "Ratio", "RunSummary", "RooflineCalibration", "RooflineStep",
            "RooflineSlope", "RooflineBreakdown", "CapacityProbe", "CapacityCeiling",
            "CapacityAdmission"} <= seen  # fmt: skip


def test_gate_reads_the_reference_runs_against_themselves():
    for run in REFERENCE_RUNS:
        report = gate_runs(run, run)
        assert not report.regressions, run.name


@pytest.mark.parametrize(
    "kind,name,fields,where",
    [
        ("roofline", "decode/b1/ctx8", {"batch": 1}, "is a required property"),
        ("roofline", "kv-slope/b1", {"batch": 1, "pairs": []}, "is a required property"),
        ("capacity", "x/probe-b0", {"record": "probe", "batch": 0}, "batch"),
        ("capacity", "x", {"record": "ceiling", "max_batch": 3}, "is a required property"),
        ("ratio", "r", {"effect": "e"}, "is a required property"),
    ],
)
def test_kind_specific_fields_are_checked(kind, name, fields, where):
    rec = make_record(kind, name, run_id="r", env=ENV, config={}, **fields)
    with pytest.raises(RecordError, match=where):
        validate_record(json.loads(json.dumps(rec)))


def test_failed_probe_and_failed_step_need_only_common_fields():
    fail = {"kind": "oom", "detail": "killed", "stderr_tail": "", "returncode": -9}
    validate_record(make_record("capacity", "x/probe-b9", run_id="r", env=ENV, config={}, record="probe",
                                batch=9, failure=fail))  # fmt: skip
    validate_record(make_record("roofline", "decode/b1/ctx8", run_id="r", env=ENV, config={}, failure=fail))
    with pytest.raises(RecordError, match="failure"):
        validate_record(make_record("roofline", "decode/b1/ctx8", run_id="r", env=ENV, config={},
                                    failure={**fail, "extra": 1}))  # fmt: skip


def test_derived_records_never_carry_a_failure():
    ratio = next(r for run in REFERENCE_RUNS for r in read_records(run) if r["kind"] == "ratio")
    validate_record(ratio)
    with pytest.raises(RecordError, match="should not be valid"):
        validate_record(
            {**ratio, "failure": {"kind": "oom", "detail": "", "stderr_tail": "", "returncode": 1}}
        )
