"""logprobs from the device equal log_softmax of the logits at the chosen id (f32, 1e-5);
top_logprobs are sorted and led by the greedy choice; OpenAI response shapes."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from g4bench.engine.grammar import BYTE_OFFSET
from g4bench.engine.logprobs import (
    TokenLogprob,
    chat_logprobs,
    completion_logprobs,
    rows_from_step,
    step_logprobs,
    validate_top_logprobs,
)
from g4bench.engine.sampling import SamplingParams, SamplingState, sample


def byte_piece(token: int) -> bytes:
    return bytes([token - BYTE_OFFSET]) if BYTE_OFFSET <= token < 256 + BYTE_OFFSET else b""


@pytest.mark.parametrize(("vocab", "scale", "dtype"), [(512, 1.0, jnp.float32), (262_144, 30.0, jnp.float32),
                                                       (4096, 8.0, jnp.bfloat16)])  # fmt: skip
def test_equal_to_log_softmax_and_sorted(vocab, scale, dtype):
    rng = np.random.default_rng(vocab)
    logits = jnp.asarray(rng.standard_normal((4, vocab)) * scale, dtype)
    state = SamplingState.greedy(4).with_slot(1, SamplingParams(temperature=1.0, seed=3))
    chosen = sample(logits, jnp.arange(4), state)  # rows 0, 2, 3 greedy; row 1 sampled
    picked, top_ids, top_lps = step_logprobs(logits, chosen, k=5)
    reference = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    np.testing.assert_allclose(
        np.asarray(picked), np.asarray(reference)[np.arange(4), np.asarray(chosen)], atol=1e-5
    )
    np.testing.assert_allclose(
        np.asarray(top_lps),
        np.take_along_axis(np.asarray(reference), np.asarray(top_ids), axis=-1),
        atol=1e-5,
    )
    assert (np.diff(np.asarray(top_lps), axis=-1) <= 0).all()
    for row in (0, 2, 3):  # greedy rows: the chosen id is the top-1 and has its logprob
        assert int(top_ids[row, 0]) == int(chosen[row])
        assert float(picked[row]) == pytest.approx(float(top_lps[row, 0]), abs=1e-6)
    assert (np.asarray(top_lps)[:, 0] >= np.asarray(picked) - 1e-6).all()


def test_no_top_alternatives():
    picked, top_ids, top_lps = step_logprobs(jnp.zeros((2, 8)), jnp.array([1, 2]), k=0)
    np.testing.assert_allclose(np.asarray(picked), np.log(1 / 8), atol=1e-6)
    assert top_ids.shape == (2, 0) and top_lps.shape == (2, 0)


def test_rows_and_chat_shape():
    rows = rows_from_step(
        np.array([3 + 104]), np.array([-0.5]), np.array([[3 + 104, 3 + 72]]), np.array([[-0.5, -1.5]])
    )
    assert rows == [TokenLogprob(107, -0.5, ((107, -0.5), (75, -1.5)))]
    body = chat_logprobs(rows, byte_piece, top_logprobs=1)
    assert body == {
        "content": [
            {
                "token": "h",
                "logprob": -0.5,
                "bytes": [104],
                "top_logprobs": [{"token": "h", "logprob": -0.5, "bytes": [104]}],
            }
        ]
    }


def test_completion_shape_offsets_and_partial_utf8():
    rows = [TokenLogprob(3 + ord("a"), -0.1, ((3 + ord("a"), -0.1), (3 + ord("b"), -2.0))),
            TokenLogprob(3 + 0xE2, -0.2, ()), TokenLogprob(3 + ord("c"), -0.3, ())]  # fmt: skip
    body = completion_logprobs(rows, byte_piece, top_logprobs=2, text_offset=10)
    assert body == {
        "tokens": ["a", "\ufffd", "c"],
        "token_logprobs": [-0.1, -0.2, -0.3],
        "top_logprobs": [{"a": -0.1, "b": -2.0}, {}, {}],
        "text_offset": [10, 11, 12],
    }
    chat = chat_logprobs(rows[1:2], byte_piece, top_logprobs=0)
    assert chat["content"][0]["bytes"] == [0xE2]


def test_validate_top_logprobs():
    assert validate_top_logprobs(None) == 0 and validate_top_logprobs(20) == 20
    with pytest.raises(ValueError, match="between 0 and 20"):
        validate_top_logprobs(21)
