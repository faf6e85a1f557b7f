"""One decode step as a benchmark case: the exact program the engine serves with, at a fixed shape.

    bench = make_decode_bench(DecodeCase(model="e2b", kv_dtype="int8", donate=True, batch=32, ctx=8192))
    compile_s = bench.compile()
    state = bench.fresh_inputs()       # cache + tokens, built and blocked on outside the timing
    state = bench.advance(state)       # one decode step over `batch` slots at context `ctx`, blocked;
                                       # its output cache is the next step's input (warm buffers)

Every slot is active at position ctx − 1 and attends over the full `ctx` (KV length bucket = ctx).
`advance` carries the cache from step to step as a server does: a donated step updates it in place,
a copying step writes a new cache and the old one is dropped (that copy is what the variant
measures). `step(fresh_inputs())` is the older protocol (a new cache per sample); it pays page
faults on buffers no server would allocate per step, and is kept only for probes that need a
cold start (capacity). Weights are synthetic with checkpoint shapes (valid for time and memory, not
quality). `abstract_args()` and `jitted` expose the same program to ahead-of-time compilation for a
TPU target (capacity, roofline).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import jax
import jax.numpy as jnp

from g4bench.engine.engine import _decode_step, platform_compute_dtype, resolve_attention_block
from g4bench.engine.engine_config import EngineConfig, default_tables
from g4bench.engine.sampling import SamplingState
from g4bench.model.config import ModelConfig, load_config
from g4bench.model.kv_cache import CacheLayout, cache_bytes, cache_specs, init_cache
from g4bench.model.params import WeightFormat, init_params, param_bytes, param_specs


@dataclass(frozen=True)
class DecodeCase:
    model: str = "e2b"
    layers: str = "w4a16"
    ple: str = "bf16"
    kv_dtype: str = "bf16"
    donate: bool = True
    sliding_kv: str = "full"
    batch: int = 32
    ctx: int = 8192
    embed: str | None = None  # default: f32 with f32 layers, else bf16
    kv_layout: str = "contiguous"  # "paged": block pools read by table (static partition, 16-token blocks)
    block_size: int = 16

    @property
    def weight_format(self) -> WeightFormat:
        embed = self.embed or ("f32" if self.layers == "f32" else "bf16")
        return WeightFormat(layers=self.layers, ple=self.ple, embed=embed)

    @property
    def engine_config(self) -> EngineConfig:
        """The serving engine's configuration of this case (its layout and block tables)."""
        return EngineConfig(
            max_slots=self.batch, max_len=self.ctx, kv_dtype=self.kv_dtype, sliding_kv=self.sliding_kv,
            donate=self.donate, kv_layout=self.kv_layout, block_size=self.block_size, cached_windows=0,
        )  # fmt: skip

    def layout_for(self, cfg: ModelConfig) -> CacheLayout:
        return self.engine_config.layout_for(cfg)

    @property
    def layout(self) -> CacheLayout:
        """The contiguous layout (paged layouts depend on the model: `layout_for`)."""
        return CacheLayout(max_len=self.ctx, kv_dtype=self.kv_dtype, ring=self.sliding_kv == "ring")

    @property
    def name(self) -> str:
        step = "donated" if self.donate else "copying"
        paged = f"/paged-{self.block_size}" if self.kv_layout == "paged" else ""
        return (
            f"layers-{self.layers}/ple-{self.ple}/kv-{self.kv_dtype}/{step}/sliding-{self.sliding_kv}{paged}"
        )


