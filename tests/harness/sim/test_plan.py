"""Engine-steps records → a decode + prefill profile (calibrate), and `g4bench plan --validate` on a
"measured" run that is itself a simulation: re-simulating it with the same profile must give
predicted ÷ measured = 1 in every cell."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from harness.calibrate.steptime import COEFFS, Profile, StepModel

TRUTH = {
    "decode": StepModel(dict(zip(COEFFS, (2.0, 20.0, 5000.0, 60.0, 40000.0), strict=True)), 2.0),
    "prefill": StepModel(dict(zip(COEFFS, (4.0, 25.0, 4000.0, 80.0, 30000.0), strict=True)), 3.0),
}


def _engine_steps_run(root, name, slots, max_lens, noise=0.01):
    """An engine-steps folder whose steps follow TRUTH (what `g4bench engine-steps` writes)."""
    from g4bench.engine.engine_config import EngineConfig
    from harness.calibrate.engine_steps import KIND, cost_of
    from harness.calibrate.steptime import features_of, predict_ms
    from harness.env import host_env, merge_device
    from harness.results import append_record, make_record

    run = root / name
    run.mkdir()
    env = merge_device(
        host_env({}, git_rev="abc"), {"platform": "cpu", "device_kind": "cpu", "device_count": 1}
    )
    rng = np.random.default_rng(len(name))
    for max_len in max_lens:
        ecfg = EngineConfig(max_slots=1, max_len=max_len)
        for s in slots:
            for k in ecfg.kv_buckets:
                shapes = [("decode", s, 1)] + [("prefill", 1, c) for c in ecfg.chunk_buckets if c <= k]
                for program, rows, tokens in shapes:
                    cfg = {"model": "small", "layers": "f32", "ple": "bf16", "embed": "f32", "kv_dtype": "bf16",
                           "sliding_kv": "ring", "kv_layout": "paged", "chunk_size": 256, "max_slots": s,
                           "max_len": max_len, "program": program, "rows": rows, "tokens": tokens, "kv_len": k}  # fmt: skip
                    m = TRUTH[program]
                    feats = {a: np.array([b]) for a, b in features_of(cost_of(cfg)).items()}
                    ms = float(predict_ms([m.coef[n] for n in COEFFS], m.overlap_p, feats)[0])
                    name_ = f"{program}/slots{s}/len{max_len}/T{tokens}/kv{k}"
                    append_record(run, make_record(KIND, name_, run_id=name, env=env, config=cfg,
                                                   step_ms_median=ms * (1 + rng.normal(0, noise))))  # fmt: skip
    return run


def test_calibrate_fits_decode_and_prefill_from_engine_steps(tmp_path):
    from rich.console import Console

    from harness.calibrate.main import load_profile, run_calibrate

    fit = _engine_steps_run(tmp_path, "fit", (1, 8), (512, 2048))
    hold = _engine_steps_run(tmp_path, "hold", (4,), (1024,))
    out = tmp_path / "cpu-engine.toml"
    prof, _, _ = run_calibrate([fit], [hold], reference=False, device="cpu-dev", out=out,
                               console=Console(quiet=True))  # fmt: skip
    assert set(prof.programs) == {"decode", "prefill"}
    for program in ("decode", "prefill"):
        v = load_profile(out).model(program).validation
        assert v["n_holdout"] > 0 and v["holdout_median_abs_pct"] < 5.0


def test_plan_validate_a_simulated_run_against_itself(tmp_path):
    from g4bench.cli import app
    from harness.calibrate.main import point_rows, write_profile
    from harness.env import host_env, merge_device
    from harness.load.report import write_run
    from harness.load.runner import LoadConfig
    from harness.load.slo import SLO
    from harness.load.workloads import WorkloadConfig
    from harness.sim.planner import resolve_target
    from harness.sim.simulate import ServerShape, simulate

    profile = tmp_path / "dev.toml"
    write_profile(profile, Profile("dev", "g4bench", TRUTH, {"runs": ["synthetic"]}), {p: [] for p in TRUTH})
    assert point_rows(TRUTH["decode"], []) == []
    target = resolve_target("local", str(profile), "small")
    shape = ServerShape(model="small", max_slots=4, max_len=256)
    wl = WorkloadConfig(kind="agent", input_len=40, output_len=6, turns=3, tool_result_tokens=10)
    cfg = LoadConfig(
        base_url="simulated", workload=wl, concurrencies=[1, 4], num_tasks=4, slo=SLO(ttft_ms=500.0)
    )
    result, _ = simulate(cfg, shape, target.pricer_for(shape))
    measured = tmp_path / "measured"
    server = {"self_started": True, "model": "small", "max_slots": 4, "max_len": 256}
    env = merge_device(
        host_env({}, git_rev="abc"), {"platform": "cpu", "device_kind": "cpu", "device_count": 1}
    )
    write_run(
        result, measured, {"run_id": "m", "argv": [], "model_name": "small", "server": server, "env": env}
    )

    out = tmp_path / "plan"
    res = CliRunner().invoke(
        app, ["plan", "--validate", str(measured), "--profile", str(profile), "--out", str(out)]
    )
    assert res.exit_code == 0, res.output
    doc = json.loads((out / "validation.json").read_text())
    rows = doc["runs"][0]["rows"]
    assert {r["concurrency"] for r in rows} == {1, 4}
    assert all(r["ratio"] == pytest.approx(1.0) for r in rows)
    assert doc["headline"]["cells"] == 6 and doc["headline"]["max_abs_error_pct"] == pytest.approx(
        0.0, abs=1e-9
    )
    assert (out / "plots" / "validation.png").is_file()


def test_plan_refuses_a_url_run(tmp_path):
    from g4bench.cli import app

    run = tmp_path / "remote"
    run.mkdir()
    (run / "summary.json").write_text(
        json.dumps({"run": {"server": {"self_started": False}, "workload": {}}, "levels": []})
    )
    res = CliRunner().invoke(app, ["plan", "--validate", str(run), "--out", str(tmp_path / "o")])
    assert res.exit_code == 2 and "cannot rebuild" in res.output


def test_error_band_line_names_every_program_the_served_step_calls():
    """The v6e profile fits decode and prefill only: its band line says the mixed step is priced
    with the prefill rates and carries no validated band; the local profile's quotes its own."""
    from harness.sim.planner import resolve_target

    v6e = next(a for a in resolve_target("tpu-v6e").assumptions if "error band" in a)
    assert "decode: ±" in v6e and "prefill: ±" in v6e
    assert "mixed: no mixed fit, priced with the [prefill] rates, no validated band" in v6e
    local = next(a for a in resolve_target("local", model="small").assumptions if "error band" in a)
    assert "mixed: ±" in local and "no mixed fit" not in local


