"""Capacity search, failure classification, probe recording and admission arithmetic (no jax compiles)."""

from __future__ import annotations

import math
from dataclasses import replace
from types import SimpleNamespace

import pytest

from harness.capacity.admission import admission_cell, admission_rows, row_bytes
from harness.capacity.search import Probe, ProbeError, _guess, classify, search_ceiling


def _bound(n: int) -> int:
    # bracket: ≤ log_1.25(ratio) steps; bisection: ≤ log2(width) + 1; both O(log n)
    return 4 * math.ceil(math.log2(max(n, 2))) + 4


@pytest.mark.parametrize("ceiling", [0, 1, 5, 171, 999, 5000])
@pytest.mark.parametrize("estimate", [1, 200, 1000, 100_000])
def test_search_finds_exact_boundary_in_log_probes(ceiling: int, estimate: int) -> None:
    calls = []

    def probe(b: int) -> Probe:
        calls.append(b)
        return Probe(b, b <= ceiling)

    s = search_ceiling(probe, estimate, tol=0.0)
    assert s.lo == ceiling
    assert s.hi == ceiling + 1
    assert len(calls) == len(s.probes) <= _bound(max(estimate, ceiling))
    assert len(set(calls)) == len(calls), "a batch was probed twice"


def test_search_stops_within_tolerance() -> None:
    s = search_ceiling(lambda b: Probe(b, b <= 4321), 9000, tol=0.02)
    assert s.lo <= 4321 < s.hi
    assert s.hi - s.lo <= max(1, math.floor(0.02 * s.lo))


def test_search_upper_cap_when_everything_fits() -> None:
    s = search_ceiling(lambda b: Probe(b, True), 10, upper=50)
    assert s.lo == 50 and s.hi is None