@dataclass
class DecodeBench:
    case: DecodeCase
    cfg: ModelConfig
    compute_dtype: Any
    seed: int = 0
    attention_block: int | None = None  # the engine's: key blocks on the CPU, one pass on accelerators
    params: Any = field(default=None, repr=False)
    compiled: Any = field(default=None, repr=False)

    @property
    def weights_bytes(self) -> int:
        return param_bytes(self.cfg, self.case.weight_format)

    @property
    def layout(self) -> CacheLayout:
        return self.case.layout_for(self.cfg)

    @property
    def kv_bytes(self) -> int:
        return cache_bytes(self.cfg, self.case.batch, self.layout)

    def _tables(self) -> dict[str, jax.Array]:
        tables = default_tables(self.cfg, self.case.engine_config, self.layout)
        return {g: jnp.asarray(t) for g, t in tables.items()}

    @property
    def donate_argnums(self) -> tuple[int, ...]:
        return (1,) if self.case.donate else ()

    @property
    def step_fn(self):
        """The engine's decode program with its static arguments bound:
        f(params, cache, sampling, tokens, positions, active(, block tables when paged))."""
        return partial(
            _decode_step, cfg=self.cfg, layout=self.layout, cdt=self.compute_dtype, kv_len=self.case.ctx,
            attention_block=self.attention_block,
        )  # fmt: skip

    @property
    def jitted(self):
        return jax.jit(self.step_fn, donate_argnums=self.donate_argnums)

    def abstract_args(self, sharding: Any = None) -> tuple[Any, ...]:
        """ShapeDtypeStructs of (params, cache, sampling, tokens, positions, active), optionally placed."""
        B = self.case.batch

        def place(s: jax.ShapeDtypeStruct) -> jax.ShapeDtypeStruct:
            return jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sharding) if sharding is not None else s

        sampling = jax.eval_shape(lambda: SamplingState.greedy(B))
        vec = jax.ShapeDtypeStruct((B,), jnp.int32)
        tree: tuple[Any, ...] = (
            param_specs(self.cfg, self.case.weight_format),
            cache_specs(self.cfg, B, self.layout),
            sampling,
            vec,
            vec,
            jax.ShapeDtypeStruct((B,), jnp.bool_),
        )
        if self.layout.paged:
            tree += (jax.eval_shape(self._tables),)
        return jax.tree_util.tree_map(place, tree)

    def materialize(self) -> Any:
        """The synthetic weights, built on first use; a bench of the same model and weight format
        may take them (`other.params = bench.materialize()`) instead of holding its own copy."""
        if self.params is None:
            self.params = init_params(self.cfg, self.case.weight_format, self.seed)
            jax.block_until_ready(self.params)
        return self.params

    def compile(self) -> float:
        """Materialize synthetic weights (once) and compile the step; returns compile seconds."""
        self.materialize()
        t0 = time.perf_counter()
        self.compiled = self.jitted.lower(*self.abstract_args()).compile()
        return time.perf_counter() - t0

    def fresh_inputs(self) -> tuple[Any, ...]:
        B, ctx = self.case.batch, self.case.ctx
        inputs: tuple[Any, ...] = (
            init_cache(self.cfg, B, self.layout),
            SamplingState.greedy(B),
            jnp.ones((B,), jnp.int32),
            jnp.full((B,), ctx - 1, jnp.int32),
            jnp.ones((B,), jnp.bool_),
        )
        if self.layout.paged:
            inputs += (self._tables(),)
        return jax.block_until_ready(inputs)

    def step(self, inputs: tuple[Any, ...]) -> None:
        if self.compiled is None:
            self.compile()
        jax.block_until_ready(self.compiled(self.params, *inputs))

    def advance(self, state: tuple[Any, ...]) -> tuple[Any, ...]:
        """One step on `state` (from `fresh_inputs` or a previous `advance`); returns the next state,
        whose cache is the step's output. Blocks until the step finished."""
        if self.compiled is None:
            self.compile()
        new_cache, _logits, _next = jax.block_until_ready(self.compiled(self.params, *state))
        return (new_cache, *state[1:])


def make_decode_bench(
    case: DecodeCase, seed: int = 0, compute_dtype: Any = None, attention_block: int | None | str = "auto"
) -> DecodeBench:
    """A benchmark of `case`; nothing is allocated until `compile()`. `compute_dtype` and
    `attention_block` default to the engine's on this host's platform (engine.py); a program compiled
    for another target passes that target's (harness/capacity/aot.py)."""
    if case.ctx < 1 or case.batch < 1:
        raise ValueError(f"batch and ctx must be positive, got batch={case.batch} ctx={case.ctx}")
    return DecodeBench(
        case=case,
        cfg=load_config(case.model),
        compute_dtype=compute_dtype or platform_compute_dtype(),
        seed=seed,
        attention_block=resolve_attention_block(attention_block),
    )
