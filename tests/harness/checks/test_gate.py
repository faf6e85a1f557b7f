"""harness.checks.gate and `g4bench gate`: a synthetic 20% slowdown fails (exit 1), a rerun with fresh
noise passes (exit 0), unusable input exits 2. Run folders are built with the real record path
(measurement_record → ratio_records → append_record) from seeded synthetic samples."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from g4bench.cli import app
from harness.checks.gate import GateError, MetricSpec, gate_records, parse_floor
from harness.env import host_env, merge_device
from harness.results import append_record, make_record, read_records
from harness.revalidate.main import Point, SweepConfig, SweepSettings
from harness.revalidate.records import measurement_record as _measurement_record
from harness.revalidate.verdicts import ratio_records

SETTINGS = SweepSettings(model="tiny-a", batches=(8,), ctxs=(512,), rounds=1, samples=15, warmup=3)


def measurement_record(cfg: SweepConfig, settings: SweepSettings, result: dict, **kw) -> dict:
    """One round's child result as a revalidate record (the sweep passes one result per round)."""
    case = {**cfg.case, "model": settings.model, "batch": settings.batches[0], "ctx": settings.ctxs[0]}
    return _measurement_record(Point(cfg.name, case), [result], settings, **kw)


ENV = merge_device(
    host_env(SETTINGS.identity(), git_rev="abc1234"),
    {"platform": "cpu", "device_kind": "cpu", "device_count": 1},
)
BASE_MS = {
    (kv, donate): ms
    for kv, donate, ms in [
        ("bf16", False, 20.0),
        ("bf16", True, 12.0),
        ("int8", False, 14.0),
        ("int8", True, 10.0),
    ]
}


def write_run(
    path, *, seed: int, scale=lambda kv, donate: 1.0, noise: float = 0.003, fail: str | None = None
):
    """A run folder of 4 configurations with 15 samples each (relative spread `noise`)."""
    path.mkdir(parents=True)
    rng = np.random.default_rng(seed)
    measurements = []
    for (kv, donate), ms in BASE_MS.items():
        name = f"ple-bf16/kv-{kv}/{'donated' if donate else 'copying'}"
        cfg = SweepConfig(
            name, {"layers": "w4a16", "ple": "bf16", "kv_dtype": kv, "donate": donate, "sliding_kv": "full"}
        )
        samples = list(ms * scale(kv, donate) * (1 + rng.normal(0, noise, 15)))
        if name == fail:
            result = {
                "failure": {"kind": "oom", "detail": "killed", "stderr_tail": "", "returncode": -9},
                "wall_s": 1.0,
            }
        else:
            result = {
                "step_ms_samples": samples,
                "compile_s": 1.0,
                "weights_bytes": 10,
                "kv_bytes": 5,
                "wall_s": 2.0,
            }
        measurements.append(measurement_record(cfg, SETTINGS, result, run_id=path.name, base_env=ENV))
    for rec in [*measurements, *ratio_records(measurements, run_id=path.name, base_env=ENV)]:
        append_record(path, rec)
    return path


@pytest.fixture
def baseline(tmp_path):
    return write_run(tmp_path / "baseline", seed=0)


def invoke(*args):
    return CliRunner().invoke(app, ["gate", *map(str, args)])


def test_identical_rerun_passes(tmp_path, baseline):
    rerun = write_run(tmp_path / "rerun", seed=1)
    res = invoke(rerun, "--baseline", baseline)
    assert res.exit_code == 0, res.output
    report = gate_records(read_records(baseline), read_records(rerun))
    assert not report.regressions
    assert {r.metric for r in report.rows} == {"step_ms_median", "agg_tok_per_s", "ratio"}


def test_twenty_percent_slowdown_is_caught(tmp_path, baseline):
    slow = write_run(tmp_path / "slow", seed=1, scale=lambda kv, donate: 1.2)
    res = invoke(slow, "--baseline", baseline)
    assert res.exit_code == 1, res.output
    report = gate_records(read_records(baseline), read_records(slow))
    bad = {(r.name, r.metric) for r in report.regressions}
    assert ("ple-bf16/kv-bf16/donated", "step_ms_median") in bad
    assert ("ple-bf16/kv-bf16/donated", "agg_tok_per_s") in bad
    assert not any(r.kind == "ratio" for r in report.regressions)  # a uniform slowdown keeps every ratio
    # ...so a ratios-only gate (what CI on a different machine uses) passes it
    assert invoke(slow, "--baseline", baseline, "--ratios-only").exit_code == 0


def test_ratio_regression_caught_with_ratios_only(tmp_path, baseline):
    # donation got 20% less effective: donated configurations 20% slower, copying unchanged
    worse = write_run(tmp_path / "worse", seed=2, scale=lambda kv, donate: 1.2 if donate else 1.0)
    res = invoke(worse, "--baseline", baseline, "--ratios-only")
    assert res.exit_code == 1, res.output
    report = gate_records(read_records(baseline), read_records(worse), ratios_only=True)
    assert {r.name for r in report.regressions} >= {"donation/ple-bf16/kv-bf16", "donation/ple-bf16/kv-int8"}


