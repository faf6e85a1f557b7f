"""`g4bench revalidate` end to end with fake children (no engine needed).

The fake child (tests/harness/revalidate/fakes.py, run in a fresh process via
G4BENCH_REVALIDATE_CHILD; the `fake_env` fixture in conftest.py sets it up) builds a `FakeBench` per
point whose step advances a fake clock by a known time and goes through the real timing code, so no
assertion depends on the machine's speed; in "mixed" mode some configurations exhaust memory, hang
or crash. Tests assert the failure records, that the sweep went on, and that --resume reruns only
what failed.
"""

from __future__ import annotations

import json
import time
from typing import Any

import numpy as np
import pytest

from harness.results import read_records
from harness.revalidate.main import (
    CPU_DEFAULTS,
    RevalidateError,
    SweepSettings,
    load_sweep,
    resolve_settings,
    select_configs,
    sweep_points,
)
from harness.timing import time_steps
from tests.harness.revalidate.fakes import FakeBench, FakeClock, invoke, ran

# ---------------------------------------------------------------------------------------- units


def test_grid_is_the_twelve_configurations():
    configs = load_sweep()
    assert len(configs) == 12
    assert {c.case["layers"] for c in configs} == {"w4a16"}
    assert {(c.case["ple"], c.case["kv_dtype"], c.case["donate"]) for c in configs} == {
        (p, k, d) for p in ("bf16", "int8", "int4") for k in ("bf16", "int8") for d in (False, True)
    }
    assert [c.name for c in select_configs(configs, ["ple-bf16/kv-bf16/*"])] == [
        "ple-bf16/kv-bf16/copying",
        "ple-bf16/kv-bf16/donated",
    ]
    with pytest.raises(RevalidateError, match="no configuration matches"):
        select_configs(configs, ["ple-int2/*"])


def test_timing_excludes_input_building(monkeypatch):
    import harness.timing

    clock = FakeClock()
    monkeypatch.setattr(harness.timing, "perf_counter", clock)
    bench = FakeBench(step_ms=2.0, inputs_ms=30.0, clock=clock, jitter=0.0)
    timed = time_steps(bench, samples=5, warmup=2)
    assert bench.steps == 7
    assert len(timed["step_ms"]) == len(timed["other_cores"]) == 5
    assert timed["step_ms"] == pytest.approx([2.0] * 5)  # the 30 ms of fresh_inputs is outside the timing


class CarryBench(FakeBench):
    """A bench with the warm-buffer protocol: `advance` returns the next state."""

    def __init__(self, step_ms: float):
        super().__init__(step_ms)
        self.fresh = 0

    def fresh_inputs(self):
        self.fresh += 1
        return ("cache", 0)

    def advance(self, state):
        self.steps += 1
        time.sleep(self.step_ms / 1e3)
        return (state[0], state[1] + 1)


def test_warm_buffers_allocate_once_and_carry_the_state():
    bench = CarryBench(step_ms=1.0)
    timed = time_steps(bench, samples=6, warmup=2)
    assert bench.fresh == 1 and bench.steps == 8  # one allocation, then the state is carried
    assert len(timed["step_ms"]) == 6


class CountingProbe:
    """A MemoryProbe stand-in: reads 10, 11, 12, ... GB/s and counts its reads."""

    def __init__(self) -> None:
        self.reads = 0

    def read_gbs(self) -> float:
        self.reads += 1
        return 9.0 + self.reads


def test_memory_probe_reads_once_per_window_outside_the_steps(monkeypatch):
    import harness.timing
    from harness.timing import time_interleaved

    clock = FakeClock()
    monkeypatch.setattr(harness.timing, "perf_counter", clock)
    bench = FakeBench(step_ms=200.0, clock=clock, jitter=0.0)  # windows of 0.5 s close every 3 steps
    probe = CountingProbe()
    (timed,) = time_interleaved([bench], samples=7, warmup=1, probe=probe)
    assert timed["step_ms"] == pytest.approx([200.0] * 7)  # the reads are not in any step's time
    assert probe.reads == 3  # windows of steps 1–3, 4–6 and the last one
    assert timed["mem_gbs"] == [10.0] * 3 + [11.0] * 3 + [12.0]


def test_real_memory_probe_reads_a_bandwidth():
    from harness.hostload import MemoryProbe

    probe = MemoryProbe(8 * 2**20)
    assert probe.nbytes == 8 * 2**20
    assert 0.05 < probe.read_gbs() < 10_000  # a plausible GB/s on any machine, however loaded
    with pytest.raises(ValueError, match="at least one float32"):
        MemoryProbe(2)


