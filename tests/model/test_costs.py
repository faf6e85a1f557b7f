"""costs.py against bytes and FLOPs computed by hand (tiny-a) and the capacity anchors (E2B)."""

from __future__ import annotations

import pytest

from g4bench.model.config import load_config
from g4bench.model.costs import (
    decode_cost,
    kv_read_bytes,
    kv_stored_bytes_per_token,
    prefill_cost,
    streamed_weight_bytes,
)
from g4bench.model.kv_cache import CacheLayout, cache_bytes
from g4bench.model.params import WeightFormat, param_bytes_by_family

# tiny-a: H 64, I 96 (192 double-wide on shared layers), 8 layers "sssFsssF", 4 KV-shared, heads 2,
# hd 32 / 64, PLE 32 per layer, V 512. Linear entries (in·out) per layer kind, by hand:
SLIDING_OWNING = 64 * 64 * 2 + 64 * 32 * 2 + 64 * 96 * 3 + 64 * 32 * 2  # q o, k v, gate up down, ple gate up
FULL_OWNING = 64 * 128 * 2 + 64 * 64 * 2 + 64 * 96 * 3 + 64 * 32 * 2
SLIDING_SHARED = 64 * 64 * 2 + 64 * 192 * 3 + 64 * 32 * 2
FULL_SHARED = 64 * 128 * 2 + 64 * 192 * 3 + 64 * 32 * 2
LINEARS = 3 * SLIDING_OWNING + FULL_OWNING + 3 * SLIDING_SHARED + FULL_SHARED
PLE_PROJ = 64 * 8 * 32
# norms (f32): 5 × H per layer + q_norm (+ k_norm on owning layers) + layer scalar; ple_norm; final norm
NORMS = 3 * (320 + 32 + 32 + 1) + (320 + 64 + 64 + 1) + 3 * (320 + 32 + 1) + (320 + 64 + 1) + 32 + 64


@pytest.fixture(scope="module")
def tiny():
    return load_config("tiny-a")


@pytest.fixture(scope="module")
def e2b():
    return load_config("e2b")


def test_linear_count_by_hand():
    assert LINEARS == 356_352 and NORMS == 3_144


def test_tiny_streamed_weights_f32(tiny):
    fmt = WeightFormat(layers="f32", embed="f32")
    got = streamed_weight_bytes(tiny, fmt)
    assert got == {"weights": 4 * (LINEARS + PLE_PROJ + NORMS), "lm_head": 512 * 64 * 4}


def test_tiny_streamed_weights_w4a16_counts_scales(tiny):
    got = streamed_weight_bytes(tiny, WeightFormat(layers="w4a16"))
    # int4 words (in·out/2 bytes) + bf16 scales per group of 32 (in·out/16 bytes) + f32 norms
    assert got["weights"] == (LINEARS + PLE_PROJ) // 2 + (LINEARS + PLE_PROJ) // 16 + 4 * NORMS
    assert got["lm_head"] == 512 * 64 * 2


def test_streamed_is_everything_but_the_ple_table(tiny):
    fmt = WeightFormat(layers="bf16", ple="int8")
    fam = param_bytes_by_family(tiny, fmt)
    assert sum(streamed_weight_bytes(tiny, fmt).values()) == sum(fam.values()) - fam["ple_table"]