def test_linear_guess_converges_in_few_probes() -> None:
    """A probe reporting bytes (peak when fitting, required when not) lets the search jump to the
    boundary: E2B-like numbers, estimate ignoring temporaries."""
    weights, temps, per_seq, limit = 6_560_000_000, 1_100_000_000, 151_000_000, 33_543_694_581

    def probe(b: int) -> Probe:
        need = weights + temps + b * per_seq
        return Probe(b, need <= limit, need)

    true = (limit - weights - temps) // per_seq
    s = search_ceiling(probe, (limit - weights) // per_seq, tol=0.0, limit=limit, per_seq_bytes=per_seq)
    assert s.lo == true
    assert len(s.probes) <= 4


def test_guess_uses_the_latest_probe_with_bytes() -> None:
    """Some compile OOM messages carry no figure: the guess still comes from the latest probe that
    reported bytes instead of giving up (which sent the v6e search back to halving)."""
    probes = [Probe(178, False, 178_000), Probe(176, False, None)]
    assert _guess(probes, 175_500, 1000) == 175


def test_guess_past_the_bracket_probes_next_to_its_end() -> None:
    """Fitting probes' peak bytes undercount what the compiler counts against its limit, so the line
    through them can cross the limit at or past the smallest failing batch (v6e, bf16 donated: the
    guess said 176 with 176 known not to fit). Such a guess still says the boundary hugs that end:
    the next probe is hi − 1, not the bracket's midpoint."""
    calls: list[int] = []

    def probe(b: int) -> Probe:
        calls.append(b)
        fits = b <= 175
        return Probe(b, fits, 1000 * b - 5000 if fits else None)  # undercounts by 5 sequences

    s = search_ceiling(probe, 176, tol=0.0, limit=176_000 + 1, per_seq_bytes=1000)
    assert (s.lo, s.hi) == (175, 176)
    assert calls[:1] == [176] and 175 in calls[:3]
    assert len(calls) <= 3


def test_learned_limit_is_used() -> None:
    """The TPU compiler states its own limit in the OOM message; on_limit feeds it back."""
    s = search_ceiling(
        lambda b: Probe(b, b <= 40, 1000 + 10 * b, {"oom_available_bytes": 1400} if b > 40 else {}),
        100,
        tol=0.0,
        limit=999_999,
        per_seq_bytes=10,
        on_limit=lambda p: p.result.get("oom_available_bytes"),
    )
    assert s.lo == 40 and s.limit == 1400


# ----------------------------------------------------------------------------------- classification


def _fail(kind: str, rc: int | None = 1, detail: str = "x") -> dict:
    return {"failure": {"kind": kind, "detail": detail, "stderr_tail": "tail", "returncode": rc}}


def test_classify_fit_and_compile_oom() -> None:
    assert classify({"fits": True}) is True
    assert classify({"fits": False, "oom_required_bytes": 5}) is False
    assert classify({"fits": False}, compile_only=True) is False


def test_classify_memory_failures_do_not_fit() -> None:
    assert classify(_fail("oom", -9)) is False
    assert classify(_fail("oom", 1, "RESOURCE_EXHAUSTED: Out of memory")) is False
    assert classify(_fail("crash", -6, "killed by SIGABRT")) is False


@pytest.mark.parametrize(
    ("rec", "match"),
    [
        (_fail("timeout", -9), "timed out"),
        (_fail("crash", 1, "ValueError: bad kv dtype"), "ValueError"),
        (_fail("no_result", 0), "no_result"),
        ({"wall_s": 1.0}, "neither"),
    ],
)
def test_classify_real_errors_stop(rec: dict, match: str) -> None:
    with pytest.raises(ProbeError, match=match):
        classify(rec)


def test_compile_probe_host_oom_is_an_error() -> None:
    """A compile child that runs out of host memory says nothing about the chip's HBM."""
    with pytest.raises(ProbeError, match="says nothing about the target"):
        classify(_fail("oom", -9), compile_only=True)


def test_driver_records_every_probe_and_stops_on_error(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    import harness.isolate
    from g4bench.engine.bench import DecodeCase
    from harness.capacity.probes import CapacityConfig, Driver
    from harness.run import RunFolder

    def fake_run(target, payload, timeout_s, mem_limit_bytes=None, **kw):
        b = payload["case"]["batch"]
        if b > 50:
            return {**_fail("crash", 1, "TypeError: boom"), "wall_s": 0.1}
        return {"fits": b <= 30, "peak_bytes": 100 + b, "wall_s": 0.1}

    monkeypatch.setattr(harness.isolate, "run_isolated", fake_run)
    recorded = []
    cfg = CapacityConfig(DecodeCase(model="tiny-a", ctx=64, batch=1), "tpu-v6e")
    folder = RunFolder(tmp_path, base_env={}, timeout_s=10.0, mem_limit_bytes=None)
    drv = Driver(cfg, 10**9, folder, lambda *a: recorded.append(a), lambda msg: None)
    s = drv.run(40, tol=0.0)
    assert s.lo == 30 and [r[0].rsplit("/", 1)[1] for r in recorded][0] == "probe-b40"
    assert len(recorded) == len(s.probes)
    recorded.clear()
    with pytest.raises(ProbeError, match="TypeError: boom"):
        drv.run(60, tol=0.0)
    assert len(recorded) == 1, "the failing probe is still recorded"


# ----------------------------------------------------------------------------------------- admission


def test_row_bytes_match_hand_computed_e2b() -> None:
    # 12 sliding layers (hd 256) + 3 full (hd 512), one KV head, K and V (capacity-anchors D6)
    assert (
        row_bytes("e2b", "bf16", "full", 8192) == (12 * 2 * 256 * 2 + 3 * 2 * 512 * 2) * 8192 == 150_994_944
    )
    # int8: 1 byte per element + a bf16 scale per token, head and K/V
    assert row_bytes("e2b", "int8", "full", 8192) == (9216 + 15 * 2 * 2) * 8192
    # ring: sliding layers hold exactly the 512-token window
    assert row_bytes("e2b", "bf16", "ring", 8192) == 3 * 2 * 512 * 2 * 8192 + 12 * 2 * 256 * 2 * 512
    assert row_bytes("e2b", "bf16", "ring", 4096) == 3 * 2 * 512 * 2 * 4096 + 12 * 2 * 256 * 2 * 512


def test_admission_cell_arithmetic() -> None:
    limit, overhead, row = 33_543_694_581, 7_300_000_000, 150_994_944
    c = admission_cell(overhead, row, 32, limit)
    assert c["need_bytes"] == 7_300_000_000 + 32 * 150_994_944
    assert c["fits"] and c["headroom_bytes"] == limit - c["need_bytes"]
    assert c["max_agents"] == (limit - overhead) // row == 173
    assert not admission_cell(overhead, row, 174, limit)["fits"]


def test_admission_rows_use_the_compiled_overhead() -> None:
    settings = SimpleNamespace(kv=("bf16",), sliding=("full",), ple=("bf16",), model="e2b", layers="w4a16",
                               target="tpu-v6e", limit_bytes=33_543_694_581, kv_layouts=("contiguous",))  # fmt: skip
    ceiling = {
        "config": {"program": "decode", "donate": True, "kv_dtype": "bf16", "sliding_kv": "full", "ple": "bf16", "target": "tpu-v6e"},
        "max_batch": 171, "kv_bytes": 171 * 150_994_944, "peak_bytes": 171 * 150_994_944 + 7_000_000_000,
        "limit_bytes": 33_543_694_581,
    }  # fmt: skip
    rows = admission_rows([ceiling], settings, agents=(8, 200), contexts=(8192,))
    assert [r["overhead_bytes"] for r in rows] == [7_000_000_000] * 2
    assert [r["fits"] for r in rows] == [True, False]
    assert rows[0]["max_agents"] == (33_543_694_581 - 7_000_000_000) // 150_994_944
    assert rows[0]["overhead_source"] == "compiled ceiling"
    fallback = admission_rows([], settings, agents=(8,), contexts=(8192,))
    assert fallback[0]["overhead_source"].startswith("weights only")


def test_paged_layout_is_its_own_configuration_with_its_own_ratio() -> None:
    """--kv-layout contiguous,paged: each decode case twice (contiguous names unchanged, paged ones
    marked), a paged ÷ contiguous ceiling line, and admission from the first layout's ceilings."""
    from harness.capacity.probes import Settings, configurations
    from harness.capacity.report import ratio_lines

    s = Settings(model="e2b", ctx=8192, target="tpu-v6e", kv=("bf16",), steps=("donated",), ple=("bf16",),
                 sliding=("full",), layers="w4a16", compute=None, limit_bytes=1, limit_source="x",
                 mem_limit_bytes=None, timeout_s=1.0, tol=0.0, prefill_tokens=(256,),
                 kv_layouts=("contiguous", "paged"))  # fmt: skip
    cfgs = configurations(s)
    names = [c.name for c in cfgs]
    assert names == [
        "decode/tpu-v6e/layers-w4a16/ple-bf16/kv-bf16/donated/sliding-full/ctx8192",
        "decode/tpu-v6e/layers-w4a16/ple-bf16/kv-bf16/donated/sliding-full/paged/ctx8192",
        "prefill-chunk256/tpu-v6e/layers-w4a16/ple-bf16/kv-bf16/donated/sliding-full/ctx8192",  # prefill: contiguous
    ]
    assert "kv_layout" not in cfgs[0].config() and cfgs[1].config()["kv_layout"] == "paged"
    assert cfgs[1].payload(4)["case"]["kv_layout"] == "paged"

    def ceiling(cfg, batch: int, overhead: int) -> dict:
        return {"config": cfg.config(), "max_batch": batch, "kv_bytes": batch * 150_994_944,
                "peak_bytes": batch * 150_994_944 + overhead, "limit_bytes": 33_543_694_581}  # fmt: skip

    ceilings = [ceiling(cfgs[0], 171, 7_000_000_000), ceiling(cfgs[1], 150, 9_000_000_000)]
    assert "paged ÷ contiguous, kv bf16, donated, sliding full: 150 ÷ 171 = 0.877" in ratio_lines(ceilings)
    ceilings[0] |= {"xla_bytes_accessed": 171 * 1.2e9, "temp_bytes": 0.39e9}
    ceilings[1] |= {"xla_bytes_accessed": 150 * 2.4e9, "temp_bytes": 5.2e9}
    assert ratio_lines(ceilings)[-1].startswith("  compiled: XLA bytes accessed per sequence 2.40 vs 1.20 GB (2.00×), temps 5.20 vs 0.39 GB")
    rows = admission_rows(ceilings, s, agents=(8,), contexts=(8192,))
    assert [r["overhead_bytes"] for r in rows] == [7_000_000_000]  # the contiguous ceiling, listed first
    rows = admission_rows(ceilings, replace(s, kv_layouts=("paged",)), agents=(8,), contexts=(8192,))
    assert [r["overhead_bytes"] for r in rows] == [9_000_000_000]


def test_admission_counts_a_shared_prefix_once() -> None:
    """E2B, bf16, ring: a 4,096-token common prefix is stored once in the full-attention layers (3
    owning layers × 512 × K and V × 2 bytes = 6,144 B per position); the rings stay per agent."""
    from harness.capacity.admission import shared_bytes

    settings = SimpleNamespace(kv=("bf16",), sliding=("ring",), ple=("bf16",), model="e2b", layers="w4a16",
                               target="tpu-v6e", limit_bytes=33_543_694_581, kv_layouts=("contiguous",))  # fmt: skip
    assert shared_bytes("e2b", "bf16", "ring", 8192, 4096) == 4096 * 6144
    assert shared_bytes("e2b", "bf16", "full", 8192, 4096) == 4096 * 18432  # every layer keeps it
    rows = admission_rows([], settings, agents=(8,), contexts=(8192,), shared_prefix=4096)
    plain, shared = sorted(rows, key=lambda r: r["shared_prefix"])
    row, s, over, limit = plain["row_bytes"], 4096 * 6144, plain["overhead_bytes"], 33_543_694_581
    assert shared["need_bytes"] == over + s + 8 * (row - s)
    assert (
        shared["max_agents"] == (limit - over - s) // (row - s) > plain["max_agents"] == (limit - over) // row
    )


def test_local_accelerator_uses_the_allocator_limit_without_an_address_space_cap(monkeypatch):
    """On a GPU host, RLIMIT_AS would break the runtime: the limit is the allocator's own."""
    import harness.isolate
    import harness.load.server
    from harness.capacity.main import CapacityRequest, resolve_settings

    dev = {"platform": "gpu", "device_kind": "NVIDIA H200", "device_count": 1, "bytes_limit": 100 * 2**30}
    monkeypatch.setattr(harness.load.server, "has_accelerator", lambda: True)
    monkeypatch.setattr(harness.isolate, "run_isolated", lambda target, payload, timeout_s: dict(dev))
    lines = []
    s = resolve_settings(
        CapacityRequest(ctx=8192, model="e2b"), type("C", (), {"print": lambda self, m: lines.append(m)})()
    )
    assert s.limit_bytes == 100 * 2**30 and s.mem_limit_bytes is None and s.layers == "w4a16"
    assert "NVIDIA H200 allocator bytes_limit" in s.limit_source

    dev["platform"] = "cpu"  # JAX_PLATFORMS=cpu on an accelerator host: the CPU path, RAM and a cap
    assert resolve_settings(
        CapacityRequest(ctx=64, model="tiny-a"), type("C", (), {"print": lambda self, m: None})()
    ).mem_limit_bytes
