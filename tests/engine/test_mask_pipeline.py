"""MaskPipeline + the engine's own on-device sampler: a mixed batch (two constrained slots, one free)
decoded with random logits, greedy and sampled, through `apply_token_bitmask` -> `sampling.sample`."""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import jsonschema
import numpy as np
import pytest

from g4bench.engine.grammar import BYTE_EOS, apply_token_bitmask, byte_vocab, compile_grammar
from g4bench.engine.mask_pipeline import MaskPipeline
from g4bench.engine.sampling import SamplingParams, SamplingState, sample

SCHEMA = {
    "type": "object",
    "properties": {"id": {"type": "integer", "minimum": 0, "maximum": 999}, "tag": {"enum": ["x", "yy"]}},
    "required": ["id", "tag"],
    "additionalProperties": False,
}


@jax.jit
def masked_sample(logits, positions, state, bitmask):
    return sample(apply_token_bitmask(logits, bitmask), positions, state)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_mixed_batch_through_device_sampler(temperature):
    vocab = byte_vocab(512)
    grammar = compile_grammar({"type": "json_schema", "json_schema": {"schema": SCHEMA}})
    pipe = MaskPipeline(slots=3, vocab_size=512)
    pipe.attach(0, vocab.matcher(grammar))
    pipe.attach(2, vocab.matcher(compile_grammar({"type": "json_object"})))
    state = SamplingState.greedy(3)
    for slot in range(3):
        state = state.with_slot(slot, SamplingParams(temperature=temperature, seed=slot))
    rng = np.random.default_rng(5)
    out: dict[int, list[int]] = {0: [], 1: [], 2: []}
    live = {0, 2}
    pipe.submit()
    for step in range(2000):
        logits = rng.standard_normal((3, 512)).astype(np.float32)  # the "forward" of this step
        bitmask = pipe.wait()
        assert (bitmask[1] == -1).all()
        tokens = np.asarray(
            masked_sample(jnp.asarray(logits), jnp.full((3,), step), state, jnp.asarray(bitmask))
        )
        if temperature == 0.0:
            assert tokens[1] == int(np.argmax(logits[1]))  # the free slot is untouched
        for slot in list(live):
            if tokens[slot] == BYTE_EOS:
                live.discard(slot)
                pipe.detach(slot)
        pipe.advance({s: int(tokens[s]) for s in live})
        for s in live:
            out[s].append(int(tokens[s]))
        if not live:
            break
        pipe.submit()
    pipe.close()
    assert not live and not pipe.active
    tok = byte_vocab(512)
    jsonschema.validate(json.loads(tok.decode(out[0])), SCHEMA)
    assert isinstance(json.loads(tok.decode(out[2])), dict)


def test_pipeline_guards_misuse():
    pipe = MaskPipeline(slots=2, vocab_size=512)
    with pytest.raises(RuntimeError, match="without submit"):
        pipe.wait()
    pipe.submit()
    with pytest.raises(RuntimeError, match="in flight"):
        pipe.advance({0: 5})
    assert (pipe.wait() == -1).all()
    with pytest.raises(ValueError, match="vocab"):
        pipe.attach(0, byte_vocab(600).matcher(compile_grammar({"type": "json_object"})))
    pipe.close()
