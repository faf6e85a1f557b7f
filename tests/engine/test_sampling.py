"""On-device sampling: greedy is argmax; temperature/top-k/top-p draws are reproducible per seed and
position, independent of the other slots in the batch; per-slot parameters stay per slot."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from g4bench.engine.sampling import SamplingParams, SamplingState, sample

V = 300
_sample = jax.jit(sample)


def state_of(*params: SamplingParams) -> SamplingState:
    state = SamplingState.greedy(len(params))
    for slot, p in enumerate(params):
        state = state.with_slot(slot, p)
    return state


def logits(rows: int, seed: int = 0, scale: float = 2.0) -> jax.Array:
    return jnp.asarray(np.random.default_rng(seed).standard_normal((rows, V)) * scale, jnp.float32)


def draws(p: SamplingParams, row: jax.Array, n: int = 64) -> np.ndarray:
    """n draws for one logits row at positions 0..n-1 (one batched call)."""
    state = state_of(*[p] * n)
    return np.asarray(_sample(jnp.broadcast_to(row, (n, V)), jnp.arange(n, dtype=jnp.int32), state))


def test_greedy_is_argmax():
    lg = logits(4)
    out = _sample(lg, jnp.zeros(4, jnp.int32), SamplingState.greedy(4))
    np.testing.assert_array_equal(np.asarray(out), np.argmax(np.asarray(lg), axis=-1))


def test_temperature_is_reproducible_and_seed_dependent():
    row = logits(1)[0]
    hot = SamplingParams(temperature=1.0, seed=11)
    a, b = draws(hot, row), draws(hot, row)
    np.testing.assert_array_equal(a, b)
    assert len(set(a.tolist())) > 5  # it really samples
    assert not np.array_equal(a, draws(SamplingParams(temperature=1.0, seed=12), row))


def test_top_k_one_is_greedy_and_top_k_limits_candidates():
    row = logits(1)[0]
    greedy = int(np.argmax(np.asarray(row)))
    assert set(draws(SamplingParams(temperature=5.0, top_k=1, seed=3), row).tolist()) == {greedy}
    top3 = set(np.argsort(np.asarray(row))[-3:].tolist())
    assert set(draws(SamplingParams(temperature=5.0, top_k=3, seed=3), row).tolist()) <= top3


def test_small_top_p_is_greedy():
    row = logits(1)[0]
    out = draws(SamplingParams(temperature=1.0, top_p=1e-6, seed=5), row)
    assert set(out.tolist()) == {int(np.argmax(np.asarray(row)))}


def test_top_p_keeps_the_nucleus():
    """With top_p = 0.5 every draw lies in the smallest prefix of sorted probabilities reaching 0.5."""
    row = logits(1, scale=1.0)[0]
    probs = np.asarray(jax.nn.softmax(row))
    order = np.argsort(-probs)
    cutoff = int(np.searchsorted(np.cumsum(probs[order]), 0.5)) + 1
    out = draws(SamplingParams(temperature=1.0, top_p=0.5, seed=9), row, n=128)
    assert set(out.tolist()) <= set(order[:cutoff].tolist())


def test_per_slot_params_are_independent_and_batch_invariant():
    """A slot's draws depend only on its own params, seed and position: alone or beside others
    (greedy, other seeds, other temperatures) it picks the same tokens."""
    lg = logits(4, seed=1)
    pos = jnp.asarray([5, 9, 13, 17], jnp.int32)
    mine = SamplingParams(temperature=0.8, top_k=50, top_p=0.9, seed=42)
    batched = state_of(SamplingParams(), mine, SamplingParams(temperature=2.0, seed=1), mine)
    out = np.asarray(_sample(lg, pos, batched))
    assert out[0] == int(np.argmax(np.asarray(lg[0])))
    for slot in (1, 3):
        alone = np.asarray(_sample(lg[slot : slot + 1], pos[slot : slot + 1], state_of(mine)))
        assert out[slot] == alone[0]


@pytest.mark.parametrize(
    ("kwargs", "msg"),
    [({"temperature": -1.0}, "temperature"), ({"top_k": -1}, "top_k"), ({"top_p": 0.0}, "top_p")],
)
def test_invalid_params_raise(kwargs, msg):
    with pytest.raises(ValueError, match=msg):
        SamplingParams(**kwargs)