def test_summary_says_how_closely_steps_follow_the_memory_bandwidth():
    """Steps slowed exactly where the probe read less bandwidth correlate (r ≈ 1); the same steps
    against an unrelated probe do not; the configurations' own levels never count."""
    from harness.revalidate.records import memory_bandwidth_fields

    rng = np.random.default_rng(0)
    gbs = rng.uniform(8.0, 12.0, size=(3, 6))
    follows = [
        {"step_ms_by_round": (level * 10.0 / gbs).tolist(), "host_mem_gbs_by_round": gbs.tolist()}
        for level in (100.0, 300.0)  # two configurations far apart
    ]
    fields = memory_bandwidth_fields(follows)
    assert fields["step_mem_corr"] == pytest.approx(1.0)
    assert fields["host_mem_gbs_median"] == pytest.approx(float(np.median(gbs)))
    q1, q3 = np.quantile(np.tile(gbs.ravel(), 2), [0.25, 0.75])  # every configuration's readings
    assert fields["host_mem_rel_iqr_pct"] == pytest.approx(100 * (q3 - q1) / np.median(gbs))
    unrelated = [{**m, "host_mem_gbs_by_round": rng.uniform(8.0, 12.0, size=(3, 6)).tolist()} for m in follows]
    assert abs(memory_bandwidth_fields(unrelated)["step_mem_corr"]) < 0.5
    assert memory_bandwidth_fields([{"step_ms_by_round": [[1.0, 2.0]]}]) == {}  # no probe readings


def test_cpu_defaults_are_printed_with_reason():
    settings, note = resolve_settings(
        "cpu", model="e2b", batches=None, ctxs=None, rounds=None, samples=None, warmup=None
    )
    assert (settings.batches, settings.ctxs, settings.rounds, settings.samples, settings.warmup) == (
        (CPU_DEFAULTS.batch,),
        (CPU_DEFAULTS.ctx,),
        CPU_DEFAULTS.rounds,
        CPU_DEFAULTS.samples,
        CPU_DEFAULTS.warmup,
    )
    assert "15 minutes" in note and "rounds 3" in note
    assert settings.budget_s == CPU_DEFAULTS.budget_s == 900 and "at least 3, more until every comparison settles" in note and "within 15 min" in note
    assert settings.layers == "f32" and "do not fuse" in note
    assert settings.visit == "separate" and "1.35×" in note  # sharing a process biases copying steps
    shared, note = resolve_settings(
        "cpu", model="e2b", batches=[1], ctxs=[2], rounds=1, samples=3, warmup=0, layers="w4a16", visit="shared-weights"
    )
    assert shared.visit == "shared-weights" and "overstate" in note  # the caveat whenever it is chosen
    settings, note = resolve_settings(
        "tpu", model="e2b", batches=None, ctxs=None, rounds=None, samples=7, warmup=1
    )
    assert settings.layers is None
    assert (settings.batches, settings.ctxs, settings.samples, settings.rounds) == ((32,), (8192,), 7, 2)
    assert "batch 32, ctx 8192" in note and "samples" not in note
    assert settings.visit == "separate" and "fragmentation" in note
    _, note = resolve_settings(
        "cpu", model="e2b", batches=[1], ctxs=[2], rounds=1, samples=3, warmup=0, layers="w4a16", visit="separate"
    )
    assert note is None
    with pytest.raises(RevalidateError, match="--visit"):
        resolve_settings("cpu", model="e2b", batches=[1], ctxs=[2], rounds=1, samples=3, warmup=0, visit="pairs")


def test_time_budget_applies_only_where_rounds_were_left_to_it():
    def settle(platform, rounds, budget_s):
        return resolve_settings(platform, model="e2b", batches=[1], ctxs=[2], rounds=rounds, samples=3,
                                warmup=0, budget_s=budget_s)[0]  # fmt: skip

    assert settle("cpu", 4, None).budget_s is None  # --rounds N alone: exactly N
    assert settle("cpu", 4, 120.0).budget_s == 120.0  # at least 4, more within 2 minutes
    assert settle("cpu", None, 0.0).budget_s is None and settle("cpu", None, 0.0).rounds == 3
    assert settle("tpu", None, None).budget_s is None  # accelerators: the reference's fixed rounds
    with pytest.raises(RevalidateError, match="--budget-min"):
        settle("cpu", None, -60.0)


