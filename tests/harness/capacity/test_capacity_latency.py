"""Latency columns of `g4bench capacity`: step time at a ceiling, $/M tokens, the TPOT ceiling."""

from __future__ import annotations

import dataclasses

import pytest

from harness.capacity.latency import ceiling_latency, economics, latency_ceiling, pricing_for, step_ms

CFG = {"model": "e2b", "layers": "w4a16", "ple": "bf16", "kv_dtype": "bf16", "donate": True,
       "sliding_kv": "full", "ctx": 8192, "program": "decode", "target": "tpu-v6e"}  # fmt: skip


@pytest.fixture(scope="module")
def pricing():
    p = pricing_for("tpu-v6e")
    assert p.profile is not None and p.basis.startswith("profile tpu-v6e (") and "±" in p.basis
    return p


def test_economics():
    p = dataclasses.replace(pricing_for("tpu-v6e"), usd_per_hour=3.6)
    e = economics(p, 100, 50.0)  # 2,000 tok/s → 7.2 M tok/h → $0.5 per M
    assert e["tok_per_s"] == pytest.approx(2000.0)
    assert e["usd_per_m_tokens"] == pytest.approx(0.5)


def test_latency_ceiling_is_the_largest_batch_meeting_the_tpot(pricing):
    b = latency_ceiling(pricing, CFG, 50.0, upper=1000)
    assert step_ms(pricing, CFG, b) <= 50.0 < step_ms(pricing, CFG, b + 1)
    assert latency_ceiling(pricing, CFG, 0.1, upper=1000) == 0


def test_binding_ceiling_and_roofline_fallback(pricing):
    ceilings = [{"name": "d", "config": CFG, "max_batch": 170}]
    row = ceiling_latency(ceilings, pricing, 50.0)[0]
    assert row["binding"] == "latency" and row["batch_at_tpot"] == row["latency_ceiling"] < 170
    assert row["step_ms_at_memory"] > 50.0  # the profile: none of the memory ceiling meets 50 ms
    roof = dataclasses.replace(pricing, profile=None)
    rrow = ceiling_latency(ceilings, roof, 50.0)[0]
    assert rrow["basis"] == "roofline lower bound" and rrow["binding"] == "memory"
    assert rrow["step_ms_at_memory"] < row["step_ms_at_memory"]  # a lower bound is lower


def test_committed_v6e_tables_fit_80_columns() -> None:
    """The ceilings and latency tables of the committed v6e run print in a log 80 columns wide with
    no cell cut to "…" (names may fold onto a second line), and show the figures they are for."""
    import io
    from pathlib import Path
    from types import SimpleNamespace

    from rich.console import Console

    from harness.capacity.latency import latency_tables
    from harness.capacity.report import render_ceilings
    from harness.results import read_records

    recs = read_records(Path(__file__).parents[3] / "results/reference/capacity-tpu-v6e-ctx8192")
    ceilings = [r for r in recs if r.get("record") not in ("probe", "latency", "admission")]
    latency = ceiling_latency(ceilings, pricing_for("tpu-v6e"), 50.0)
    out = io.StringIO()
    console = Console(file=out, width=80)
    render_ceilings(ceilings, [], SimpleNamespace(model="e2b", ctx=8192, target="tpu-v6e"), console)
    for table in latency_tables(latency, pricing_for("tpu-v6e"), 50.0):
        console.print(table)
    text = out.getvalue()
    tables = [line for line in text.splitlines() if line.startswith(("┃", "│"))]
    assert tables and all(len(line) <= 80 for line in tables)
    assert "…" not in "\n".join(tables)
    assert "1,433,600" in text and "latency" in text  # bf16 donated full: 175 × 8,192 tokens; a binding word
