"""Cache arrays are written in place: 16-bit floats are stored as their uint16 bits.

XLA:CPU's scatter into a bf16 buffer (or into a bitcast view of one) is not done in place: every
prefill chunk and decode step copied each array twice (bf16 → bits → bf16), which for `small` at 8
slots × 4,096 positions was 40 of a paged 1-token prefill's 61 ms (g4bench/model/kv_cache.py).
These tests check the structure that prevents it, not a time: the donated programs' temporaries
hold no copy of a cache array, and the stored dtypes are the bits.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from g4bench.engine.engine import Engine
from g4bench.engine.engine_config import EngineConfig
from g4bench.model.config import load_config
from g4bench.model.kv_cache import CacheLayout, cache_specs, entry_dtypes
from tests.engine.test_engine import random_params


@pytest.fixture(scope="module")
def cfg():
    return load_config("tiny-a")


@pytest.mark.parametrize("kv_dtype", ["bf16", "int8", "f32"])
def test_every_layout_stores_16_bit_floats_as_bits(cfg, kv_dtype):
    logical = entry_dtypes(CacheLayout(max_len=64, kv_dtype=kv_dtype))
    stored = {n: jnp.dtype(jnp.uint16) if d == jnp.bfloat16 else d for n, d in logical.items()}
    assert set(logical) == ({"k", "v", "ks", "vs"} if kv_dtype == "int8" else {"k", "v"})
    for layout in (
        CacheLayout(max_len=64, kv_dtype=kv_dtype, paged=True, blocks=9),
        CacheLayout(max_len=64, kv_dtype=kv_dtype),
        CacheLayout(max_len=64, kv_dtype=kv_dtype, ring=True),
    ):
        for entry in cache_specs(cfg, 2, layout):
            assert {n: a.dtype for n, a in entry.items()} == stored, layout


def _smallest_array_bytes(engine) -> int:
    return min(x.size * x.dtype.itemsize for x in jax.tree_util.tree_leaves(engine.cache))


def _engine_and_temps(cfg, kv_dtype: str, kv_layout: str, max_len: int):
    """An engine and the temporaries of its donated prefill and decode programs at kv_len 32."""
    ecfg = EngineConfig(
        max_slots=8, max_len=max_len, kv_dtype=kv_dtype, chunk_size=16, min_kv_bucket=32,
        kv_layout=kv_layout, block_size=16, sliding_kv="full",
    )  # fmt: skip
    engine = Engine(cfg, random_params(cfg), ecfg, compute_dtype=jnp.float32)
    tables = {g: jnp.asarray(t[:1].copy()) for g, t in engine.tables.items()}
    i32 = lambda *v: jnp.asarray(v, jnp.int32)  # noqa: E731
    prefill = engine._prefill.lower(
        engine.params, engine.cache, engine.sampling, jnp.zeros((1, 16), jnp.int32), i32(0), i32(5),
        jnp.asarray(0, jnp.int32), tables, kv_len=32,
    ).compile()  # fmt: skip
    S = ecfg.max_slots
    decode = engine._decode.lower(
        engine.params, engine.cache, engine.sampling, jnp.zeros(S, jnp.int32), jnp.zeros(S, jnp.int32),
        jnp.ones(S, bool), {g: jnp.asarray(t) for g, t in engine.tables.items()}, kv_len=32,
    ).compile()  # fmt: skip
    return engine, [p.memory_analysis().temp_size_in_bytes for p in (prefill, decode)]


@pytest.mark.parametrize("kv_layout", ["paged", "contiguous"])
@pytest.mark.parametrize("kv_dtype", ["bf16", "int8"])
def test_donated_programs_hold_no_copy_of_a_cache_array(cfg, kv_dtype, kv_layout):
    """At a fixed kv_len the programs' activations do not depend on the cache's size, so doubling
    max_len leaves their temporaries alone unless a cache array is copied; a copy would add at
    least the smallest array (an int8 layout's scales) for each doubling."""
    small, small_temps = _engine_and_temps(cfg, kv_dtype, kv_layout, 1024)
    _, large_temps = _engine_and_temps(cfg, kv_dtype, kv_layout, 2048)
    smallest = _smallest_array_bytes(small)
    for name, a, b in zip(("prefill", "decode"), small_temps, large_temps, strict=True):
        assert b - a < smallest / 2, (
            f"{name}: temporaries {a} → {b} bytes with a {smallest}-byte smallest array"
        )

    # and a prefill writes the stored (bits) arrays
    small.prefill(0, list(range(3, 19)), 0)
    k = np.asarray(small.cache[0]["k"])
    assert k.dtype == (np.uint16 if kv_dtype == "bf16" else np.int8) and k.any()