def test_points_cross_batches_and_contexts_and_aa_pairs():
    configs = select_configs(load_sweep(), ["ple-bf16/kv-bf16/*"])
    s = SweepSettings(model="tiny-a", batches=(1, 8), ctxs=(64, 128), rounds=1, samples=1, warmup=0)
    points = {p.name: p.case for p in sweep_points(configs, s)}
    # the default is the served step: paged blocks, ring sliding KV
    assert len(points) == 8 and "ple-bf16/kv-bf16/donated/paged/ring/b8/ctx128" in points
    assert {(c["kv_layout"], c["sliding_kv"]) for c in points.values()} == {("paged", "ring")}
    one = SweepSettings(model="tiny-a", batches=(2,), ctxs=(64,), rounds=1, samples=1, warmup=0, aa=3)
    aa = sweep_points(configs[:1], one)
    assert [p.name for p in aa] == ["aa00-A", "aa00-B", "aa01-A", "aa01-B", "aa02-A", "aa02-B"]
    assert all(p.case == aa[0].case for p in aa)
    with pytest.raises(RevalidateError, match="one configuration"):
        sweep_points(configs, one)


def test_kv_layouts_double_the_points_and_name_the_paged_ones():
    configs = select_configs(load_sweep(), ["ple-bf16/kv-bf16/donated"])
    s = SweepSettings(
        model="tiny-a", batches=(8, 32), ctxs=(64,), rounds=1, samples=1, warmup=0, kv_layouts=("contiguous", "paged")
    )
    points = {p.name: p.case for p in sweep_points(configs, s)}
    assert set(points) == {
        "ple-bf16/kv-bf16/donated/b8/ctx64",
        "ple-bf16/kv-bf16/donated/b32/ctx64",
        "ple-bf16/kv-bf16/donated/paged/ring/b8/ctx64",
        "ple-bf16/kv-bf16/donated/paged/ring/b32/ctx64",
    }
    assert "kv_layout" not in points["ple-bf16/kv-bf16/donated/b8/ctx64"]  # names and hashes as before
    assert points["ple-bf16/kv-bf16/donated/paged/ring/b8/ctx64"]["kv_layout"] == "paged"
    # without --sliding-kv each layout keeps its own default: the grid's full for contiguous (the
    # reference article's grid), the served ring for paged
    assert points["ple-bf16/kv-bf16/donated/b8/ctx64"]["sliding_kv"] == "full"
    assert points["ple-bf16/kv-bf16/donated/paged/ring/b8/ctx64"]["sliding_kv"] == "ring"


def test_sliding_kv_defaults_follow_the_layout_and_a_list_adds_a_dimension():
    configs = select_configs(load_sweep(), ["ple-bf16/kv-bf16/donated"])
    base = dict(model="tiny-a", batches=(8,), ctxs=(64,), rounds=1, samples=1, warmup=0)
    served = sweep_points(configs, SweepSettings(**base))
    assert [(p.name, p.case["sliding_kv"]) for p in served] == [("ple-bf16/kv-bf16/donated/paged/ring", "ring")]
    reference = sweep_points(configs, SweepSettings(**base, kv_layouts=("contiguous",)))
    assert [(p.name, p.case["sliding_kv"]) for p in reference] == [("ple-bf16/kv-bf16/donated", "full")]
    both = sweep_points(configs, SweepSettings(**base, sliding_kvs=("full", "ring")))
    assert [p.name for p in both] == ["ple-bf16/kv-bf16/donated/paged", "ple-bf16/kv-bf16/donated/paged/ring"]
    with pytest.raises(RevalidateError, match="--sliding-kv"):
        resolve_settings("cpu", model="tiny-a", batches=None, ctxs=None, rounds=1, samples=None, warmup=None,
                         sliding_kvs=("window",))  # fmt: skip


# ------------------------------------------------------------------------------------ end to end


