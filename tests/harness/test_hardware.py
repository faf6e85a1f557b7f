"""harness.hardware: every device file parses, every figure names its source, JAX names match."""

from __future__ import annotations

import pytest

from harness.hardware import FIGURES, hardware_for_device, list_hardware, load_hardware


def test_all_devices_present_with_sources():
    ids = {hw.id for hw in list_hardware()}
    assert ids == {"cpu", "tpu-v5e", "tpu-v6e", "tpu-v5p", "nvidia-h100", "nvidia-h200"}
    for hw in list_hardware():
        for name in FIGURES:
            assert hw.figures[name].source, (hw.id, name)


def test_v6e_figures():
    v6e = load_hardware("tpu-v6e")
    assert v6e.value("hbm_bytes") == 32 * 2**30
    assert v6e.value("usable_hbm_bytes") == pytest.approx(31.24 * 2**30, rel=1e-9)
    assert v6e.value("peak_bandwidth_bytes_per_s") == 1638e9
    assert v6e.value("peak_bf16_flop_per_s") == 918e12
    assert v6e.value("peak_int8_op_per_s") == 1836e12
    assert v6e.value("usd_per_hour") == 1.35
    assert v6e.aot_topology == "v6e:1x1"


def test_cpu_has_no_nameplate_bandwidth():
    cpu = load_hardware("cpu")
    assert cpu.value("peak_bandwidth_bytes_per_s") is None
    assert "measured at run time" in cpu.figures["peak_bandwidth_bytes_per_s"].source


def test_h200_dense_not_sparse():
    h200 = load_hardware("nvidia-h200")
    assert h200.value("peak_bf16_flop_per_s") == 989e12
    assert h200.value("hbm_bytes") == 141e9


@pytest.mark.parametrize(
    "platform,kind,expected",
    [
        ("cpu", "cpu", "cpu"),
        ("tpu", "TPU v6 lite", "tpu-v6e"),
        ("tpu", "TPU v5 lite", "tpu-v5e"),
        ("tpu", "TPU v5", "tpu-v5p"),
        ("gpu", "NVIDIA H100 80GB HBM3", "nvidia-h100"),
        ("gpu", "NVIDIA H200", "nvidia-h200"),
        ("gpu", "NVIDIA A100-SXM4-40GB", None),
    ],
)
def test_device_matching(platform, kind, expected):
    hw = hardware_for_device(platform, kind)
    assert (hw.id if hw else None) == expected


def test_unknown_figure_and_device():
    with pytest.raises(KeyError):
        load_hardware("cpu").value("warp_speed")
    with pytest.raises(FileNotFoundError, match="known"):
        load_hardware("tpu-v99")
