"""A hand-checkable stand-in for `g4bench.engine.engine.Engine` (same API, no jax).

Each slot keeps the list of token ids "in its KV cache" (positions 0..len-1). The next token is a
deterministic function of that whole list, so a scheduler that reuses the wrong prefix, skips or
repeats a position, or mixes up slots produces different tokens than the request run alone:

    h = (sum(ids) * 31 + len(ids) [+ 17 * seed + 1 when temperature > 0]) % 95
    next = EOS (1)          if eos_mod and (sum(ids) * 7 + len(ids)) % eos_mod == 0
           3 + 32 + h       otherwise (a printable ASCII character under the synthetic tokenizer)

Fault injection: `decode_error` is raised by the next decode (an Exception fails that step's
requests; a BaseException kills the engine loop), and `decode_gate` (an Event) makes every decode
wait for it, which is how a stalled device call looks from the outside.

API misuse (a gap before `start`, a decode position that is not the slot's end, a ring slot resumed
from anywhere but its end) is recorded in `violations`; tests assert it stays empty.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from g4bench.engine.sampling import SamplingParams

EOS = 1


@dataclass(frozen=True)
class FakeModelConfig:
    vocab_size: int = 512


@dataclass(frozen=True)
class FakeEngineConfig:
    max_slots: int = 4
    max_len: int = 256
    kv_dtype: str = "bf16"
    sliding_kv: str = "full"
    chunk_size: int = 16
    donate: bool = True


def next_token(
    ids: Sequence[int], sampling: SamplingParams | None = None, eos_mod: int = 0, suppress_eos: bool = False
) -> int:
    """The fake model: the token that follows `ids` (the whole sequence so far). With `suppress_eos`
    (the engine's EOS ban, min_tokens) the EOS branch is skipped and the ordinary token comes out."""
    total, n = sum(ids), len(ids)
    if eos_mod and not suppress_eos and (total * 7 + n) % eos_mod == 0:
        return EOS
    h = total * 31 + n
    if sampling is not None and sampling.temperature > 0:
        h += 17 * sampling.seed + 1
    return 3 + 32 + h % 95


def reference(
    prompt: Sequence[int], max_tokens: int, eos_mod: int = 0, stop_ids=(EOS,), min_tokens: int = 0
) -> list[int]:
    """What one request alone must produce (greedy; no EOS among the first `min_tokens` tokens;
    stops after an EOS)."""
    ids, out = list(prompt), []
    while len(out) < max_tokens:
        tok = next_token(ids, None, eos_mod, suppress_eos=len(out) < min_tokens)
        out.append(tok)
        if tok in stop_ids:
            break
        ids.append(tok)
    return out


class FakeEngine:
    """Tracks per-slot tokens for real; optionally sleeps `step_delay_s` per decode (device time)."""

    def __init__(
        self,
        max_slots: int = 4,
        max_len: int = 256,
        chunk_size: int = 16,
        sliding_kv: str = "full",
        eos_mod: int = 0,
        step_delay_s: float = 0.0,
        poison_token: int | None = None,
        vocab_size: int = 512,
    ) -> None:
        self.cfg = FakeModelConfig(vocab_size=vocab_size)
        self.ecfg = FakeEngineConfig(
            max_slots=max_slots, max_len=max_len, sliding_kv=sliding_kv, chunk_size=chunk_size
        )
        self.eos_token_ids = frozenset({EOS})
        self.eos_mod = eos_mod
        self.step_delay_s = step_delay_s
        self.poison_token = poison_token
        self.kv: list[list[int]] = [[] for _ in range(max_slots)]
        self.sampling: list[SamplingParams | None] = [None] * max_slots
        self.suppress: list[bool] = [False] * max_slots  # EOS banned for the slot (min_tokens)
        self.violations: list[str] = []
        self.calls: list[
            tuple
        ] = []  # ("prefill", slot, start, n) | ("decode", n_active) | ("copy", src, dst) | ("suppress", slot, on)
        self.warmup_gate: threading.Event | None = None
        self.decode_error: BaseException | None = None  # raised once by the next decode
        self.decode_gate: threading.Event | None = None  # decode blocks until it is set

    def warmup(self) -> float:
        if self.warmup_gate is not None:
            self.warmup_gate.wait()
        return 0.0

    def can_resume(self, cached_len: int, common_prefix: int) -> bool:
        return self.ecfg.sliding_kv == "full" or common_prefix == cached_len

    def prefill(self, slot: int, tokens: Sequence[int], start: int, sampling: SamplingParams | None = None):
        tokens = [int(t) for t in tokens]
        self.calls.append(("prefill", slot, start, len(tokens)))
        if not 1 <= len(tokens) <= self.ecfg.chunk_size:
            self.violations.append(f"prefill of {len(tokens)} tokens (chunk {self.ecfg.chunk_size})")
        if self.poison_token is not None and self.poison_token in tokens:
            raise RuntimeError("poisoned prompt")
        kv = self.kv[slot]
        if start > len(kv):
            self.violations.append(f"prefill slot {slot} at {start} but only {len(kv)} written")
        if 0 < start < len(kv) and not self.can_resume(len(kv), start):
            self.violations.append(f"ring slot {slot} resumed at {start} < {len(kv)}")
        if start + len(tokens) > self.ecfg.max_len:
            self.violations.append(f"prefill past max_len in slot {slot}")
        del kv[start:]
        kv.extend(tokens)
        if sampling is None:
            return None
        self.sampling[slot] = sampling
        self.suppress[slot] = sampling.suppress_eos
        return next_token(kv, sampling, self.eos_mod, self.suppress[slot])

    def decode(self, tokens: np.ndarray, positions: np.ndarray, active: np.ndarray) -> np.ndarray:
        self.calls.append(("decode", int(np.sum(active))))
        if self.step_delay_s:
            time.sleep(self.step_delay_s)
        if self.decode_gate is not None:
            self.decode_gate.wait()
        if self.decode_error is not None:
            err, self.decode_error = self.decode_error, None
            raise err
        out = np.zeros(self.ecfg.max_slots, np.int32)
        for slot in np.flatnonzero(active):
            kv, pos = self.kv[slot], int(positions[slot])
            if pos != len(kv):
                self.violations.append(f"decode slot {slot} at {pos} but {len(kv)} written")
                del kv[pos:]
                kv.extend([-1] * (pos - len(kv)))
            if pos >= self.ecfg.max_len:
                self.violations.append(f"decode past max_len in slot {slot}")
            kv.append(int(tokens[slot]))
            out[slot] = next_token(kv, self.sampling[slot], self.eos_mod, self.suppress[slot])
        return out

    def set_suppress_eos(self, slot: int, on: bool) -> None:
        self.calls.append(("suppress", slot, on))
        self.suppress[slot] = on

    def copy_slot(self, src: int, dst: int) -> None:
        self.calls.append(("copy", src, dst))
        self.kv[dst] = list(self.kv[src])
