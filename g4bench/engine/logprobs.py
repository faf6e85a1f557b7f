"""Log-probabilities of chosen tokens and the top alternatives, on the device; OpenAI's shapes on the host.

Device side (`step_logprobs`, jitted with `k` static): from a step's logits f32[S, V] and the ids
just chosen i32[S], compute ``log_softmax(logits)[chosen]`` (logits minus their logsumexp, in f32)
and the `k` most likely ids with their log-probabilities (`lax.top_k`, sorted descending). Only
S * (1 + 2k) numbers come back to the host, never the [S, V] logits. The logits are the model's
own (before temperature, top-k/top-p and grammar masks), as vLLM reports by default, so a
constrained token can have a low logprob and `top_logprobs[0]` is the model's greedy choice.

Host side (pure functions): `TokenLogprob` rows -> the chat completion ``logprobs`` object
(``{"content": [{"token", "logprob", "bytes", "top_logprobs": [...]}]}``) and the legacy
completions ``logprobs`` object (``tokens``, ``token_logprobs``, ``top_logprobs`` as
``{token: logprob}`` dicts, ``text_offset``). Token text comes from a ``token_bytes(id) -> bytes``
callable (a byte tokenizer's byte, or a BPE piece); bytes that are not valid UTF-8 on their own
(a piece of a multi-byte character) are shown with U+FFFD, as vLLM does, and ``bytes`` carries them
exactly.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np

MAX_TOP_LOGPROBS = 20  # OpenAI's limit for top_logprobs


@partial(jax.jit, static_argnames="k")
def step_logprobs(logits: jax.Array, chosen: jax.Array, k: int) -> tuple[jax.Array, jax.Array, jax.Array]:
    """logits [S, V], chosen i32[S] -> (chosen_logprob f32[S], top_ids i32[S, k], top_logprobs f32[S, k])."""
    logits = logits.astype(jnp.float32)
    lse = jax.nn.logsumexp(logits, axis=-1, keepdims=True)  # [S, 1]
    picked = jnp.take_along_axis(logits, chosen[:, None].astype(jnp.int32), axis=-1)[:, 0] - lse[:, 0]
    if k == 0:
        empty = jnp.zeros((logits.shape[0], 0), jnp.float32)
        return picked, empty.astype(jnp.int32), empty
    top_vals, top_ids = jax.lax.top_k(logits, k)  # sorted descending
    return picked, top_ids.astype(jnp.int32), top_vals - lse


@dataclass(frozen=True)
class TokenLogprob:
    """One generated token: its id, its log-probability, and the top alternatives (id, logprob)."""

    token: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


def rows_from_step(
    chosen: np.ndarray, picked: np.ndarray, top_ids: np.ndarray, top_lps: np.ndarray
) -> list[TokenLogprob]:
    """The host copies of one `step_logprobs` result -> one `TokenLogprob` per slot row."""
    return [
        TokenLogprob(
            int(chosen[s]),
            float(picked[s]),
            tuple((int(i), float(lp)) for i, lp in zip(top_ids[s], top_lps[s], strict=True)),
        )
        for s in range(len(chosen))
    ]


def _text(raw: bytes) -> str:
    return raw.decode("utf-8", errors="replace")


def _entry(token: int, logprob: float, token_bytes: Callable[[int], bytes]) -> dict:
    raw = token_bytes(token)
    return {"token": _text(raw), "logprob": logprob, "bytes": list(raw)}


def chat_logprobs(
    rows: Sequence[TokenLogprob], token_bytes: Callable[[int], bytes], top_logprobs: int
) -> dict:
    """Chat completions' ``choices[i].logprobs`` (also one chunk's worth when streaming)."""
    content = []
    for row in rows:
        entry = _entry(row.token, row.logprob, token_bytes)
        entry["top_logprobs"] = [_entry(t, lp, token_bytes) for t, lp in row.top[:top_logprobs]]
        content.append(entry)
    return {"content": content}


def completion_logprobs(
    rows: Sequence[TokenLogprob], token_bytes: Callable[[int], bytes], top_logprobs: int, text_offset: int = 0
) -> dict:
    """Completions' ``choices[i].logprobs``; `text_offset` is where this run of tokens starts in
    the choice's text (the prompt's length with echo, or the text already streamed)."""
    tokens, token_lps, tops, offsets = [], [], [], []
    offset = text_offset
    for row in rows:
        text = _text(token_bytes(row.token))
        tokens.append(text)
        token_lps.append(row.logprob)
        top: dict[str, float] = {}
        for t, lp in row.top[:top_logprobs]:
            top.setdefault(_text(token_bytes(t)), lp)  # two ids can share a spelling: keep the likelier
        tops.append(top)
        offsets.append(offset)
        offset += len(text)
    return {"tokens": tokens, "token_logprobs": token_lps, "top_logprobs": tops, "text_offset": offsets}


def validate_top_logprobs(n: int | None) -> int:
    """The request's top_logprobs (None -> 0); raises ValueError outside 0..20 (a 400)."""
    if n is None:
        return 0
    if not 0 <= n <= MAX_TOP_LOGPROBS:
        raise ValueError(f"top_logprobs must be between 0 and {MAX_TOP_LOGPROBS}, got {n}")
    return n
