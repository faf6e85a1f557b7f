"""Ahead-of-time compiles: OOM message parsing, cost sanity checks, and real compiles of tiny-a
(deviceless TPU v6e, and the local CPU)."""

from __future__ import annotations

import importlib.util
import os
from types import SimpleNamespace

import pytest

from harness.capacity.aot import check_cost, compile_program, memory_fields, parse_hbm_oom

HAS_LIBTPU = importlib.util.find_spec("libtpu") is not None
# libtpu takes a host-wide lockfile even for compile-only devices; a capacity run compiling at the
# same time would otherwise make these tests fail (harness.capacity.aot.TPU_CHILD_ENV sets the same).
os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
OOM_TEXT = (
    "RESOURCE_EXHAUSTED: E1000: CompileTimeHbmOom: Ran out of memory on HBM, the total memory required "
    "for HLO temporaries (31.77G) exceeds available HBM (31.24G). HLO module: jit__decode_step."
)


def test_parse_hbm_oom() -> None:
    required, available = parse_hbm_oom(OOM_TEXT)
    assert required == int(31.77 * 2**30)
    assert available == int(31.24 * 2**30)
    # the v6e usable-HBM figure in configs/hardware agrees with the compiler's limit to 10 MB
    assert abs(available - 33_543_694_581) < 10_000_000
    assert parse_hbm_oom("RESOURCE_EXHAUSTED: Out of memory allocating 10 bytes") is None
    # the compiler's other wording of the same failure (seen next to the boundary)
    other = (
        "RESOURCE_EXHAUSTED: E1000: CompileTimeHbmOom: XLA:TPU compile permanent error. Ran out of memory in "
        "memory space hbm. Used 31.26G of 31.24G hbm. Exceeded hbm capacity by 14.63M."
    )
    assert parse_hbm_oom(other) == (int(31.26 * 2**30), int(31.24 * 2**30))


def test_memory_fields_peak() -> None:
    ma = SimpleNamespace(argument_size_in_bytes=100, output_size_in_bytes=60, alias_size_in_bytes=50,
                         temp_size_in_bytes=7, generated_code_size_in_bytes=3)  # fmt: skip
    f = memory_fields(ma)
    assert f["peak_bytes"] == 100 + 60 + 7 - 50
    assert "xla_peak_memory_bytes" not in f


def test_check_cost_flags_nonsense() -> None:
    bad = check_cost({"xla_bytes_accessed": 9.7e10, "xla_optimal_s": -184.9}, 2.0e10, 1.638e12)
    assert not bad["xla_time_plausible"] and "non-positive" in bad["xla_cost_notes"]
    assert not bad["xla_bytes_plausible"] and "4.85x" in bad["xla_cost_notes"]
    good = check_cost({"xla_bytes_accessed": 2.2e10, "xla_optimal_s": 0.014}, 2.0e10, 1.638e12)
    assert good["xla_bytes_plausible"] and good["xla_time_plausible"] and good["xla_cost_notes"] == ""


def _payload(
    target: str, program: str = "decode", batch: int = 4, tokens: int = 1, donate: bool = True
) -> dict:
    case = {"model": "tiny-a", "layers": "w4a16", "ple": "bf16", "kv_dtype": "bf16", "donate": donate,
            "sliding_kv": "full", "batch": batch, "ctx": 64}  # fmt: skip
    return {"program": program, "case": case, "tokens": tokens, "target": target}


@pytest.mark.skipif(not HAS_LIBTPU, reason="libtpu is not installed: no deviceless TPU compiles on this host")
def test_deviceless_v6e_decode_compile_gives_breakdown() -> None:
    r = compile_program(_payload("tpu-v6e"))
    assert r["fits"] is True
    assert r["device"]["device_kind"].startswith("TPU v6")
    # donated: the cache is both an argument and an output, aliased (TPU tiling pads tiny-a's
    # 32-wide head dim, so the aliased bytes are at least the logical cache bytes)
    assert r["alias_bytes"] >= r["kv_bytes"] > 0
    assert r["argument_bytes"] >= r["weights_bytes"] + r["kv_bytes"]
    assert r["peak_bytes"] == r["argument_bytes"] + r["output_bytes"] + r["temp_bytes"] - r["alias_bytes"]
    assert r["xla_flops"] > 0


@pytest.mark.skipif(not HAS_LIBTPU, reason="libtpu is not installed: no deviceless TPU compiles on this host")
def test_deviceless_v6e_copying_and_prefill() -> None:
    copying = compile_program(_payload("tpu-v6e", donate=False))
    assert copying["fits"] and copying["alias_bytes"] == 0
    prefill = compile_program(_payload("tpu-v6e", program="prefill", batch=2, tokens=16))
    assert prefill["fits"] and prefill["alias_bytes"] >= prefill["kv_bytes"]


@pytest.mark.skipif(not HAS_LIBTPU, reason="libtpu is not installed: no deviceless TPU compiles on this host")
def test_deviceless_v6e_oom_is_an_answer() -> None:
    r = compile_program(_payload("tpu-v6e", batch=3_000_000))
    assert r["fits"] is False
    assert r["oom_available_bytes"] == int(31.24 * 2**30)
    assert r["oom_required_bytes"] > r["oom_available_bytes"]


def test_local_cpu_compile_breakdown() -> None:
    r = compile_program(_payload("local"))
    assert r["fits"] is True and r["device"]["platform"] == "cpu" and r["compute"] == "f32"
    assert r["alias_bytes"] == r["kv_bytes"]
    assert r["host_vm_peak_bytes"] > 0


def test_prefill_tokens_validated() -> None:
    with pytest.raises(ValueError, match="prefill tokens"):
        compile_program(_payload("local", program="prefill", tokens=65))
