"""The decode benchmark program at full E2B/E4B size, abstractly: `jax.eval_shape` of the engine's own
decode step over `DecodeBench.abstract_args()` (nothing allocated) gives the token and
cache shapes the engine serves with."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

from g4bench.engine.bench import DecodeCase, make_decode_bench
from g4bench.engine.engine import platform_attention_block
from g4bench.model.params import tree_bytes


@pytest.mark.parametrize(
    ("model", "kv_dtype", "sliding_kv"),
    [("e2b", "bf16", "full"), ("e2b", "int8", "ring"), ("e4b", "bf16", "ring")],
)
def test_decode_step_shapes_at_full_size(model, kv_dtype, sliding_kv):
    batch, ctx = 4, 2048
    bench = make_decode_bench(
        DecodeCase(model=model, kv_dtype=kv_dtype, sliding_kv=sliding_kv, batch=batch, ctx=ctx)
    )
    args = bench.abstract_args()
    cache, logits, nxt = jax.eval_shape(bench.step_fn, *args)
    assert logits is None  # the serving step returns token ids, not f32 [batch, V] logits (keep_logits)
    assert (nxt.shape, nxt.dtype) == ((batch,), jnp.int32)
    # The step returns a cache of exactly the input's structure, shapes and dtypes (donation-compatible).
    assert jax.tree_util.tree_structure(cache) == jax.tree_util.tree_structure(args[1])
    assert [(c.shape, c.dtype) for c in jax.tree_util.tree_leaves(cache)] == [
        (c.shape, c.dtype) for c in jax.tree_util.tree_leaves(args[1])
    ]
    assert tree_bytes(cache) == bench.kv_bytes
    assert len(cache) == bench.cfg.first_kv_shared_layer
    window = 512 if sliding_kv == "ring" else ctx
    assert {c["k"].shape[2] for i, c in enumerate(cache) if not bench.cfg.is_full(i)} == {window}
    assert {c["k"].shape[2] for i, c in enumerate(cache) if bench.cfg.is_full(i)} == {ctx}
    assert bench.weights_bytes == tree_bytes(args[0])


def test_e2b_memory_faithful_case_bytes():
    """The capacity case of DESIGN.md: W4A16 layers, bf16 PLE, full-length bf16 KV, ctx 8192."""
    bench = make_decode_bench(DecodeCase(model="e2b", batch=1, ctx=8192))
    assert bench.weights_bytes == 6_559_782_028
    assert bench.kv_bytes == 18_432 * 8192


def test_rejects_empty_case():
    with pytest.raises(ValueError, match="positive"):
        make_decode_bench(DecodeCase(model="tiny-a", batch=0))


def test_bench_runs_the_engines_attention_unless_told():
    """The bench times the engine's decode program: key-blocked attention where the engine uses it
    (the CPU), one pass where told (harness/capacity/aot.py for an accelerator target); a bad block is refused."""
    case = DecodeCase(model="tiny-a", batch=2, ctx=64)
    assert make_decode_bench(case).attention_block == platform_attention_block()
    assert make_decode_bench(case, attention_block=None).attention_block is None
    with pytest.raises(ValueError, match="attention_block"):
        make_decode_bench(case, attention_block=0)