def test_tiny_decode_bytes_and_flops_by_hand(tiny):
    layout = CacheLayout(max_len=64, kv_dtype="bf16")
    cost = decode_cost(tiny, WeightFormat(layers="f32", embed="f32"), layout, batch=2, kv_len=16)
    parts = cost.bytes_by_part
    # KV per position: sliding 2·32·2 = 128 B, full 2·64·2 = 256 B; 6 sliding + 2 full layers attend
    assert kv_stored_bytes_per_token(tiny, layout) == 3 * 128 + 256
    assert parts["kv_read"] == 2 * 16 * (6 * 128 + 2 * 256)
    assert parts["kv_write"] == 2 * (3 * 128 + 256)
    assert parts["embed_gather"] == 2 * 64 * 4
    assert parts["ple_gather"] == 2 * 8 * 32 * 2  # gathered bf16 rows, not the table
    assert parts["logits"] == 2 * 2 * 512 * 4
    assert parts["kv_copy"] == 0
    assert cost.flops_by_part == {
        "linears": 2 * 2 * (LINEARS + PLE_PROJ),
        "attention": 4 * 2 * 2 * 16 * (6 * 32 + 2 * 64),
        "lm_head": 2 * 2 * 64 * 512,
    }
    assert cost.bytes == sum(parts.values())


def test_copying_step_copies_the_cache(tiny):
    layout = CacheLayout(max_len=64)
    fmt = WeightFormat(layers="f32", embed="f32")
    copying = decode_cost(tiny, fmt, layout, batch=2, kv_len=64, donated=False)
    assert copying.bytes_by_part["kv_copy"] == 2 * cache_bytes(tiny, 2, layout)


def test_ring_reads_window_plus_one(tiny):
    layout = CacheLayout(max_len=64, ring=True)
    # sliding layers read the 8-entry ring plus the new token; full layers read kv_len
    assert kv_read_bytes(tiny, layout, 1, 32) == 6 * 128 * 9 + 2 * 256 * 32
    cost = decode_cost(tiny, WeightFormat(), layout, batch=1, kv_len=32)
    assert cost.bytes_by_part["kv_write"] == 3 * 2 * 128 * 8 + 256  # rings rewritten, full layer 1 token


def test_prefill_runs_shared_layers_on_the_last_token(tiny):
    layout = CacheLayout(max_len=64)
    cost = prefill_cost(tiny, WeightFormat(layers="f32", embed="f32"), layout, tokens=4, kv_len=16)
    owning = 3 * SLIDING_OWNING + FULL_OWNING
    shared = 3 * SLIDING_SHARED + FULL_SHARED
    assert cost.flops_by_part["linears"] == 2 * (4 * owning + shared + 4 * PLE_PROJ)
    assert cost.flops_by_part["lm_head"] == 2 * 64 * 512
    assert cost.bytes_by_part["kv_write"] == 4 * (3 * 128 + 256)


def test_e2b_w4a16_weights_match_the_anchor(e2b):
    # capacity-anchors: int4 layers (g32, bf16 scales) + bf16 LM head ≈ 1.86 GB per decode step
    got = sum(streamed_weight_bytes(e2b, WeightFormat(layers="w4a16")).values())
    assert got == pytest.approx(1.86e9, rel=0.01)


def test_e2b_bf16_weights_match_the_anchor(e2b):
    # capacity-anchors: 2,279,758,848 params ≈ 4.56 GB read per step in bf16 (PLE table excluded)
    got = sum(streamed_weight_bytes(e2b, WeightFormat(layers="bf16")).values())
    assert got == pytest.approx(2 * 2_279_758_848, rel=0.005)


def test_e2b_kv_per_token(e2b):
    layout = CacheLayout(max_len=8192)
    assert kv_stored_bytes_per_token(e2b, layout) == 18_432  # 12·2·256·2 + 3·2·512·2
    # what the step reads: 28 sliding layers × 1 KiB + 7 full × 2 KiB per position
    assert kv_read_bytes(e2b, layout, 1, 1) == 28 * 1024 + 7 * 2048
    cost = decode_cost(e2b, WeightFormat(), layout, batch=32, kv_len=8192)
    assert cost.bytes_by_part["ple_gather"] == 32 * 8960 * 2
    assert cost.bytes_by_part["kv_write"] == 32 * 18_432


def test_rejects_bad_shapes(tiny):
    with pytest.raises(ValueError):
        decode_cost(tiny, WeightFormat(), CacheLayout(max_len=8), batch=0, kv_len=8)
