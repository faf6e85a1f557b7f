"""The engine: parameters plus one batched KV state, driven by token ids (it knows nothing of HTTP).

    engine = Engine(cfg, params, EngineConfig(max_slots=8, max_len=8192))
    first = engine.prefill(slot, prompt_chunk, start, sampling)     # chunk by chunk
    nxt = engine.decode(tokens, positions, active)                   # every slot, one token each

`EngineConfig` and the call shapes it implies (buckets, static block tables, call checks) live in
engine_config.py. The cache (`max_slots` × `max_len`) is allocated once. Every call runs one of a small fixed set of
jitted programs (JetStream's prefill / insert / generate split, folded into slot-indexed calls):

- prefill: one slot, a chunk padded to a chunk bucket, reading a bucketed KV length;
- decode: all slots, one token each, attending over the KV length bucket that covers the longest
  active sequence (a ring for sliding layers), sampling on the device so the host reads back one
  token id per slot;
- copy_slot: one slot's KV into another (contiguous prefix sharing).

Prefill and decode attend block by block on the CPU, over only the keys their queries can see
(`attention_block`, g4bench/model/attention.py); one pass on accelerators.

Constrained decoding and logprobs split the decode step in two (the fused one stays for batches that
need neither, so they pay nothing): `decode_logits` (forward only: the cache advances and the f32
[S, V] logits stay on the device) and `sample_logits(logits, positions, rows, bitmask)` (the grammar's
int32[S, ceil(V/32)] bitmask applied before the usual sampler). JAX dispatch is asynchronous, so
the host computes the next mask (g4bench/engine/mask_pipeline.py) while `decode_logits` runs.
`logprobs(logits, chosen, k)` reads back only the chosen ids' log-probabilities and the top k.

KV layouts (`EngineConfig.kv_layout`). "paged" (the default, the server's): one pool of
`block_size`-token blocks per KV-owning layer and per-slot block tables (g4bench/model/paged_kv.py);
the scheduler's BlockCache points tables at shared blocks, so a prefix computed in any slot serves
every other (g4bench/engine/block_cache.py). The "full" group has `kv_blocks` blocks (default
max_slots × max_len / block_size, the contiguous cache's size); with ring sliding KV the sliding
layers form a "window" group sized for each slot's working window (W + chunk) plus
`cached_windows` windows per slot of cache. Until a block manager sets them, the tables partition
the pools statically (slot s's own blocks, a ring of blocks for the window group), so the paged
engine computes exactly what the contiguous one does (tests/engine/test_engine.py runs both).
"contiguous": `max_slots` rows of `max_len` positions (or a ring), prefix reuse by slot copies.

Buckets bound the number of compiles (`warmup()` compiles them all and reports the time). The cache
is donated to each call (`donate=True`), so a step updates it in place; `donate=False` is the
copying variant, kept for measurement (two caches live, one full copy per step). In place needs the
cache's 16-bit floats stored as their uint16 bits: XLA:CPU copies a donated bf16 buffer on every
scatter into it (g4bench/model/kv_cache.py).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from g4bench.engine.engine_config import (
    EngineConfig,
    bucket_for,
    check_prefill,
    decode_kv_len,
    default_tables,
)
from g4bench.engine.grammar import apply_token_bitmask
from g4bench.engine.logprobs import step_logprobs
from g4bench.engine.mixed import PIECE_TOKENS, Piece, check_pieces, mixed_step, pack
from g4bench.engine.sampling import SamplingParams, SamplingState, sample
from g4bench.model.config import ModelConfig
from g4bench.model.forward import forward
from g4bench.model.kv_cache import cache_bytes, init_cache
from g4bench.model.params import Params, tree_bytes


def platform_compute_dtype() -> Any:
    """bf16 on accelerators, f32 on the CPU (XLA's CPU bf16 matmuls are ~10× slower)."""
    return jnp.float32 if jax.default_backend() == "cpu" else jnp.bfloat16


def platform_attention_block() -> int | None:
    """Keys per online-softmax block in prefill and decode attention: 256 on the CPU, where a
    one-pass product over a bucket's scores (and f32 copies of its keys and values) outgrows the
    caches (g4bench/model/attention.py); None (one fused pass) on accelerators, where one large
    product is fastest."""
    return 256 if jax.default_backend() == "cpu" else None


def resolve_attention_block(value: int | None | str) -> int | None:
    """An `attention_block` argument: "auto" is the platform's; else a positive int or None."""
    if value == "auto":
        return platform_attention_block()
    if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
        raise ValueError(f"attention_block must be a positive int, None or 'auto', got {value!r}")
    return value


class Engine:
    """Owns params and the batched KV cache; see the module docstring for the call protocol."""

    def __init__(
        self,
        cfg: ModelConfig,
        params: Params,
        ecfg: EngineConfig | None = None,
        compute_dtype: Any = None,
        attention_block: int | None | str = "auto",
    ):
        self.cfg = cfg
        self.ecfg = ecfg or EngineConfig()
        self.layout = self.ecfg.layout_for(cfg)
        self.compute_dtype = compute_dtype or platform_compute_dtype()
        self.attention_block = resolve_attention_block(attention_block)
        self.params = params
        self.cache = init_cache(cfg, self.ecfg.max_slots, self.layout)
        self.tables = default_tables(cfg, self.ecfg, self.layout)
        self.sampling = SamplingState.greedy(self.ecfg.max_slots)
        self.eos_token_ids = frozenset(cfg.eos_token_ids)
        self.last_logits: jax.Array | None = None  # most recent call's logits (decode: keep_logits only)
        donate = (1,) if self.ecfg.donate else ()
        bound = dict(
            cfg=cfg, layout=self.layout, cdt=self.compute_dtype, attention_block=self.attention_block
        )

        def step_program(fn, **extra):
            """`fn` jitted with this engine's static arguments; the KV bucket is the one left static."""
            return jax.jit(partial(fn, **bound, **extra), static_argnames=("kv_len",), donate_argnums=donate)

        self._prefill = step_program(_prefill_step)
        self._decode = step_program(_decode_step, keep_logits=self.ecfg.keep_logits)
        self._forward = step_program(_decode_forward)
        self._mixed = step_program(mixed_step)
        self._mixed_logits = step_program(mixed_step, sample_decode=False)
        self._piece_logits: dict[int, jax.Array] = {}  # slot → logits [V] of its last piece (last step)
        self._sample = jax.jit(partial(_masked_sample, eos_ids=tuple(cfg.eos_token_ids)))
        self._copy = jax.jit(_copy_row, donate_argnums=(0,) if self.ecfg.donate else ())

    # ------------------------------------------------------------------ facts
    @property
    def weights_bytes(self) -> int:
        return tree_bytes(self.params)

    @property
    def kv_cache_bytes(self) -> int:
        return cache_bytes(self.cfg, self.ecfg.max_slots, self.layout)

    def set_block_table(self, slot: int, group: str, ids: Sequence[int]) -> None:
        """Paged: name the physical blocks of `slot`'s logical blocks 0.. in `group` ("full" or
        "window"); the rest of the row becomes the null block 0."""
        # Calls get copies of the tables: on the CPU jnp.asarray may alias a numpy buffer, and a
        # dispatched step may still be reading it when the next table update lands.
        row = self.tables[group][slot]
        if len(ids) > row.size:
            raise ValueError(f"{len(ids)} blocks exceed the table length {row.size}")
        row[:] = 0
        row[: len(ids)] = ids

    def can_resume(self, cached_len: int, common_prefix: int) -> bool:
        """Contiguous: can a slot holding `cached_len` tokens continue a prompt sharing
        `common_prefix` of them? A ring has overwritten positions older than the window, so it must
        resume at its end. (The paged layout shares blocks instead: g4bench/engine/block_cache.py.)"""
        if common_prefix <= 0 or common_prefix > cached_len:
            return False
        if self.layout.ring and self.cfg.sliding_window < self.ecfg.max_len:
            return common_prefix == cached_len
        return True

    # ------------------------------------------------------------------ calls
    def prefill(
        self, slot: int, tokens: Sequence[int], start: int, sampling: SamplingParams | None = None
    ) -> int | None:
        """Write `tokens` (1..chunk_size) at positions start.. of `slot`. With `sampling`, install it
        for the slot and return the next token sampled from the last position."""
        n = check_prefill(self.ecfg, slot, tokens, start)
        if sampling is not None:
            self.sampling = self.sampling.with_slot(slot, sampling)
        chunk = bucket_for(n, self.ecfg.chunk_buckets)
        padded = np.zeros((1, chunk), np.int32)
        padded[0, :n] = tokens
        kv_len = bucket_for(start + n, self.ecfg.kv_buckets)
        self.cache, logits, nxt = self._prefill(
            self.params,
            self.cache,
            self.sampling,
            jnp.asarray(padded),
            jnp.asarray([start], jnp.int32),
            jnp.asarray([n], jnp.int32),
            jnp.asarray(slot, jnp.int32),
            {g: jnp.asarray(t[slot : slot + 1].copy()) for g, t in self.tables.items()},
            kv_len=kv_len,
        )
        self.last_logits = logits
        return int(nxt) if sampling is not None else None

    def decode(self, tokens: np.ndarray, positions: np.ndarray, active: np.ndarray) -> np.ndarray:
        """One step for every slot: feed tokens[i] at positions[i] where active[i]; returns i32[max_slots]."""
        active = np.asarray(active, bool)
        positions = np.asarray(positions, np.int32)
        kv_len = decode_kv_len(self.ecfg, positions, active)
        self.cache, logits, nxt = self._decode(
            self.params,
            self.cache,
            self.sampling,
            jnp.asarray(tokens, jnp.int32),
            jnp.asarray(positions),
            jnp.asarray(active),
            {g: jnp.asarray(t.copy()) for g, t in self.tables.items()},
            kv_len=kv_len,
        )
        self.last_logits = logits
        return np.asarray(nxt)

    def decode_logits(self, tokens: np.ndarray, positions: np.ndarray, active: np.ndarray) -> jax.Array:
        """The forward half of `decode`: the cache advances; returns the f32 [S, V] logits (on the
        device, not yet computed when this returns) for `sample_logits` and `logprobs`."""
        active = np.asarray(active, bool)
        positions = np.asarray(positions, np.int32)
        kv_len = decode_kv_len(self.ecfg, positions, active)
        self.cache, logits = self._forward(
            self.params,
            self.cache,
            jnp.asarray(tokens, jnp.int32),
            jnp.asarray(positions),
            jnp.asarray(active),
            {g: jnp.asarray(t.copy()) for g, t in self.tables.items()},
            kv_len=kv_len,
        )
        self.last_logits = logits
        return logits

    def step(
        self,
        tokens: np.ndarray,
        positions: np.ndarray,
        active: np.ndarray,
        pieces: Sequence[Piece],
        *,
        decode_logits: bool = False,
    ) -> tuple[Any, dict[int, int]]:
        """The mixed step (g4bench/engine/mixed.py): every active slot's next token (as `decode`)
        and the prefill `pieces` of other slots in one call. Returns (decode next ids i32[S], or
        with `decode_logits` the f32 [S, V] logits on the device for `sample_logits`; {slot: first
        token} of each piece with sampling). `piece_logits(slot)` then holds each piece's last logits."""
        active = np.asarray(active, bool)
        positions = np.asarray(positions, np.int32)
        e = self.ecfg
        n_rows = check_pieces(pieces, max_slots=e.max_slots, chunk_size=e.chunk_size, max_len=e.max_len,
                              active=active)  # fmt: skip
        if not pieces:
            raise ValueError("a mixed step needs at least one prefill piece (use decode otherwise)")
        rows = bucket_for(n_rows, e.row_buckets)
        for p in pieces:
            if p.sampling is not None:
                self.sampling = self.sampling.with_slot(p.slot, p.sampling)
        packed = pack(pieces, rows)
        top = max(p.start + len(p.tokens) for p in pieces)
        kv_len = bucket_for(max(top, decode_kv_len(e, positions, active)), e.kv_buckets)
        program = self._mixed_logits if decode_logits else self._mixed
        self.cache, p_logits, d_out, p_next = program(
            self.params,
            self.cache,
            self.sampling,
            jnp.asarray(tokens, jnp.int32),
            jnp.asarray(positions),
            jnp.asarray(active),
            {g: jnp.asarray(t.copy()) for g, t in self.tables.items()},
            jnp.asarray(packed.tokens),
            jnp.asarray(packed.start),
            jnp.asarray(packed.n_valid),
            jnp.asarray(packed.slots),
            jnp.asarray(packed.pick),
            kv_len=kv_len,
        )
        self._piece_logits = {slot: p_logits[packed.pick_index(slot)] for slot in packed.sampled_rows}
        first = np.asarray(p_next) if packed.sampled_rows else None
        out = (
            {slot: int(first[packed.pick_index(slot)]) for slot in packed.sampled_rows}
            if first is not None
            else {}
        )
        return (d_out if decode_logits else np.asarray(d_out)), out

    def piece_logits(self, slot: int) -> jax.Array:
        """f32 [1, V]: the logits at the last position of `slot`'s sampling piece in the last `step`."""
        return self._piece_logits[slot][None]

    @property
    def piece_tokens(self) -> int:
        return PIECE_TOKENS

    def sample_logits(
        self, logits: jax.Array, positions: np.ndarray, rows: np.ndarray, bitmask: np.ndarray | None
    ) -> np.ndarray:
        """Sample logits f32[R, V] with the sampling settings of slots `rows` (i32[R]) at `positions`
        (i32[R], the positions predicted from); `bitmask` int32[R, ceil(V/32)] (None: no mask) bans
        ids before the sampler, so greedy and sampled decoding both obey it. Returns i32[R]."""
        logits = logits.reshape(-1, logits.shape[-1])
        words = (logits.shape[-1] + 31) // 32
        mask = np.full((logits.shape[0], words), -1, np.int32) if bitmask is None else bitmask.copy()
        nxt = self._sample(
            logits, jnp.asarray(positions, jnp.int32), self.sampling, jnp.asarray(rows, jnp.int32), mask
        )
        return np.asarray(nxt)

    def logprobs(self, logits: jax.Array, chosen: np.ndarray, k: int) -> tuple[np.ndarray, ...]:
        """Host copies of (chosen logprob f32[R], top ids i32[R, k], top logprobs f32[R, k])."""
        logits = logits.reshape(-1, logits.shape[-1])
        out = step_logprobs(logits, jnp.asarray(chosen, jnp.int32), k)
        return tuple(np.asarray(x) for x in out)

    def set_suppress_eos(self, slot: int, on: bool) -> None:
        """While on, the slot's sampler never picks an EOS id (a request's `min_tokens`)."""
        self.sampling = self.sampling.with_suppress_eos(slot, on)

    def copy_slot(self, src: int, dst: int) -> None:
        if self.layout.paged:
            raise ValueError("copy_slot: a paged cache shares blocks through block tables, not copies")
        self.cache = self._copy(self.cache, jnp.asarray(src, jnp.int32), jnp.asarray(dst, jnp.int32))

    def warmup(self) -> float:
        """Compile every bucket program (prefill × chunk × KV buckets, decode × KV buckets, copy);
        the cache contents are left as garbage, which is fine: slots are written before being read."""
        t0 = time.perf_counter()
        for kv_len in self.ecfg.kv_buckets:
            for chunk in self.ecfg.chunk_buckets:
                start = max(0, min(kv_len, self.ecfg.max_len) - chunk)
                self.prefill(0, [self.cfg.pad_token_id] * min(chunk, self.ecfg.max_len - start), start)
            positions = np.full((self.ecfg.max_slots,), kv_len - 1, np.int32)
            self.decode(np.zeros_like(positions), positions, np.ones_like(positions, bool))
            if self.ecfg.policy == "mixed":
                self._warm_mixed(kv_len)
        if not self.layout.paged:
            self.copy_slot(0, 0)
        jax.block_until_ready(self.cache)
        return time.perf_counter() - t0

    def _warm_mixed(self, kv_len: int) -> None:
        """Compile the mixed step at every row bucket for KV bucket `kv_len` (slot 0 decodes, the
        pieces go to slots 1..; with one slot, pieces only)."""
        S, e = self.ecfg.max_slots, self.ecfg
        positions = np.full((S,), max(0, min(kv_len, e.max_len) - 1), np.int32)
        active = np.zeros(S, bool)
        active[0] = S > 1
        for rows in e.row_buckets:
            pieces, left, slot = [], rows * PIECE_TOKENS, 1 if S > 1 else 0
            while left > 0 and slot < S:
                n = min(left, e.chunk_size, e.max_len)
                start = max(0, min(kv_len, e.max_len) - n)
                pieces.append(Piece(slot, [self.cfg.pad_token_id] * n, start))
                left -= -(-n // PIECE_TOKENS) * PIECE_TOKENS
                slot += 1
            self.step(np.zeros(S, np.int32), positions, active, pieces)

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        max_tokens: int,
        sampling: SamplingParams | None = None,
        *,
        ignore_eos: bool = False,
    ) -> Generation:
        """Batch helper (CLI `generate`, tests): each prompt prefilled chunk by chunk into its own
        slot (timed as one span), then all slots decoded together (timed per step) until each has
        `max_tokens` tokens or emitted EOS (unless `ignore_eos`). Both calls return host values,
        so the clock stops only after the device finished."""
        if len(prompts) > self.ecfg.max_slots:
            raise ValueError(f"{len(prompts)} prompts but only {self.ecfg.max_slots} slots")
        sampling = sampling or SamplingParams()
        S, chunk = self.ecfg.max_slots, self.ecfg.chunk_size
        tokens, positions, active = np.zeros(S, np.int32), np.zeros(S, np.int32), np.zeros(S, bool)
        out = Generation(outputs=[[] for _ in prompts])
        t0 = time.perf_counter()
        for slot, prompt in enumerate(prompts):
            if len(prompt) + max_tokens > self.ecfg.max_len:
                raise ValueError(
                    f"prompt {slot}: {len(prompt)} + {max_tokens} tokens exceed max_len {self.ecfg.max_len}"
                )
            for s in range(0, len(prompt), chunk):
                nxt = self.prefill(
                    slot, prompt[s : s + chunk], s, sampling if s + chunk >= len(prompt) else None
                )
            assert nxt is not None  # the last chunk carries `sampling`, so it samples
            out.outputs[slot].append(nxt)
            tokens[slot], positions[slot] = nxt, len(prompt)
            active[slot] = max_tokens > 1 and (ignore_eos or nxt not in self.eos_token_ids)
        out.prefill_s = time.perf_counter() - t0
        while active.any():
            t = time.perf_counter()
            sampled = self.decode(tokens, positions, active)
            out.step_s.append(time.perf_counter() - t)
            for slot in np.flatnonzero(active).tolist():
                out.outputs[slot].append(int(sampled[slot]))
                out.decode_tokens += 1
                tokens[slot], positions[slot] = sampled[slot], positions[slot] + 1
                eos = not ignore_eos and int(sampled[slot]) in self.eos_token_ids
                active[slot] = len(out.outputs[slot]) < max_tokens and not eos
        return out


@dataclass
class Generation:
    """What `Engine.generate` produced: tokens per prompt and where the time went."""

    outputs: list[list[int]]
    prefill_s: float = 0.0
    step_s: list[float] = field(default_factory=list)
    decode_tokens: int = 0

    @property
    def decode_s(self) -> float:
        return float(sum(self.step_s))


# ---------------------------------------------------------------------------- jitted programs
def _prefill_step(
    params,
    cache,
    sampling,
    tokens,
    start,
    n_valid,
    slot,
    tables,
    *,
    cfg,
    layout,
    cdt,
    kv_len,
    attention_block,
):
    """One slot's chunk: the model writes the chunk's positions of cache row `slot` (paged: of the
    blocks its table row names) and reads that row's first kv_len positions; nothing else of the
    cache is touched."""
    logits, cache = forward(
        params, tokens, start, n_valid, cache, cfg, layout, kv_len=kv_len, compute_dtype=cdt,
        rows=None if layout.paged else slot[None], tables=tables, attention_block=attention_block,
    )  # fmt: skip
    row_state = jax.tree_util.tree_map(lambda x: jax.lax.dynamic_slice_in_dim(x, slot, 1), sampling)
    nxt = sample(logits, start + n_valid - 1, row_state, cfg.eos_token_ids)
    return cache, logits[0], nxt[0]


def _decode_step(
    params, cache, sampling, tokens, positions, active, tables=None, *, cfg, layout, cdt, kv_len,
    keep_logits=False, attention_block=None,
):  # fmt: skip
    """Every slot one token: (cache, logits f32 [S, V] if keep_logits else None, next ids i32 [S])."""
    logits, cache = forward(
        params,
        tokens[:, None],
        positions,
        active.astype(jnp.int32),
        cache,
        cfg,
        layout,
        kv_len=kv_len,
        compute_dtype=cdt,
        tables=tables,
        attention_block=attention_block,
    )
    return cache, (logits if keep_logits else None), sample(logits, positions, sampling, cfg.eos_token_ids)


def _decode_forward(
    params, cache, tokens, positions, active, tables, *, cfg, layout, cdt, kv_len, attention_block=None
):
    """`_decode_step` without the sampler: (cache, logits f32 [S, V])."""
    logits, cache = forward(
        params, tokens[:, None], positions, active.astype(jnp.int32), cache, cfg, layout,
        kv_len=kv_len, compute_dtype=cdt, tables=tables, attention_block=attention_block,
    )  # fmt: skip
    return cache, logits


def _masked_sample(logits, positions, sampling, rows, bitmask, *, eos_ids):
    """The grammar's bitmask, then the usual sampler with the sampling rows of slots `rows`."""
    state = jax.tree_util.tree_map(lambda x: x[rows], sampling)
    return sample(apply_token_bitmask(logits.astype(jnp.float32), bitmask), positions, state, eos_ids)


def _copy_row(cache, src, dst):
    return jax.tree_util.tree_map(
        lambda x: jax.lax.dynamic_update_slice_in_dim(
            x, jax.lax.dynamic_slice_in_dim(x, src, 1, axis=0), dst, axis=0
        ),
        cache,
    )