def test_floor_and_noise_protect_small_or_noisy_changes(tmp_path, baseline):
    small = write_run(tmp_path / "small", seed=3, scale=lambda kv, donate: 1.03)  # real but below 5%
    report = gate_records(read_records(baseline), read_records(small))
    assert not report.regressions
    assert any(r.status == "below floor" for r in report.rows)
    assert gate_records(read_records(baseline), read_records(small), floor=0.01).regressions
    # A 20% slowdown under 15% sample noise: the medians' 95% CIs (15 samples) still separate, so
    # the gate sees it (the old 2×IQR rule, ±~40% here, would have called it noise); the within-run
    # ratios did not move (every configuration slowed alike), so --ratios-only passes.
    noisy = write_run(tmp_path / "noisy", seed=4, scale=lambda kv, donate: 1.2, noise=0.15)
    report = gate_records(read_records(baseline), read_records(noisy))
    assert [r for r in report.regressions if r.metric == "step_ms_median"]
    assert not gate_records(read_records(baseline), read_records(noisy), ratios_only=True).regressions
    # No true change under 40% noise: the wide intervals overlap, nothing is called a regression.
    wild = write_run(tmp_path / "wild", seed=5, noise=0.4)
    report = gate_records(read_records(baseline), read_records(wild))
    assert not report.regressions
    assert any(r.status == "within noise" for r in report.rows if r.metric == "step_ms_median")


def test_now_failing_configuration_is_a_regression(tmp_path, baseline):
    broken = write_run(tmp_path / "broken", seed=1, fail="ple-bf16/kv-int8/donated")
    assert invoke(broken, "--baseline", baseline).exit_code == 1
    assert invoke(broken, "--baseline", baseline, "--ratios-only").exit_code == 1  # its ratios are gone
    report = gate_records(read_records(baseline), read_records(broken), ratios_only=True)
    assert [(r.name, r.status) for r in report.regressions] == [
        ("ple-bf16/kv-int8/donated", "now fails: oom")
    ]


def test_unusable_input_exits_2(tmp_path, baseline):
    assert invoke(tmp_path / "missing", "--baseline", baseline).exit_code == 2
    empty = tmp_path / "empty"
    empty.mkdir()
    assert invoke(empty, "--baseline", baseline).exit_code == 2
    malformed = tmp_path / "malformed"
    malformed.mkdir()
    (malformed / "results.jsonl").write_text('{"kind": "revalidate", "name": "x"}\n')
    res = invoke(malformed, "--baseline", baseline)
    assert res.exit_code == 2
    assert "schema_version" in res.output
    other = tmp_path / "other"
    other.mkdir()
    append_record(other, make_record("serve-load", "agents-4", run_id="o", env=ENV, config={}))
    res = invoke(other, "--baseline", baseline)
    assert res.exit_code == 2 and "in common" in res.output
    assert invoke(baseline, "--baseline", baseline, "--floor", "lots").exit_code == 2


def test_different_settings_are_refused(tmp_path, baseline):
    shifted = write_run(tmp_path / "shifted", seed=1)
    lines = [json.loads(line) for line in (shifted / "results.jsonl").read_text().splitlines()]
    for rec in lines:
        rec["config"]["batch"] = 32
    (shifted / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    with pytest.raises(GateError, match="different settings"):
        gate_records(read_records(baseline), read_records(shifted))


def test_parse_floor():
    assert parse_floor("5%") == pytest.approx(0.05)
    assert parse_floor("0.05") == pytest.approx(0.05)
    assert parse_floor("5") == pytest.approx(0.05)
    with pytest.raises(GateError):
        parse_floor("150%")


def test_record_level_metric_directions():
    """Serve-load style records declare their own gated metrics and directions."""
    hints = {"ttft_ms_p50": {"direction": "lower", "noise_pct_field": "ttft_rel_iqr_pct"}}

    def rec(ttft):
        return make_record(
            "serve-load",
            "agents-4",
            run_id="r",
            env=ENV,
            config={"c": 4},
            ttft_ms_p50=ttft,
            ttft_rel_iqr_pct=1.0,
            gate_metrics=hints,
        )

    assert gate_records([rec(100.0)], [rec(130.0)]).regressions
    assert not gate_records([rec(100.0)], [rec(80.0)]).regressions
    assert MetricSpec("serve-load", "x", "lower").direction == "lower"


def test_zero_goodput_has_a_direction_not_a_ratio():
    """A CPU run against accelerator SLOs can have goodput 0: 0 vs 0 is unchanged, a fall to 0 is a
    regression, a rise from 0 an improvement (no ratio is formed), and a negative value is unusable."""
    hints = {"request_goodput": {"direction": "higher"}}

    def rec(goodput):
        return make_record("serve-load", "fixed-c8", run_id="r", env=ENV, config={"c": 8},
                           request_goodput=goodput, gate_metrics=hints)  # fmt: skip

    same = gate_records([rec(0.0)], [rec(0.0)])
    assert not same.regressions and [r.status for r in same.rows] == ["unchanged"]
    assert gate_records([rec(1.5)], [rec(0.0)]).regressions
    up = gate_records([rec(0.0)], [rec(1.5)])
    assert not up.regressions and up.rows[0].status == "improved" and up.rows[0].ratio is None
    with pytest.raises(GateError, match="negative"):
        gate_records([rec(-1.0)], [rec(1.0)])