def test_sweep_writes_run_folder_and_verdicts(fake_env):
    out = fake_env / "run"
    res = invoke(
        "--config", "ple-bf16/*", "--model", "tiny-a", "--batch", 8, "--ctx", 512,
        "--rounds", 2, "--samples", 5, "--warmup", 1, "--out", out, "--visit", "shared-weights",
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    records = read_records(out)
    meas = [r for r in records if r["kind"] == "revalidate"]
    # the default is the served step: each configuration's name says so
    configs = select_configs(load_sweep(), ["ple-bf16/*"])
    assert [r["name"] for r in meas] == [f"{c.name}/paged/ring" for c in configs]
    donated = next(r for r in meas if r["name"] == "ple-bf16/kv-bf16/donated/paged/ring")
    assert donated["step_ms_median"] == pytest.approx(12.0, rel=0.5)
    assert donated["rounds"] == 2 and [len(r) for r in donated["step_ms_by_round"]] == [5, 5]
    assert donated["step_ms_ci95_lo"] <= donated["step_ms_median"] <= donated["step_ms_ci95_hi"]
    assert donated["compile_s"] == 0.25 and donated["weights_bytes"] == 1234 and donated["kv_bytes"] == 567
    assert donated["config"]["model"] == "tiny-a" and donated["env"]["device_kind"] == "fake cpu"
    assert donated["agg_tok_per_s"] == pytest.approx(8000 / donated["step_ms_median"])
    assert donated["model_bytes"] > 0 and donated["model_bytes_by_part"]["kv_read"] > 0  # costs.py
    ratios = {r["name"]: r for r in records if r["kind"] == "ratio"}
    assert set(ratios) == {
        "donation/ple-bf16/kv-bf16/paged/ring",
        "donation/ple-bf16/kv-int8/paged/ring",
        "kv-int8/ple-bf16/copying/paged/ring",
        "kv-int8/ple-bf16/donated/paged/ring",
    }
    don = ratios["donation/ple-bf16/kv-bf16/paged/ring"]
    assert don["verdict"] == "faster" and don["rule_2iqr"] in ("real", "within noise")
    assert don["ratio"] == pytest.approx(2.0, rel=0.3) and don["ci95_lo"] > 1.0
    (summary,) = [r for r in records if r["kind"] == "summary"]
    assert summary["samples_total"] == 40 and summary["contaminated_samples"] == 0
    assert donated["host_mem_gbs_by_round"] == [[10.0] * 5] * 2  # a probe reading per sample
    assert summary["host_mem_gbs_median"] == pytest.approx(10.0) and summary["host_mem_steady"] and summary["host_quiet"]
    # every round visited all four points; logged as it happened
    visits = [json.loads(line) for line in (out / "visits.jsonl").read_text().splitlines()]
    assert sorted((v["round"], v["name"]) for v in visits) == sorted((r, m["name"]) for r in (0, 1) for m in meas)
    assert [v["round"] for v in visits] == [0] * 4 + [1] * 4
    for name in ("summary.csv", "command.txt", "env.json", "plots/step_time.png"):
        assert (out / name).is_file()
    assert (out / "command.txt").read_text().startswith("g4bench revalidate --config 'ple-bf16/*' --model tiny-a")
    env = json.loads((out / "env.json").read_text())
    assert env["settings"]["batches"] == [8] and env["settings"]["rounds"] == 2 and env["platform"] == "cpu"
    assert (out / "logs" / "tiny-a_f32_ple-bf16_b8_ctx512-r1.log").is_file()  # one process per round
    assert {r["visit_group"] for r in meas} == {"tiny-a/f32/ple-bf16/b8/ctx512"}
    assert all(r["same_process"] for r in ratios.values())
    assert "donation" in res.output and "faster" in res.output and "host quiet" in res.output
    assert "memory bandwidth probe" in res.output
    assert str(out) in res.output.replace("\n", "")
    tables = [line for line in res.output.splitlines() if str(fake_env) not in line]
    assert max(len(line) for line in tables) <= 80  # fits a log (only file paths may run longer)


@pytest.mark.parametrize("mode", ["hog", "steal"])
def test_contaminated_samples_are_flagged_and_left_out(fake_env, monkeypatch, mode):
    """A hog (or hypervisor steal) slows the donated points in round 2 only; its samples are flagged,
    dropped from the verdicts, and the donation effect keeps its sign and size."""
    monkeypatch.setenv("FAKE_MODE", mode)
    out = fake_env / "run"
    args = ["--config", "ple-bf16/*", "--rounds", 3, "--samples", 5, "--warmup", 0, "--out", out]
    res = invoke(*args, "--batch", 2, "--ctx", 64, "--kv-layout", "contiguous")
    assert res.exit_code == 0, res.output
    records = read_records(out)
    don = next(r for r in records if r["name"] == "ple-bf16/kv-bf16/donated")
    assert don["contaminated_samples"] == 3
    ratio = next(r for r in records if r["name"] == "donation/ple-bf16/kv-bf16")
    assert ratio["contaminated_excluded"] and ratio["verdict"] == "faster"
    assert ratio["ratio"] == pytest.approx(2.0, rel=0.3)
    (summary,) = [r for r in records if r["kind"] == "summary"]
    assert summary["contaminated_samples"] == 6 and not summary["host_quiet"]
    assert "NOT quiet" in res.output


def test_wandering_memory_bandwidth_means_the_host_was_not_quiet(fake_env, monkeypatch):
    """No sample is busy by CPU time, but the probe reads 8 and 12 GB/s in turn: NOT quiet, and why."""
    monkeypatch.setenv("FAKE_MODE", "bandwidth")
    out = fake_env / "run"
    args = ["--config", "ple-bf16/kv-bf16/*", "--rounds", 2, "--samples", 4, "--warmup", 0, "--out", out]
    res = invoke(*args, "--batch", 2, "--ctx", 64)
    assert res.exit_code == 0, res.output
    (summary,) = [r for r in read_records(out) if r["kind"] == "summary"]
    assert summary["contaminated_samples"] == 0 and summary["host_cpu_quiet"]
    assert summary["host_mem_rel_iqr_pct"] > 5.0 and not summary["host_mem_steady"] and not summary["host_quiet"]
    assert "NOT quiet" in res.output and "memory bandwidth wandered 40.0%" in " ".join(res.output.split())


class RoundClock:
    """The sweep's clock: every reading after the first is one 100 s round later."""

    def __init__(self) -> None:
        self.readings = 0

    def __call__(self) -> float:
        self.readings += 1
        return 100.0 * (self.readings - 1)


def test_rounds_are_added_while_another_fits_in_the_budget(fake_env, monkeypatch):
    """Rounds of 100 s and a 4-minute budget: after one round a second fits (200 s ≤ 240 s), after two a
    third does not (300 s), so 2 rounds in all; the records, the summary and the log say so; --resume
    adds none."""
    import harness.revalidate.sweep

    monkeypatch.setattr(harness.revalidate.sweep, "sweep_clock", RoundClock())
    out = fake_env / "run"
    args = ["--config", "ple-bf16/kv-bf16/*", "--samples", 3, "--warmup", 0, "--batch", 2, "--ctx", 64]
    res = invoke(*args, "--rounds", 1, "--budget-min", 4, "--out", out)
    assert res.exit_code == 0, res.output
    records = read_records(out)
    (summary,) = [r for r in records if r["kind"] == "summary"]
    assert summary["rounds_done"] == 2 and summary["config"]["rounds"] == 1
    assert all(r["rounds"] == 2 for r in records if r["kind"] == "revalidate")
    assert sorted({ln["round"] for ln in map(json.loads, (out / "visits.jsonl").read_text().splitlines())}) == [0, 1]
    text = " ".join(res.output.split())
    assert "r2/2+" in text and "while another fits in 4 min" in text and "stopped: time budget" in text
    (fake_env / "ran.txt").unlink()
    monkeypatch.setattr(harness.revalidate.sweep, "sweep_clock", RoundClock())
    assert invoke("--out", out, "--resume").exit_code == 0
    assert not (fake_env / "ran.txt").exists()  # a resumed run finishes its rounds and adds none


def _three_round_run(fake_env, monkeypatch, mode: str, config: str) -> tuple[Any, list[dict]]:
    """(the CLI result, the records) of a 3-round run of `config` on the fake host `mode`."""
    monkeypatch.setenv("FAKE_MODE", mode)
    out = fake_env / "run"
    args = ["--config", config, "--rounds", 3, "--samples", 4, "--warmup", 0, "--batch", 2, "--ctx", 64]
    res = invoke(*args, "--out", out)
    assert res.exit_code == 0, res.output
    return res, read_records(out)


def test_verdicts_pool_the_visit_noise_and_say_what_the_run_could_see(fake_env, monkeypatch):
    """Separate visits: every comparison's CI comes from the noise pooled over the run's points (4 points
    × 3 rounds: 6 df), the points' median CIs too, and the summary prints the power line."""
    res, records = _three_round_run(fake_env, monkeypatch, "procspeed", "ple-bf16/*")
    assert {r["ci_method"] for r in records if r["kind"] in ("ratio", "revalidate")} == {"pooled"}
    (summary,) = [r for r in records if r["kind"] == "summary"]
    assert summary["visit_noise_df"] == 6 and summary["visit_noise_pct"] > 5  # ±40% per process
    assert summary["detectable_effect_pct"] > 0 and summary["rounds_for_target_effect"] > 3
    text = " ".join(res.output.split())
    assert "visit-to-visit noise" in text and "1.10× would need" in text


def test_the_bandwidth_probe_takes_its_share_of_the_visit_noise(fake_env, monkeypatch):
    """Every process runs at the memory bandwidth it gets (7–13 GB/s), which the probe reads: the
    comparisons adjust for it (ci_method pooled+probe), the noise after it is a fraction of the noise
    before, the slope is −1, the points' own median CIs stay unadjusted, and the power line says so.
    6 points × 3 rounds: 10 df, 9 after the probe (PROBE_MIN_DF)."""
    res, records = _three_round_run(fake_env, monkeypatch, "procbandwidth", "*/kv-bf16/*")
    assert {r["ci_method"] for r in records if r["kind"] == "ratio"} == {"pooled+probe"}
    assert {r["ci_method"] for r in records if r["kind"] == "revalidate"} == {"pooled"}
    (summary,) = [r for r in records if r["kind"] == "summary"]
    assert summary["probe_used"] and summary["probe_slope"] == pytest.approx(-1.0, abs=0.15)
    assert summary["visit_noise_pct"] < summary["visit_noise_before_probe_pct"] / 2 and summary["visit_noise_df"] == 9
    donation = [r for r in records if r["kind"] == "ratio" and r["effect"] == "donation"]
    assert donation and all(r["verdict"] == "faster" for r in donation)  # 2× in STEP_MS
    assert "after the memory bandwidth probe took out its share" in " ".join(res.output.split())


def test_aa_run_reports_false_positive_rate(fake_env):
    out = fake_env / "run"
    res = invoke(
        "--config", "ple-bf16/kv-bf16/donated", "--aa", 4, "--rounds", 2, "--samples", 4,
        "--warmup", 0, "--batch", 2, "--ctx", 64, "--out", out,
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    records = read_records(out)
    aa = [r for r in records if r["kind"] == "ratio"]
    assert [r["name"] for r in aa] == ["aa/00", "aa/01", "aa/02", "aa/03"]
    (summary,) = [r for r in records if r["kind"] == "summary"]
    assert summary["aa_comparisons"] == 4
    assert summary["aa_false_positives"] == sum(r["verdict"] in ("faster", "slower") for r in aa)
    assert "A/A:" in res.output and "false-positive rate" in res.output


def test_failures_recorded_sweep_continues_and_resume_reruns_only_them(fake_env, monkeypatch):
    monkeypatch.setenv("FAKE_MODE", "mixed")
    out = fake_env / "run"
    args = ["--rounds", 1, "--samples", 3, "--warmup", 0, "--batch", 2, "--ctx", 64, "--out", out]
    res = invoke("--all", *args, "--timeout", 6, "--mem-limit-gib", 2, "--kv-layout", "contiguous")
    assert res.exit_code == 1, res.output
    meas = {r["name"]: r for r in read_records(out) if r["kind"] == "revalidate"}
    assert len(meas) == 12
    kinds = {n: r["failure"]["kind"] for n, r in meas.items() if "failure" in r}
    assert kinds == {
        "ple-int8/kv-bf16/copying": "oom",
        "ple-int4/kv-bf16/copying": "timeout",
        "ple-int4/kv-int8/copying": "crash",
    }
    assert meas["ple-int4/kv-int8/copying"]["failure"]["exception_type"] == "RuntimeError"
    assert "injected crash" in meas["ple-int4/kv-int8/copying"]["failure"]["stderr_tail"]
    assert len(ran(fake_env)) == 12  # every configuration ran despite the failures

    # --resume with other settings is refused; an existing run without --resume too
    assert invoke("--all", "--out", out, "--resume", "--batch", 4).exit_code == 2
    assert invoke("--all", "--out", out).exit_code == 2

    monkeypatch.setenv("FAKE_MODE", "ok")
    (fake_env / "ran.txt").unlink()
    res = invoke("--all", "--out", out, "--resume")
    assert res.exit_code == 0, res.output
    assert sorted(ran(fake_env)) == sorted(kinds)  # only the failed ones ran again
    records = read_records(out)
    meas = [r for r in records if r["kind"] == "revalidate"]
    assert len(meas) == 12 and not any("failure" in r for r in meas)
    assert all(r["config"]["batch"] == 2 for r in meas)  # settings inherited from the run
    assert len([r for r in records if r["kind"] == "ratio"]) == 6 + 6 + 8  # donation, kv-int8, ple
    assert len((out / "command.txt").read_text().splitlines()) == 2


def test_a_shared_visit_fails_and_resumes_as_a_whole(fake_env, monkeypatch):
    """shared-weights: a member that kills the process fails its group's members, nobody else's;
    --resume measures that group again, in one process."""
    monkeypatch.setenv("FAKE_MODE", "mixed")
    out = fake_env / "run"
    args = ["--config", "ple-bf16/*", "--config", "ple-int8/*", "--rounds", 1, "--samples", 2, "--warmup", 0]
    args += ["--kv-layout", "contiguous"]
    res = invoke(*args, "--batch", 2, "--ctx", 64, "--out", out, "--mem-limit-gib", 2, "--visit", "shared-weights")
    assert res.exit_code == 1, res.output
    meas = {r["name"]: r for r in read_records(out) if r["kind"] == "revalidate"}
    failed = {n for n, r in meas.items() if "failure" in r}
    assert len(meas) == 8 and failed == {n for n in meas if n.startswith("ple-int8/")}  # one OOM, its group
    assert {meas[n]["failure"]["kind"] for n in failed} == {"oom"}
    monkeypatch.setenv("FAKE_MODE", "ok")
    (fake_env / "ran.txt").unlink()
    assert invoke("--out", out, "--resume").exit_code == 0
    assert sorted(ran(fake_env)) == sorted(failed)
    assert not any("failure" in r for r in read_records(out) if r["kind"] == "revalidate")


def test_shared_visits_cancel_process_speed(fake_env, monkeypatch):
    """Each fake process runs at its own speed (±40%). With one process per configuration the
    donation ratio's CI carries that spread; with the four sharing a process per round it cancels."""
    monkeypatch.setenv("FAKE_MODE", "procspeed")
    widths = {}
    for visit in ("separate", "shared-weights"):
        out = fake_env / visit
        args = ["--config", "ple-bf16/*", "--rounds", 3, "--samples", 4, "--warmup", 0, "--batch", 2, "--ctx", 64]
        res = invoke(*args, "--visit", visit, "--out", out, "--kv-layout", "contiguous")
        assert res.exit_code == 0, res.output
        ratio = next(r for r in read_records(out) if r["name"] == "donation/ple-bf16/kv-bf16")
        assert ratio["same_process"] is (visit == "shared-weights")
        widths[visit] = ratio["ci95_hi"] / ratio["ci95_lo"]
        if visit == "shared-weights":
            assert ratio["verdict"] == "faster" and ratio["ratio"] == pytest.approx(2.0, rel=0.15)
    assert widths["shared-weights"] - 1 < (widths["separate"] - 1) / 3


def test_resume_keeps_the_runs_config_selection(fake_env):
    """A run of two configurations, resumed without --config, measures nothing new (it used to
    fall back to the whole grid); another selection is refused."""
    out = fake_env / "run"
    args = ["--rounds", 1, "--samples", 2, "--warmup", 0, "--batch", 2, "--ctx", 64]
    assert invoke("--config", "ple-bf16/kv-bf16/*", *args, "--out", out).exit_code == 0
    (fake_env / "ran.txt").unlink()
    res = invoke("--out", out, "--resume")
    assert res.exit_code == 0, res.output
    assert not (fake_env / "ran.txt").exists()
    assert len([r for r in read_records(out) if r["kind"] == "revalidate"]) == 2
    res = invoke("--config", "ple-int8/*", "--out", out, "--resume")
    assert res.exit_code == 2 and "configs" in res.output


def test_paged_layout_gets_its_own_verdict_per_shape(fake_env):
    out = fake_env / "run"
    res = invoke(
        "--config", "ple-bf16/kv-bf16/donated", "--model", "tiny-a", "--batch", "8,32", "--ctx", 512,
        "--kv-layout", "contiguous,paged", "--sliding-kv", "full", "--rounds", 2, "--samples", 3, "--warmup", 0, "--out", out,
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    records = read_records(out)
    assert len([r for r in records if r["kind"] == "revalidate"]) == 4
    ratios = {r["name"]: r for r in records if r["kind"] == "ratio"}
    assert set(ratios) == {"paged/ple-bf16/kv-bf16/donated/b8/ctx512", "paged/ple-bf16/kv-bf16/donated/b32/ctx512"}
    paged = ratios["paged/ple-bf16/kv-bf16/donated/b8/ctx512"]
    assert paged["config"]["reference"] == "contiguous" and paged["config"]["variant"] == "paged"
    assert paged["denominator"].endswith("/paged/b8/ctx512") and paged["verdict"] in (
        "equivalent", "inconclusive", "faster", "slower"
    )  # fmt: skip
    assert "paged vs contiguous" in res.output
    assert json.loads((out / "env.json").read_text())["settings"]["kv_layouts"] == ["contiguous", "paged"]


def test_unusable_requests_exit_2(fake_env):
    assert invoke("--config", "nope/*").exit_code == 2
    assert invoke("--all", "--config", "ple-bf16/*").exit_code == 2
    res = invoke("--resume", "--config", "ple-bf16/kv-bf16/donated")
    assert res.exit_code == 2 and "--out" in res.output
    res = invoke("--config", "ple-bf16/kv-bf16/donated", "--kv-layout", "ring")
    assert res.exit_code == 2 and "--kv-layout" in res.output


@pytest.mark.slow
def test_real_engine_child_on_tiny_model(tmp_path, monkeypatch):
    """With the lead's engine present: one real shared-weights visit of two tiny-a configurations
    (donated bf16 KV and copying int8 KV) in a child process."""
    pytest.importorskip("g4bench.engine.bench")
    from harness.isolate import run_isolated
    from harness.revalidate.visits import CHILD_TARGET, child_payload, visit_groups

    monkeypatch.setenv("G4BENCH_JAX_CACHE_DIR", str(tmp_path / "cache"))
    configs = select_configs(load_sweep(), ["ple-bf16/kv-bf16/donated", "ple-bf16/kv-int8/copying"])
    s = SweepSettings(model="tiny-a", batches=(2,), ctxs=(64,), rounds=1, samples=3, warmup=1, visit="shared-weights")
    (group,) = visit_groups(sweep_points(configs, s), s).values()
    res = run_isolated(CHILD_TARGET, child_payload(group, s) | {"round": 0}, timeout_s=600)
    assert "failure" not in res, res.get("failure")
    assert sorted(res["results"]) == sorted(p.name for p in group)
    for r in res["results"].values():
        assert len(r["step_ms_samples"]) == 3 and r["compile_s"] > 0 and r["device"]["platform"] == "cpu"
        assert r["visit_size"] == 2
    kv = [r["kv_bytes"] for r in res["results"].values()]
    assert kv[0] != kv[1]  # two caches (bf16 and int8), one set of weights


@pytest.mark.slow
def test_a_budgeted_run_stops_once_every_comparison_is_settled(fake_env, monkeypatch):
    """Donation halves the fake step (24 → 12 ms): decided at any round, so a run with a 100-minute
    budget stops at the rule's minimum round (6), says why, and stores the reason in its summary."""
    import harness.revalidate.sweep

    monkeypatch.setattr(harness.revalidate.sweep, "sweep_clock", RoundClock())
    out = fake_env / "run"
    args = ["--config", "ple-bf16/kv-bf16/*", "--samples", 3, "--warmup", 0, "--batch", 2, "--ctx", 64]
    res = invoke(*args, "--rounds", 1, "--budget-min", 100, "--out", out)
    assert res.exit_code == 0, res.output
    (summary,) = [r for r in read_records(out) if r["kind"] == "summary"]
    assert summary["rounds_done"] == 6
    assert summary["stop_reason"].startswith("every comparison settled after 6 rounds: 1 of 1 decided")
    assert "stopped: every comparison settled after 6 rounds" in " ".join(res.output.split())


def test_a_single_configuration_gets_a_smaller_default_budget():
    from harness.revalidate.main import RevalidateRequest, _scaled_budget

    settings, note = resolve_settings("cpu", model="tiny-a", batches=None, ctxs=None, rounds=None, samples=None,
                                      warmup=None)  # fmt: skip
    one, one_note = _scaled_budget(settings, note, 1, RevalidateRequest(), "cpu", resume=False)
    assert one.budget_s == 300.0 and "time budget 5 min instead of 15" in (one_note or "")
    assert _scaled_budget(settings, note, 12, RevalidateRequest(), "cpu", resume=False)[0].budget_s == 900.0
    asked = RevalidateRequest(budget_s=900.0)  # --budget-min given: kept as asked
    assert _scaled_budget(settings, note, 1, asked, "cpu", resume=False)[0].budget_s == 900.0
