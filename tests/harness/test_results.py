"""harness.results / harness.env: records match the schema (success, failure, ratio), run folders
round-trip through results.jsonl and summary.csv, and malformed input is refused with a location."""

from __future__ import annotations

import json
import re

import pandas as pd
import pytest

from harness.env import config_hash, git_revision, host_env, merge_device
from harness.isolate import failure
from harness.results import (
    RecordError,
    RunError,
    append_record,
    create_run_dir,
    load_baseline,
    make_record,
    new_run_id,
    read_records,
    read_run,
    validate_record,
    write_command,
    write_summary,
)
from harness.revalidate.main import Point, SweepConfig, SweepSettings
from harness.revalidate.records import measurement_record as _measurement_record
from harness.revalidate.verdicts import ratio_records

ENV = merge_device(
    host_env({"x": 1}, git_rev="abc1234"), {"platform": "cpu", "device_kind": "cpu", "device_count": 1}
)
SETTINGS = SweepSettings(model="tiny-a", batches=(8,), ctxs=(512,), rounds=1, samples=5, warmup=1)


def measurement_record(cfg: SweepConfig, settings: SweepSettings, result: dict, **kw) -> dict:
    """One round's child result as a revalidate record (the sweep passes one result per round)."""
    case = {**cfg.case, "model": settings.model, "batch": settings.batches[0], "ctx": settings.ctxs[0]}
    return _measurement_record(Point(cfg.name, case), [result], settings, **kw)


def child_result(samples: list[float]) -> dict:
    return {
        "step_ms_samples": samples,
        "compile_s": 1.5,
        "weights_bytes": 1000,
        "kv_bytes": 200,
        "wall_s": 3.0,
        "device": {"platform": "cpu", "device_kind": "cpu", "device_count": 1},
    }


def cfg(ple="bf16", kv="bf16", donate=True) -> SweepConfig:
    name = f"ple-{ple}/kv-{kv}/{'donated' if donate else 'copying'}"
    return SweepConfig(
        name, {"layers": "w4a16", "ple": ple, "kv_dtype": kv, "donate": donate, "sliding_kv": "full"}
    )


def test_env_block_fields():
    env = host_env({"a": 1}, git_rev="abc1234")
    assert env["g4bench_version"]
    assert env["jax_version"] and env["jaxlib_version"]
    assert env["config_hash"] == config_hash({"a": 1}) != config_hash({"a": 2})
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", env["timestamp_utc"])
    assert env["platform"] is None  # the parent never imports jax; a child fills it in
    assert (
        merge_device(env, {"platform": "tpu", "device_kind": "TPU v6 lite"})["device_kind"] == "TPU v6 lite"
    )
    rev = git_revision()
    assert rev is None or re.fullmatch(r"([0-9a-f]{4,}|uncommitted)(-dirty)?", rev)


def test_success_failure_and_ratio_records_validate():
    ok = measurement_record(
        cfg(), SETTINGS, child_result([10.0, 10.2, 9.9, 10.1, 10.0]), run_id="r", base_env=ENV
    )
    validate_record(ok)
    assert ok["step_ms_median"] == 10.0
    assert ok["agg_tok_per_s"] == pytest.approx(8 * 1000 / 10.0)
    assert ok["step_ms_ci95_lo"] <= 10.0 <= ok["step_ms_ci95_hi"]
    assert ok["env"]["platform"] == "cpu"
    bad = measurement_record(
        cfg(donate=False),
        SETTINGS,
        {**failure("oom", "killed", "tail", -9), "wall_s": 1.0},
        run_id="r",
        base_env=ENV,
    )
    validate_record(bad)
    assert bad["failure"]["kind"] == "oom"
    slow = measurement_record(
        cfg(donate=False), SETTINGS, child_result([20.0, 20.1, 19.9, 20.0, 20.2]), run_id="r", base_env=ENV
    )
    (ratio,) = ratio_records([ok, slow, bad], run_id="r", base_env=ENV)
    validate_record(ratio)
    assert ratio["name"] == "donation/ple-bf16/kv-bf16"
    assert ratio["ratio"] == pytest.approx(2.0)
    assert ratio["verdict"] == "faster" and ratio["rule_2iqr"] == "real"
    assert ratio["ci95_lo"] > 1.9 and ratio["ci95_hi"] < 2.1


