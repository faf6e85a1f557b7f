"""Speculative acceptance: which of k drafted tokens a target keeps, as one pure function.

    tokens, accepted = accept_draft(p, q, draft, rng)

p f32[k+1, V]: the target's next-token distributions after the context and after each draft
prefix (one verify step scores all k+1); q f32[k, V]: the drafter's distributions the drafts were
sampled from; draft i32[k]. Leviathan et al. / Chen et al. (2023) rejection sampling: draft i is
kept with probability min(1, p_i(x)/q_i(x)); the first rejected one is replaced by a sample of the
residual norm(max(0, p_i − q_i)) and drafting stops; if all k are kept, a bonus token is sampled
from p_k. Every emitted token is then distributed exactly as plain sampling from the target, at any
temperature (p and q are whatever the caller's temperature made them).

Greedy is the same rule over one-hot distributions (`one_hot(argmax)`): a draft is kept iff it is
the target's argmax, and a rejection emits the target's argmax, so the output is exactly the
target's greedy tokens.

The caller feeds only the returned tokens to anything stateful (grammar matchers, stop checks,
the drafter's context): a rejected draft never leaves this function.

`ACCEPT_RULES` also holds a deliberately wrong rule ("resample-target": on rejection, sample from
p instead of the residual) so the distribution test can show it fails.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np


def probs_from_logits(logits: np.ndarray, temperature: float) -> np.ndarray:
    """Host softmax at `temperature` (0: one-hot of the argmax, ties to the lowest id) in f64."""
    x = np.asarray(logits, np.float64)
    if temperature == 0:
        out = np.zeros_like(x)
        np.put_along_axis(out, np.argmax(x, axis=-1)[..., None], 1.0, axis=-1)
        return out
    x = x / temperature
    x = np.exp(x - x.max(axis=-1, keepdims=True))
    return x / x.sum(axis=-1, keepdims=True)


def _categorical(rng: np.random.Generator, p: np.ndarray) -> int:
    c = np.cumsum(p)
    return int(min(np.searchsorted(c, rng.random() * c[-1], side="right"), len(p) - 1))


def _residual(p: np.ndarray, q: np.ndarray) -> np.ndarray:
    r = np.maximum(p - q, 0.0)
    total = r.sum()
    # p == q exactly (a rejection then has probability 0): fall back to p, which is then the residual's limit.
    return r / total if total > 0 else p


def accept_draft(
    p: np.ndarray, q: np.ndarray, draft: np.ndarray, rng: np.random.Generator, rule: str = "residual"
) -> tuple[list[int], int]:
    """(emitted tokens: the kept drafts then one corrected or bonus token, number of drafts kept)."""
    p, q, draft = np.asarray(p, np.float64), np.asarray(q, np.float64), np.asarray(draft, np.int64)
    k = len(draft)
    if p.shape[0] != k + 1 or q.shape[0] != k or p.shape[1:] != q.shape[1:]:
        raise ValueError(f"accept_draft: p {p.shape} must be [k+1, V] and q {q.shape} [k, V] for k={k}")
    on_reject = ACCEPT_RULES[rule]
    out: list[int] = []
    for i, x in enumerate(draft.tolist()):
        px, qx = p[i, x], q[i, x]
        if qx <= 0:
            raise ValueError(f"draft {i} (token {x}) has probability 0 under its own distribution q")
        if rng.random() < min(1.0, px / qx):
            out.append(x)
            continue
        out.append(_categorical(rng, on_reject(p[i], q[i])))
        return out, i
    out.append(_categorical(rng, p[k]))
    return out, k


ACCEPT_RULES: dict[str, Callable[[np.ndarray, np.ndarray], np.ndarray]] = {
    "residual": _residual,
    "resample-target": lambda p, q: p,  # WRONG on purpose: over-weights tokens the draft already offered
}
