"""Fleet search, validation arithmetic and pricing, on scripted inputs."""

from __future__ import annotations

import pytest

from g4bench.engine.virtual_engine import EngineCall
from harness.load.slo import SLO
from harness.load.workloads import WorkloadConfig
from harness.sim.fleet import Knobs, costs_of, size_one
from harness.sim.validate import compare, headline

SLO_T = SLO(ttft_ms=100.0, tpot_ms=10.0, attainment_target=0.9)


def scripted(limit: int, calls: list[int]):
    """run_agents stand-in: attainment 1 up to `limit` agents, 0.5 past it (TPOT failing)."""

    def run(n, shape):
        calls.append(n)
        good = n <= limit
        by = {"TTFT": 1.0, "TPOT": 1.0 if good else 0.5, "E2E": 1.0}
        return {"task_slo_attainment": 1.0 if good else 0.5, "slo_attainment": 1.0 if good else 0.5,
                "attainment_by_objective": by, "output_throughput": 10.0 * n, "median_tpot_ms": float(n),
                "p99_tpot_ms": 2.0 * n}  # fmt: skip

    return run


@pytest.mark.parametrize("limit", [1, 2, 13, 64])
def test_binary_search_finds_the_largest_passing_count(limit):
    calls: list[int] = []
    s = size_one(
        Knobs("bf16", "ring", None),
        WorkloadConfig(),
        SLO_T,
        "e2b",
        500,
        "weights",
        scripted(limit, calls),
        1024,
    )
    assert s.agents_per_chip == limit
    assert s.binding.startswith("SLO: TPOT")
    assert len(set(calls)) <= 2 * 10  # doubling then bisection, each count simulated once


def test_memory_ceiling_binds_before_the_slo():
    s = size_one(
        Knobs("int8", "full", 8), WorkloadConfig(), SLO_T, "e2b", 5, "weights", scripted(100, []), 1024
    )
    assert s.agents_per_chip == 5 and s.binding.startswith("memory")


def test_costs_from_the_sized_point():
    s = size_one(
        Knobs("bf16", "ring", None), WorkloadConfig(), SLO_T, "e2b", 500, "weights", scripted(10, []), 1024
    )
    c = costs_of(s, usd_per_hour=3.6, agents_total=64)
    assert c["chips"] == 7  # ⌈64 / 10⌉
    assert c["usd_per_agent_hour"] == pytest.approx(0.36)
    assert c["usd_per_m_output_tokens"] == pytest.approx(3.6 / (100.0 * 3600) * 1e6)


def test_validation_rows_and_headline():
    measured = {"levels": [{"concurrency": 1, "median_ttft_ms": 100.0, "median_tpot_ms": 10.0},
                           {"concurrency": 2, "median_ttft_ms": 200.0, "median_tpot_ms": 20.0}]}  # fmt: skip
    predicted = {"levels": [{"concurrency": 1, "median_ttft_ms": 110.0, "median_tpot_ms": 10.0},
                            {"concurrency": 2, "median_ttft_ms": 140.0, "median_tpot_ms": None}]}  # fmt: skip
    rows = compare(measured, predicted)
    assert {(r["metric"], r["concurrency"]): round(r["ratio"], 3) for r in rows} == {
        ("median_ttft_ms", 1): 1.1, ("median_tpot_ms", 1): 1.0, ("median_ttft_ms", 2): 0.7,
    }  # fmt: skip
    h = headline(rows)
    assert (
        h["cells"] == 3
        and h["median_abs_error_pct"] == pytest.approx(10.0)
        and h["max_abs_error_pct"] == pytest.approx(30.0)
    )


def test_pricer_uses_each_programs_fit_and_says_so():
    from g4bench.engine.engine_config import EngineConfig
    from g4bench.model.config import load_config
    from g4bench.model.params import WeightFormat
    from harness.calibrate.steptime import COEFFS, Profile, StepModel
    from harness.sim.pricing import StepPricer

    dec = StepModel(dict(zip(COEFFS, (1.0, 0.0, 0.0, 0.0, 0.0), strict=True)), 2.0)
    pre = StepModel(dict(zip(COEFFS, (5.0, 0.0, 0.0, 0.0, 0.0), strict=True)), 2.0)
    cfg, fmt = load_config("tiny-a"), WeightFormat(layers="f32", ple="f32", embed="f32")
    ecfg = EngineConfig(max_slots=2, max_len=64, chunk_size=32)
    both = StepPricer.for_engine(Profile("dev", "g4bench", {"decode": dec, "prefill": pre}), cfg, fmt, ecfg)
    assert both(EngineCall("decode", 2, 1, 64)) == pytest.approx(0.001)
    assert both(EngineCall("prefill", 1, 32, 64)) == pytest.approx(0.005)
    only = StepPricer.for_engine(Profile("dev", "g4bench", {"decode": dec}), cfg, fmt, ecfg)
    assert only(EngineCall("prefill", 1, 32, 64)) == pytest.approx(0.001)
    assert "no prefill fit" in only.basis["prefill"]
    none = StepPricer(cfg, fmt, both.layout, None, peak_bytes_per_s=1e9, peak_flop_per_s=1e12)
    cost = none.cost(EngineCall("decode", 2, 1, 64))
    assert none(EngineCall("decode", 2, 1, 64)) == pytest.approx(max(cost.bytes / 1e9, cost.flops / 1e12))


def test_fleet_tables_fit_80_columns() -> None:
    """`plan`'s fleet output in an 80-column log: every figure whole (nothing cut to "…"), and what
    binds on its own line per knob setting."""
    import io
    from types import SimpleNamespace

    from rich.console import Console

    from harness.sim.planner import print_fleet

    top = SimpleNamespace(summary={"median_tpot_ms": 13.94, "p99_tpot_ms": 17.1, "median_ttft_ms": 766.2})
    sizing = SimpleNamespace(knobs=SimpleNamespace(label="kv-bf16/ring/slots=agents"), memory_ceiling=490,
                             agents_per_chip=58, at_ceiling=top,
                             binding="SLO: TTFT (0.5% miss it; task attainment 0.898 < 0.9 at the next agent count)")  # fmt: skip
    cost = {"chips": 2, "usd_per_m_output_tokens": 0.1641, "usd_per_agent_hour": 0.02331, "output_tok_per_s_per_chip": 2280.4}
    out = io.StringIO()
    print_fleet([(sizing, cost)] * 4, SimpleNamespace(id="tpu-v6e", assumptions=["profile tpu-v6e"]), 64,
                Console(file=out, width=80))  # fmt: skip
    text = out.getvalue()
    tables = [line for line in text.splitlines() if not line.startswith("  ")]
    assert "…" not in "\n".join(tables) and all(len(line) <= 80 for line in tables)
    assert text.count("0.0233") == 4 and text.count("2280") == 4 and text.count("766.2") == 4
    assert text.count("binds on: SLO: TTFT") == 4