@pytest.mark.parametrize(
    "mutate,where",
    [
        (lambda r: r.pop("step_ms_median"), "step_ms_median"),
        (lambda r: r.update(kind="bogus"), "kind"),
        (lambda r: r["env"].update(config_hash="xyz"), "env/config_hash"),
        (lambda r: r.update(step_ms_median=-1.0), "step_ms_median"),
        (
            lambda r: r.update(
                failure={"kind": "exploded", "detail": "", "stderr_tail": "", "returncode": 1}
            ),
            "failure/kind",
        ),
    ],
)
def test_schema_rejects_with_location(mutate, where):
    rec = measurement_record(cfg(), SETTINGS, child_result([1.0, 2.0, 3.0]), run_id="r", base_env=ENV)
    rec = json.loads(json.dumps(rec))
    mutate(rec)
    with pytest.raises(RecordError, match=where.split("/")[0]):
        validate_record(rec)


def test_other_kinds_need_only_common_fields():
    validate_record(make_record("serve-load", "agents-4", run_id="r", env=ENV, config={}, ttft_ms_p50=12.0))


def test_run_folder_round_trip(tmp_path):
    run = create_run_dir(tmp_path, "revalidate smoke")
    assert re.fullmatch(r"\d{8}T\d{6}Z-revalidate-smoke", run.name)
    assert create_run_dir(tmp_path, "revalidate smoke") != run  # never reused
    recs = [
        measurement_record(
            cfg(donate=d),
            SETTINGS,
            child_result([10.0 + d, 10.1 + d, 10.2 + d]),
            run_id=run.name,
            base_env=ENV,
        )
        for d in (False, True)
    ]
    for r in recs:
        append_record(run, r)
    assert read_records(run) == recs
    write_command(run, ["g4bench", "revalidate", "--config", "ple-bf16/*"])
    assert (run / "command.txt").read_text() == "g4bench revalidate --config 'ple-bf16/*'\n"
    csv = write_summary(run)
    frame = pd.read_csv(csv)
    assert list(frame["name"]) == [r["name"] for r in recs]
    assert "config.ple" in frame.columns and "step_ms_median" in frame.columns
    assert "env" not in frame.columns and "step_ms_samples" not in frame.columns
    assert read_run(run)["step_ms_median"].tolist() == [r["step_ms_median"] for r in recs]


def test_append_refuses_invalid_record(tmp_path):
    with pytest.raises(RecordError):
        append_record(tmp_path, {"kind": "revalidate"})
    assert not (tmp_path / "results.jsonl").exists()


def test_read_records_errors(tmp_path):
    with pytest.raises(RunError, match="not found"):
        read_records(tmp_path)
    (tmp_path / "results.jsonl").write_text('{"kind": "revalidate"}\nnot json\n')
    with pytest.raises(RunError, match=r"results.jsonl:1"):
        read_records(tmp_path)
    with pytest.raises(RunError, match=r"results.jsonl:2: not JSON"):
        read_records(tmp_path, validate=False)


def test_new_run_id_slug():
    assert new_run_id("a b/c").endswith("-a-b-c")


def test_baselines_are_labelled_with_their_device():
    sweep = load_baseline("vllm-sweep-v6e1")
    assert set(sweep["device"]) == {"TPU v6e-1 (ct6e-standard-1t)"}
    e2b = sweep[(sweep["model"] == "google/gemma-4-E2B-it") & (sweep["ctx"] == 8192)]
    assert dict(zip(e2b["concurrency"], e2b["output_tok_per_s"], strict=True))[1] == pytest.approx(182.6)
    assert len(sweep) == 273 and (sweep["status"] == "skip").sum() == 28
    reval = load_baseline("jax-reference-revalidate-v6e1")
    assert len(reval) == 12
    row = reval[reval["name"] == "ple-bf16/kv-bf16/copying"].iloc[0]
    assert (row["step_ms_median"], row["reference_config"]) == (21.262, "ple-bf16/kv-bf16/nodonate")
    report = load_baseline("vllm-e2b-report-v6e1")
    assert report["concurrency"].tolist() == [1, 8, 32, 64, 100]
    with pytest.raises(FileNotFoundError, match="available"):
        load_baseline("nope")
