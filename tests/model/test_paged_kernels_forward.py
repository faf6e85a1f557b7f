"""The whole model with the Pallas paged kernel as its attention (interpret mode) equals the model with
our one-pass attention: a two-row prefill with ragged lengths, then decode steps with an idle row,
on a tiny config with every E-series feature (KV-shared layers of both types, head dims 32 and 64,
a sliding window of 8 crossed by the chunk), for full-length and ring (window-group) sliding KV.
The caches the two write agree as closely (each layer's K/V follows the attention before it). int8 KV is checked at the kernel
(test_paged_kernels.py), not here: quantizing each layer's K/V rounds to int8, so the 1e-6 noise of
any two attention orders flips a few rounded values and moves these logits by 1e-2 (one pass vs
key-blocked attention differ by 0.0101 on this config, kernel vs key-blocked by 9e-6)."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from g4bench.engine.engine_config import EngineConfig, default_tables
from g4bench.model.config import load_config
from g4bench.model.forward import forward
from g4bench.model.kv_cache import init_cache
from g4bench.model.paged_kernels import PagedKernel
from g4bench.model.params import WeightFormat, init_params

# the model's own f32 noise: one pass vs key-blocked attention differ by 1.3e-5 on these logits
ATOL = 5e-5


@pytest.mark.slow  # ~40 s each on a shared 2-core host: interpret mode simulates every grid step
@pytest.mark.parametrize("sliding", ["full", "ring"])
def test_forward_through_the_kernel_matches_one_pass(sliding: str) -> None:
    cfg = load_config("tiny-a")
    params = init_params(cfg, WeightFormat(layers="f32", ple="f32", embed="f32"), seed=3)
    ecfg = EngineConfig(max_slots=2, max_len=64, kv_dtype="f32", sliding_kv=sliding, block_size=4,
                        chunk_size=16, cached_windows=0)  # fmt: skip
    layout = ecfg.layout_for(cfg)
    tables = {g: jnp.asarray(t) for g, t in default_tables(cfg, ecfg, layout).items()}
    rng = np.random.default_rng(1)
    tokens = jnp.asarray(rng.integers(3, cfg.vocab_size, (2, 16)), jnp.int32)
    start, n_valid = jnp.asarray([0, 5], jnp.int32), jnp.asarray([16, 11], jnp.int32)

    def run(attention: PagedKernel | None) -> tuple[list[np.ndarray], list]:
        cache = init_cache(cfg, 2, layout)
        logits, cache = forward(params, tokens, start, n_valid, cache, cfg, layout, kv_len=64, tables=tables,
                                attention_block=attention, all_logits=True)  # fmt: skip
        out = [np.asarray(logits)]
        pos = start + n_valid
        for step in range(2):
            active = jnp.asarray([1, 0 if step == 0 else 1], jnp.int32)  # row 1 idles one step
            tok = jnp.asarray(rng.integers(3, cfg.vocab_size, (2, 1)), jnp.int32)
            logits, cache = forward(params, tok, pos, active, cache, cfg, layout, kv_len=64, tables=tables,
                                    attention_block=attention)  # fmt: skip
            out.append(np.asarray(logits)[np.asarray(active) > 0])
            pos = pos + active
        return out, cache

    state = rng.bit_generator.state
    want, want_cache = run(None)
    rng.bit_generator.state = state  # the same decode tokens
    got, got_cache = run(PagedKernel(pages_per_block=2, interpret=True))
    real = np.arange(16)[None, :] < np.asarray(n_valid)[:, None]
    np.testing.assert_allclose(got[0][real], want[0][real], rtol=0, atol=ATOL)
    for g, w in zip(got[1:], want[1:], strict=True):
        np.testing.assert_allclose(g, w, rtol=0, atol=ATOL)
    for g, w in zip(got_cache, want_cache, strict=True):
        for name in w:
            np.testing.assert_allclose(np.asarray(g[name]), np.asarray(w[name]), rtol=0, atol=ATOL)
