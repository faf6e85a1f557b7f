"""Deviceless compiles for an NVIDIA GPU target: XLA's description of the part (configs/hardware/
gpu_specs) through jax's CUDA plugin on a host with no GPU (harness/capacity/aot.cuda_topology).

With the plugin installed (`pip install "jax-cuda12-plugin[with-cuda]==<jax version>"`) tiny-a's
decode step compiles for an H100 and the probe's verdict is its compiled peak against the limit;
without it the error names what to install. Which of the two runs depends on the host."""

from __future__ import annotations

import pytest

from harness.capacity.aot import compile_program, cuda_topology
from harness.capacity.main import has_cuda_plugin
from harness.hardware import load_hardware

HAS_CUDA_PLUGIN = has_cuda_plugin()


def _payload(limit_bytes: int, batch: int = 4) -> dict:
    case = {"model": "tiny-a", "layers": "w4a16", "ple": "bf16", "kv_dtype": "bf16", "donate": True,
            "sliding_kv": "full", "batch": batch, "ctx": 64, "kv_layout": "paged"}  # fmt: skip
    return {"program": "decode", "case": case, "tokens": 1, "target": "nvidia-h100", "limit_bytes": limit_bytes}


@pytest.mark.parametrize("gpu", ["nvidia-h100", "nvidia-h200"])
def test_gpu_targets_describe_their_part(gpu):
    hw = load_hardware(gpu)
    text = hw.target_config_text()
    assert hw.aot_topology == "1x1x1" and 'platform_name: "CUDA"' in text
    assert "cuda_compute_capability { major: 9 }" in text
    memory = int(next(line for line in text.splitlines() if "device_memory_size" in line).split(":")[1])
    assert 0.9 * hw.value("hbm_bytes") < memory < 1.1 * hw.value("hbm_bytes")


@pytest.mark.skipif(HAS_CUDA_PLUGIN, reason="the CUDA plugin is installed: the compile test runs instead")
def test_without_the_cuda_plugin_the_error_says_what_to_install():
    with pytest.raises(RuntimeError, match=r"pip install \"jax-cuda12-plugin\[with-cuda\]=="):
        cuda_topology(load_hardware("nvidia-h100"))


@pytest.mark.skipif(not HAS_CUDA_PLUGIN, reason="jax-cuda12-plugin is not installed: no deviceless GPU compiles")
def test_deviceless_h100_compile_is_judged_by_its_peak():
    r = compile_program(_payload(limit_bytes=80 * 10**9))
    assert r["fits"] is True and r["device"]["platform"] == "gpu"
    assert r["device"]["device_kind"] == "NVIDIA H100 80GB HBM3"
    assert r["peak_bytes"] == r["argument_bytes"] + r["output_bytes"] + r["temp_bytes"] - r["alias_bytes"]
    assert r["alias_bytes"] >= r["kv_bytes"] > 0 and "not wired" in r["attention_note"]
    tight = compile_program(_payload(limit_bytes=r["peak_bytes"] - 1))
    assert tight["fits"] is False and tight["fits_rule"] == f"peak_bytes <= limit_bytes {r['peak_bytes'] - 1}"
