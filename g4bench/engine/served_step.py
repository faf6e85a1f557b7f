"""The served step: one description of the decode/prefill step `serve` runs, shared by every command.

    step = ServedStep.served()                       # what `g4bench serve` runs on this platform
    ecfg = step.engine_config(max_slots=8, max_len=8192)
    step.describe()    # "paged/16 · ring sliding KV · bf16 KV · donated · mixed ≤512 tokens · chunk 256"
    step.differences(other)   # ["kv_layout: paged vs contiguous", ...]

`serve` (LaunchSpec), `revalidate`, `roofline`, `capacity`, `engine-steps` and the simulator's
virtual engine all build their engine configuration from a ServedStep, so what the main job times
is what the server runs unless a flag says otherwise. A step-time profile records the step it was
fitted on (`to_dict`), and `plan` compares it with the step it simulates (`differences`).

Fields:
- kv_layout: "paged" (block pools + tables, the server's) or "contiguous" (slots × max_len rows,
  the reference article's);
- sliding_kv: "ring" (window-sized ring for sliding layers, the server's) or "full" (max_len);
- kv_dtype: "bf16" or "int8";
- donate: the cache is donated to each call (updated in place);
- block_size: paged block size in tokens;
- chunk_size: the largest prefill chunk one request contributes to one call;
- max_batched_tokens: the token budget of one engine call, decode tokens plus prefill tokens
  (vLLM's `--max-num-batched-tokens`);
- prefill_policy: "mixed" (decode rows and budgeted prefill chunks of several prompts in one call)
  or "chunk" (one prefill chunk of one prompt per loop turn beside a separate decode call; the older
  policy, kept for side-by-side measurement);
- attention: "auto" (the platform's attention implementation) or a named one.

`check_speculation` holds the rules a step must meet for speculative decoding (spec_batch.py);
`LaunchSpec` checks them before the model loads, `SpecDecoder` on the engine it is given.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields, replace
from typing import Any

KV_LAYOUTS = ("paged", "contiguous")
SLIDING_KV = ("ring", "full")
KV_DTYPES = ("bf16", "int8")
PREFILL_POLICIES = ("mixed", "chunk")
DEFAULT_MAX_BATCHED_TOKENS = 512


def check_speculation(k: int, *, chunk_size: int, kv_layout: str, sliding_kv: str) -> None:
    """ValueError unless k drafts per round fit a step of this shape: k below the chunk size, and
    a cache that survives k rejected positions past the context (the contiguous ring of W positions
    would lose keys the window still reads)."""
    if not 1 <= k < chunk_size:
        raise ValueError(f"spec k must be 1..{chunk_size - 1} (below the chunk size), got {k}")
    if kv_layout == "contiguous" and sliding_kv == "ring":
        raise ValueError(
            "speculative decoding needs the paged KV layout or --sliding-kv full: a contiguous ring "
            "holds exactly the window, and a rejected draft's write would overwrite a key it still reads"
        )


@dataclass(frozen=True)
class ServedStep:
    kv_layout: str = "paged"
    sliding_kv: str = "ring"
    kv_dtype: str = "bf16"
    donate: bool = True
    block_size: int = 16
    chunk_size: int = 256
    max_batched_tokens: int = DEFAULT_MAX_BATCHED_TOKENS
    prefill_policy: str | None = None  # None: mixed when paged, chunk when contiguous
    attention: str = "auto"

    def __post_init__(self) -> None:
        choices = {"kv_layout": KV_LAYOUTS, "sliding_kv": SLIDING_KV, "kv_dtype": KV_DTYPES,
                   "prefill_policy": PREFILL_POLICIES}  # fmt: skip
        for name, allowed in choices.items():
            if name == "prefill_policy" and self.prefill_policy is None:
                continue
            if getattr(self, name) not in allowed:
                raise ValueError(f"{name} must be one of {', '.join(allowed)}; got {getattr(self, name)!r}")
        for name in ("block_size", "chunk_size", "max_batched_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")

    @classmethod
    def served(cls, **overrides: Any) -> ServedStep:
        """What `g4bench serve` runs (on every platform today; the attention implementation is
        resolved per platform by the engine), with `overrides` applied."""
        return cls(**overrides)

    def with_(self, **changes: Any) -> ServedStep:
        """This step with some fields changed; None values are ignored (unset flags)."""
        return replace(self, **{k: v for k, v in changes.items() if v is not None})

    def engine_config(self, *, max_slots: int, max_len: int, **extra: Any):
        """The EngineConfig that runs this step (extra: keep_logits, cached_windows, kv_blocks, ...)."""
        from g4bench.engine.engine_config import EngineConfig

        return EngineConfig(
            max_slots=max_slots,
            max_len=max_len,
            kv_dtype=self.kv_dtype,
            sliding_kv=self.sliding_kv,
            chunk_size=self.chunk_size,
            donate=self.donate,
            kv_layout=self.kv_layout,
            block_size=self.block_size,
            max_batched_tokens=self.max_batched_tokens,
            prefill_policy=self.prefill_policy,
            **extra,
        )

    def describe(self) -> str:
        layout = f"paged/{self.block_size}" if self.kv_layout == "paged" else "contiguous"
        policy = (f"mixed ≤{self.max_batched_tokens} tokens" if self.policy == "mixed"
                  else "one chunk per turn")  # fmt: skip
        parts = [layout, f"{self.sliding_kv} sliding KV", f"{self.kv_dtype} KV",
                 "donated" if self.donate else "copying", policy, f"chunk {self.chunk_size}"]  # fmt: skip
        if self.attention != "auto":
            parts.append(f"attention {self.attention}")
        return " · ".join(parts)

    @property
    def policy(self) -> str:
        """The prefill policy this step runs: the one set, else mixed when paged."""
        return self.prefill_policy or ("mixed" if self.kv_layout == "paged" else "chunk")

    def to_dict(self) -> dict[str, Any]:
        """Every field, the prefill policy resolved (what a profile records)."""
        return {**asdict(self), "prefill_policy": self.policy}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ServedStep:
        """A step from `to_dict` output; unknown keys are an error naming them."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown served-step fields: {', '.join(unknown)}")
        return cls(**data)

    def differences(self, other: ServedStep, *, fields_: tuple[str, ...] | None = None) -> list[str]:
        """`name: mine vs theirs` for every field (of `fields_`, default all) where the steps differ."""
        names = fields_ or tuple(f.name for f in fields(self))
        mine, theirs = self.to_dict(), other.to_dict()
        return [f"{n}: {mine[n]} vs {theirs[n]}" for n in names if mine[n] != theirs[n]]
