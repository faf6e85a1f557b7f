"""attend_blocked equals the one-pass attend wherever a real query reads: causal and sliding masks,
int8 scales, bf16 keys, key holes, rows at different positions, ragged block edges, one query
(decode); it skips blocks that no real query can see (a dynamic trip count) without changing the
answer, and widens bf16 keys one block at a time."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from g4bench.model.attention import attend, attend_blocked, visible_keys
from g4bench.model.kv_cache import as_bits
from g4bench.model.paged_kv import PagedKeys


def _case(seed: int, *, B: int, T: int, K: int, nh: int, kvh: int, d: int, scaled: bool):
    rng = np.random.default_rng(seed)
    q = jnp.asarray(rng.standard_normal((B, T, nh, d)), jnp.float32)
    keys = jnp.asarray(rng.standard_normal((B, kvh, K, d)) * 2.0, jnp.float32)
    vals = jnp.asarray(rng.standard_normal((B, kvh, K, d)), jnp.float32)
    ks = jnp.asarray(rng.uniform(0.5, 2.0, (B, kvh, K)), jnp.float32) if scaled else None
    vs = jnp.asarray(rng.uniform(0.5, 2.0, (B, kvh, K)), jnp.float32) if scaled else None
    return q, keys, vals, ks, vs


@pytest.mark.parametrize(
    "T,K,block,window,scaled",
    [
        (8, 64, 16, None, False),  # full causal, K a multiple of the block
        (8, 70, 16, None, True),  # ragged last block (overlaps its predecessor), int8-style scales
        (5, 48, 64, 12, False),  # block larger than K; sliding window
        (16, 96, 8, 20, True),  # many blocks, window, scales
        (1, 80, 16, None, False),  # one query per row: decode
        (1, 80, 16, 24, True),  # decode, sliding window, scales
    ],
)
def test_blocked_matches_one_pass(T: int, K: int, block: int, window: int | None, scaled: bool) -> None:
    B, nh, kvh, d = 2, 4, 2, 8
    q, keys, vals, ks, vs = _case(T * K + block, B=B, T=T, K=K, nh=nh, kvh=kvh, d=d, scaled=scaled)
    starts = np.array([K // 3, K - T])  # two rows, two positions
    q_pos = jnp.asarray(starts[:, None] + np.arange(T)[None, :], jnp.int32)
    n_valid = np.array([max(T - 3, 1), T])  # row 0 has padding queries (if it has more than one)
    q_valid = jnp.asarray(np.arange(T)[None, :] < n_valid[:, None])
    key_pos = jnp.broadcast_to(jnp.arange(K, dtype=jnp.int32)[None, :], (B, K))
    holes = np.ones((B, K), bool)
    holes[0, 1] = holes[1, K // 2] = False  # invalid keys inside the range are skipped
    key_ok = jnp.asarray(holes)

    want = attend(q, keys, vals, ks, vs, visible_keys(key_pos, key_ok, q_pos, window))
    got = attend_blocked(q, keys, vals, ks, vs, key_pos, key_ok, q_pos, q_valid, window=window, block=block)
    real = np.asarray(q_valid)
    np.testing.assert_allclose(np.asarray(got)[real], np.asarray(want)[real], rtol=2e-5, atol=2e-5)


def test_blocks_no_query_sees_are_not_read() -> None:
    """Keys past every real query's position (a bucket's tail) and keys before every window are
    never read: poisoning them with NaN leaves the answer finite and equal to one pass over the rest."""
    B, T, K, nh, kvh, d, block, window = 1, 4, 128, 2, 1, 8, 16, 20
    q, keys, vals, _, _ = _case(7, B=B, T=T, K=K, nh=nh, kvh=kvh, d=d, scaled=False)
    q_pos = jnp.asarray([[60, 61, 62, 63]], jnp.int32)
    q_valid = jnp.ones((B, T), bool)
    key_pos = jnp.arange(K, dtype=jnp.int32)[None, :]
    key_ok = jnp.ones((B, K), bool)
    outside = (np.arange(K) < 32) | (np.arange(K) >= 64)  # blocks 0-1 and 4-7: nothing visible there
    poisoned_k = jnp.where(jnp.asarray(outside)[None, None, :, None], jnp.nan, keys)
    poisoned_v = jnp.where(jnp.asarray(outside)[None, None, :, None], jnp.nan, vals)

    got = attend_blocked(q, poisoned_k, poisoned_v, None, None, key_pos, key_ok, q_pos, q_valid,
                         window=window, block=block)  # fmt: skip
    want = attend(q, keys, vals, None, None, visible_keys(key_pos, key_ok, q_pos, window))
    assert np.isfinite(np.asarray(got)).all()
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=2e-5, atol=2e-5)


def test_blocked_is_one_program_for_every_length() -> None:
    """The trip count is data, not shape: one compiled program serves every query position."""
    B, T, K, nh, kvh, d = 1, 4, 64, 2, 1, 8
    q, keys, vals, _, _ = _case(3, B=B, T=T, K=K, nh=nh, kvh=kvh, d=d, scaled=False)
    key_pos = jnp.arange(K, dtype=jnp.int32)[None, :]
    key_ok = jnp.ones((B, K), bool)
    run = jax.jit(lambda q_pos: attend_blocked(q, keys, vals, None, None, key_pos, key_ok, q_pos,
                                               jnp.ones((B, T), bool), window=None, block=16))  # fmt: skip
    for start in (0, 13, 60):
        q_pos = jnp.asarray(start + np.arange(T)[None, :], jnp.int32)
        want = attend(q, keys, vals, None, None, visible_keys(key_pos, key_ok, q_pos, None))
        np.testing.assert_allclose(np.asarray(run(q_pos)), np.asarray(want), rtol=2e-5, atol=2e-5)
    assert run._cache_size() == 1


def test_bf16_keys_are_widened_block_by_block() -> None:
    """bf16 K/V (the cache's storage) give one pass's answer, and the compiled program holds no f32
    copy of all the keys: XLA:CPU widens a bf16 array carried into a loop whole, which made the
    CPU decode step at a 3,072-key bucket cost 1.3× one at 512 keys (the slicing happens on bits)."""
    B, T, K, nh, kvh, d = 2, 1, 96, 4, 1, 32
    q, keys, vals, _, _ = _case(11, B=B, T=T, K=K, nh=nh, kvh=kvh, d=d, scaled=False)
    kb, vb = keys.astype(jnp.bfloat16), vals.astype(jnp.bfloat16)
    q_pos = jnp.asarray([[40], [90]], jnp.int32)
    key_pos = jnp.broadcast_to(jnp.arange(K, dtype=jnp.int32)[None, :], (B, K))
    key_ok = jnp.ones((B, K), bool)
    run = jax.jit(lambda q, k, v: attend_blocked(q, k, v, None, None, key_pos, key_ok, q_pos,
                                                 jnp.ones((B, T), bool), window=None, block=16))  # fmt: skip
    want = attend(q, kb, vb, None, None, visible_keys(key_pos, key_ok, q_pos, None))
    np.testing.assert_allclose(np.asarray(run(q, kb, vb)), np.asarray(want), rtol=1e-5, atol=1e-5)
    hlo = run.lower(q, kb, vb).compile().as_text()
    assert f"f32[{B},{kvh},{K},{d}]" not in hlo


@pytest.mark.parametrize("window", [None, 20])
def test_paged_read_gathered_block_by_block_matches_dense(window: int | None) -> None:
    """A paged read (pool blocks in a shuffled physical order, int8-style scales) attended block by
    block from the pools equals the same keys gathered whole, and the program holds no gathered
    copy of every key."""
    B, T, nh, kvh, d, bs, nb = 2, 3, 4, 1, 8, 4, 24
    K = nb * bs
    q, keys, vals, ks, vs = _case(5, B=B, T=T, K=K, nh=nh, kvh=kvh, d=d, scaled=True)
    rng = np.random.default_rng(2)
    ids = jnp.asarray(rng.permutation(B * nb).reshape(B, nb) + 1, jnp.int32)  # block 0: the null block

    def pool(x: jax.Array) -> jax.Array:  # [B, kvh, K(, d)] → [1 + B·nb, kvh, bs(, d)] at `ids`
        blocks = jnp.moveaxis(x.reshape(B, kvh, nb, bs, *x.shape[3:]), 2, 1)
        blocks = blocks.reshape(B * nb, kvh, bs, *x.shape[3:])
        out = jnp.zeros((1 + B * nb, *blocks.shape[1:]), x.dtype)
        return out.at[ids.reshape(-1)].set(blocks)

    kb, vb = keys.astype(jnp.bfloat16), vals.astype(jnp.bfloat16)
    dtypes = {"k": jnp.dtype(jnp.bfloat16), "v": jnp.dtype(jnp.bfloat16), "ks": ks.dtype, "vs": vs.dtype}
    pools = {"k": as_bits(pool(kb)), "v": as_bits(pool(vb)), "ks": pool(ks), "vs": pool(vs)}
    q_pos = jnp.asarray([[40, 41, 42], [K - 3, K - 2, K - 1]], jnp.int32)
    key_pos = jnp.broadcast_to(jnp.arange(K, dtype=jnp.int32)[None, :], (B, K))
    key_ok = jnp.ones((B, K), bool)
    q_valid = jnp.ones((B, T), bool)

    def run(pools: dict[str, jax.Array]) -> jax.Array:
        paged = PagedKeys(pools=pools, ids=ids, dtypes=dtypes, block_size=bs)
        return attend_blocked(q, None, None, None, None, key_pos, key_ok, q_pos, q_valid,
                              window=window, block=8, paged=paged)  # fmt: skip

    want = attend(q, kb, vb, ks, vs, visible_keys(key_pos, key_ok, q_pos, window))
    np.testing.assert_allclose(np.asarray(jax.jit(run)(pools)), np.asarray(want), rtol=2e-5, atol=2e-5)
    hlo = jax.jit(run).lower(pools).compile().as_text()
    assert f"[{B},{kvh},{K},{d}]" not in hlo and f"[{B * nb},{kvh},{bs},{d}]" not in hlo
    with pytest.raises(ValueError, match="multiple of its block size"):
        attend_blocked(q, None, None, None, None, key_pos, key_ok, q_pos, q_valid, window=window, block=6,
                       paged=PagedKeys(pools=pools, ids=ids, dtypes=dtypes, block_size=bs))  # fmt: skip
