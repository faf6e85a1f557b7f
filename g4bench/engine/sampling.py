"""Token sampling on the device: greedy, temperature, top-k, top-p, per-request seeds.

The engine keeps one row of sampling parameters per slot as device arrays, so one jitted decode step
samples every slot with its own settings and the host reads back only one token id per slot.

Randomness is reproducible and independent of batching: the key for a slot's draw at logical
position `p` is `fold_in(PRNGKey(seed), p)`, so the same request gives the same tokens whether it
runs alone or beside seven others.

Top-k and top-p act on the `CANDIDATES` highest logits (a `lax.top_k` of the vocabulary, not a full
sort of 262,144 entries every step); `top_k=0` means no top-k limit within those candidates.
Greedy (`temperature == 0`) is an exact argmax over the whole vocabulary.
"""

from __future__ import annotations

from dataclasses import dataclass

import jax
import jax.numpy as jnp

CANDIDATES = 256


@dataclass(frozen=True)
class SamplingParams:
    """How to pick the next token for one request. `temperature == 0` is greedy."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 0
    suppress_eos: bool = False  # start with EOS ids banned (min_tokens); Engine.set_suppress_eos lifts it

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0, got {self.top_k}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")


@dataclass
class SamplingState:
    """Per-slot sampling parameters as device arrays (a PyTree): [slots] each."""

    temperature: jax.Array  # f32[S]
    top_k: jax.Array  # i32[S]
    top_p: jax.Array  # f32[S]
    seed: jax.Array  # u32[S]
    suppress_eos: jax.Array  # bool[S]: EOS ids get no probability (min_tokens not yet reached)

    @classmethod
    def greedy(cls, slots: int) -> SamplingState:
        return cls(
            temperature=jnp.zeros((slots,), jnp.float32),
            top_k=jnp.zeros((slots,), jnp.int32),
            top_p=jnp.ones((slots,), jnp.float32),
            seed=jnp.zeros((slots,), jnp.uint32),
            suppress_eos=jnp.zeros((slots,), jnp.bool_),
        )

    def with_slot(self, slot: int, p: SamplingParams) -> SamplingState:
        return SamplingState(
            temperature=self.temperature.at[slot].set(p.temperature),
            top_k=self.top_k.at[slot].set(p.top_k),
            top_p=self.top_p.at[slot].set(p.top_p),
            seed=self.seed.at[slot].set(jnp.uint32(p.seed % (2**32))),
            suppress_eos=self.suppress_eos.at[slot].set(p.suppress_eos),
        )

    def with_suppress_eos(self, slot: int, on: bool) -> SamplingState:
        return SamplingState(
            self.temperature, self.top_k, self.top_p, self.seed, self.suppress_eos.at[slot].set(on)
        )


jax.tree_util.register_dataclass(
    SamplingState, data_fields=["temperature", "top_k", "top_p", "seed", "suppress_eos"], meta_fields=[]
)


def sample(
    logits: jax.Array, positions: jax.Array, state: SamplingState, eos_ids: tuple[int, ...] = ()
) -> jax.Array:
    """Pick one token per row. logits f32[S, V]; positions i32[S] (the position being predicted
    from, used to derive the key); rows with `suppress_eos` never pick an id in `eos_ids`
    (a request's min_tokens). Returns i32[S]."""
    logits = logits.astype(jnp.float32)
    if eos_ids:
        is_eos = jnp.zeros((logits.shape[-1],), bool).at[jnp.asarray(eos_ids)].set(True)
        logits = jnp.where(state.suppress_eos[:, None] & is_eos[None, :], -jnp.inf, logits)
    greedy = jnp.argmax(logits, axis=-1).astype(jnp.int32)

    k = min(CANDIDATES, logits.shape[-1])
    top_vals, top_idx = jax.lax.top_k(logits, k)  # [S, k], sorted descending
    temp = jnp.where(state.temperature > 0, state.temperature, 1.0)[:, None]
    scaled = top_vals / temp
    rank = jnp.arange(k)[None, :]
    keep_k = jnp.where(state.top_k[:, None] > 0, rank < state.top_k[:, None], True)
    scaled = jnp.where(keep_k, scaled, -jnp.inf)
    probs = jax.nn.softmax(scaled, axis=-1)
    # top-p: keep the smallest prefix whose mass reaches top_p (the first token always stays).
    mass_before = jnp.cumsum(probs, axis=-1) - probs
    keep_p = mass_before < state.top_p[:, None]
    scaled = jnp.where(keep_p, scaled, -jnp.inf)

    def draw(seed, pos, row):
        key = jax.random.fold_in(jax.random.PRNGKey(seed), pos)
        return jax.random.categorical(key, row)

    choice = jax.vmap(draw)(state.seed, positions, scaled)
    sampled = jnp.take_along_axis(top_idx, choice[:, None], axis=-1)[:, 0].astype(jnp.int32)
    return jnp.where(state.temperature > 0, sampled, greedy)
