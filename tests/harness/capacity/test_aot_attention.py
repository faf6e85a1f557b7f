"""Which attention a deviceless compile puts in the step: the Pallas paged kernel for a paged layout
on TPU (what the engine serves there), plain XLA on request or elsewhere, and an error where the
kernel is demanded but cannot run."""

from __future__ import annotations

import pytest

from g4bench.model.paged_kernels import PagedKernel
from harness.capacity.aot import target_attention


def _payload(layout: str, attention: str | None = None) -> dict:
    return {"case": {"kv_layout": layout}, "attention": attention}


def test_paged_tpu_step_uses_the_kernel() -> None:
    attention, name = target_attention(_payload("paged"), "tpu")
    assert isinstance(attention, PagedKernel) and not attention.interpret and name == "pallas-paged"
    assert target_attention(_payload("paged", "pallas"), "tpu")[1] == "pallas-paged"


def test_plain_xla_where_asked_or_where_the_kernel_does_not_apply() -> None:
    assert target_attention(_payload("paged", "xla"), "tpu") == (None, "xla")
    assert target_attention(_payload("contiguous"), "tpu") == (None, "xla")
    assert target_attention(_payload("paged"), "gpu") == (None, "xla")
    assert target_attention(_payload("paged"), "local-cpu") == (256, "xla-blocked-256")


def test_kernel_demanded_where_it_cannot_run_fails_loudly() -> None:
    with pytest.raises(ValueError, match="paged KV layout and a TPU"):
        target_attention(_payload("contiguous", "pallas"), "tpu")
    with pytest.raises(ValueError, match="auto, xla or pallas"):
        target_attention(_payload("paged", "mosaic"), "tpu")
