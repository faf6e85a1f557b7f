"""harness.plots and `g4bench plot`: PNG and SVG per figure, baseline labelled with its device,
failures drawn, roofline figure only when roofline records carry bandwidths."""

from __future__ import annotations

from typer.testing import CliRunner

from g4bench.cli import app
from harness.env import host_env, merge_device
from harness.plots import PLOTTERS, plot_run, register_plotter
from harness.results import append_record, make_record
from harness.revalidate.main import Point, SweepConfig, SweepSettings
from harness.revalidate.records import measurement_record as _measurement_record
from harness.revalidate.verdicts import ratio_records

SETTINGS = SweepSettings(model="e2b", batches=(4,), ctxs=(4096,), rounds=1, samples=5, warmup=1)


def measurement_record(cfg: SweepConfig, settings: SweepSettings, result: dict, **kw) -> dict:
    """One round's child result as a revalidate record (the sweep passes one result per round)."""
    case = {**cfg.case, "model": settings.model, "batch": settings.batches[0], "ctx": settings.ctxs[0]}
    return _measurement_record(Point(cfg.name, case), [result], settings, **kw)


ENV = merge_device(
    host_env({}, git_rev="abc1234"), {"platform": "cpu", "device_kind": "cpu", "device_count": 1}
)


def write_run(path, *, roofline: bool = False):
    path.mkdir()
    meas = []
    for kv, donate, ms in [
        ("bf16", False, 20.0),
        ("bf16", True, 12.0),
        ("int8", False, 14.0),
        ("int8", True, 10.0),
    ]:
        name = f"ple-bf16/kv-{kv}/{'donated' if donate else 'copying'}"
        cfg = SweepConfig(
            name, {"layers": "w4a16", "ple": "bf16", "kv_dtype": kv, "donate": donate, "sliding_kv": "full"}
        )
        if name == "ple-bf16/kv-int8/donated":
            result = {"failure": {"kind": "timeout", "detail": "x", "stderr_tail": "", "returncode": -9}}
        else:
            result = {
                "step_ms_samples": [ms, ms * 1.01, ms * 0.99, ms * 1.02, ms],
                "compile_s": 1.0,
                "weights_bytes": 1,
                "kv_bytes": 1,
            }
        meas.append(measurement_record(cfg, SETTINGS, result, run_id=path.name, base_env=ENV))
    recs = [*meas, *ratio_records(meas, run_id=path.name, base_env=ENV)]
    if roofline:
        recs.append(
            make_record(
                "roofline",
                "e2b/b4/ctx4096",
                run_id=path.name,
                env=ENV,
                config={},
                achieved_gb_per_s=18.0,
                calibrated_gb_per_s=29.5,
            )
        )
    for rec in recs:
        append_record(path, rec)
    return path


def test_revalidate_figures_png_and_svg(tmp_path):
    run = write_run(tmp_path / "run")
    paths = plot_run(run)
    names = sorted(p.name for p in paths)
    assert names == ["step_time.png", "step_time.svg", "throughput.png", "throughput.svg"]
    for p in paths:
        assert p.parent == run / "plots" and p.stat().st_size > 1000
    assert (run / "plots" / "step_time.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    svg = (run / "plots" / "step_time.svg").read_text()
    assert "ple-bf16/kv-bf16/copying" in svg and "failed: timeout" in svg and "faster" in svg
    tput = (run / "plots" / "throughput.svg").read_text()
    assert "vLLM, TPU v6e-1 (ct6e-standard-1t)" in tput
    assert "input 4096" in tput  # the sweep's input length nearest the run's ctx


def test_roofline_figure_when_records_present(tmp_path):
    run = write_run(tmp_path / "run", roofline=True)
    paths = plot_run(run, tmp_path / "figs")
    assert (tmp_path / "figs" / "bandwidth.svg") in paths
    assert "calibrated streaming bandwidth" in (tmp_path / "figs" / "bandwidth.svg").read_text()


def test_cli_plot_and_missing_roofline_message(tmp_path):
    run = write_run(tmp_path / "run")
    res = CliRunner().invoke(app, ["plot", str(run)])
    assert res.exit_code == 0, res.output
    assert "roofline" in res.output and "step_time.png" in res.output
    assert CliRunner().invoke(app, ["plot", str(tmp_path / "nope")]).exit_code == 2


def test_unknown_kind_is_reported_and_registry_dispatches(tmp_path, monkeypatch):
    run = tmp_path / "serve"
    run.mkdir()
    append_record(
        run, make_record("serve-load", "agents-4", run_id="s", env=ENV, config={}, ttft_ms_p50=10.0)
    )
    assert plot_run(run) == []
    monkeypatch.setitem(PLOTTERS, "serve-load", PLOTTERS.get("serve-load"))
    seen = []

    @register_plotter("serve-load")
    def fake(records, run_dir, out_dir, console):
        seen.extend(r["name"] for r in records)
        return [out_dir / "x.png"]

    assert plot_run(run) == [run / "plots" / "x.png"] and seen == ["agents-4"]


def test_revalidate_figure_says_rounds_done_and_its_panel_titles_do_not_overlap():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from harness.plots import _ratio_panel, _step_panel, rounds_done

    meas = [
        {"name": f"c{i}", "rounds": 7, "config": {"donate": bool(i % 2), "rounds": 3}, "step_ms_median": 10.0 + i,
         "step_ms_q1": 9.0 + i, "step_ms_q3": 11.0 + i, "step_ms_min": 8.0 + i, "step_ms_max": 12.0 + i,
         "step_rel_iqr_pct": 5.0}
        for i in range(2)
    ]  # fmt: skip
    assert rounds_done(meas, meas[0]["config"]) == 7  # not the configured minimum of 3
    ratios = [{"name": "donation/x", "ratio": 1.1, "ci95_lo": 1.05, "ci95_hi": 1.15, "floor_pct": 2.0,
               "verdict": "faster"}]  # fmt: skip
    fig, axes = plt.subplots(1, 2, figsize=(16, 4.0), squeeze=False)
    _step_panel(axes[0][0], meas)
    _ratio_panel(axes[0][1], ratios)
    fig.tight_layout()
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    left, right = (ax.title.get_window_extent(renderer) for ax in axes[0])
    assert left.x1 < right.x0, "the two panel titles overlap"
    plt.close(fig)