def test_capacity_overheads_read_the_served_layouts_donated_ceilings(tmp_path):
    """plan --capacity: each (KV dtype, sliding KV) gets its compiled ceiling's non-KV bytes; copying
    or contiguous ceilings, other targets and probes are not used; a run without one is refused."""
    import json

    import pytest

    from harness.sim.planner import capacity_overheads, resolve_target

    target = resolve_target("tpu-v6e")

    def ceiling(kv, sliding, layout="paged", donate=True, tgt="tpu-v6e", peak=40, kv_bytes=30):
        cfg = {"target": tgt, "kv_dtype": kv, "sliding_kv": sliding, "donate": donate, "program": "decode"}
        if layout != "contiguous":
            cfg["kv_layout"] = layout
        return {"record": "ceiling", "config": cfg, "max_batch": 7, "peak_bytes": peak * 2**30,
                "kv_bytes": kv_bytes * 2**30, "attention": "pallas-paged"}  # fmt: skip

    rows = [ceiling("bf16", "full"), ceiling("int8", "ring", peak=39), ceiling("bf16", "ring", layout="contiguous"),
            ceiling("bf16", "ring", donate=False), ceiling("bf16", "ring", tgt="tpu-v5e"),
            {"record": "probe", "config": {"target": "tpu-v6e"}}]  # fmt: skip
    (tmp_path / "results.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    got = capacity_overheads(tmp_path, target)
    assert set(got) == {("bf16", "full"), ("int8", "ring")}
    assert got[("bf16", "full")][0] == 10 * 2**30 and got[("int8", "ring")][0] == 9 * 2**30
    assert "7-row ceiling, attention pallas-paged" in got[("bf16", "full")][1]
    (tmp_path / "results.jsonl").write_text(json.dumps(rows[2]) + "\n")
    with pytest.raises(ValueError, match="no donated paged decode ceiling compiled for tpu-v6e"):
        capacity_overheads(tmp_path, target)
    with pytest.raises(ValueError, match="no results.jsonl"):
        capacity_overheads(tmp_path / "missing", target)
