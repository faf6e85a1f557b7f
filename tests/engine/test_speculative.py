"""Speculative decoding: greedy identity on tiny-a, and the acceptance rule's distribution.

Greedy: a tiny-a target (random f32 weights, tests/engine/test_engine.py's scales) generates 24
tokens plainly (`Engine.generate`) and speculatively with three drafters — the same weights (every
draft kept), other weights (most rejected) and tiny-b (another architecture, same vocab) — at k = 1
and 3; the tokens must be identical.

Distribution (temperature 1), chi-square over 20,000 draws, p > 0.01 for the residual rule and
p < 0.01 for the deliberately wrong "resample-target" rule:
(a) a synthetic Markov chain (vocab 6; target and draft transition tables drawn at random; k = 2):
    the joint law of the first three emitted tokens (216 cells) against the exact plain-sampling law;
(b) tiny-a's own next-token distribution after a prompt (target) with another tiny-a's (draft):
    the first emitted token against the target's softmax.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from scipy.stats import chisquare

from g4bench.engine.engine import Engine
from g4bench.engine.engine_config import EngineConfig
from g4bench.engine.spec_decode import ModelProposer, Verifier, speculative_generate
from g4bench.engine.speculative import accept_draft, probs_from_logits
from g4bench.model.config import load_config
from tests.engine.test_engine import random_params

DRAWS = 20_000
ECFG = EngineConfig(max_slots=1, max_len=128, chunk_size=32, min_kv_bucket=32, kv_dtype="f32")


def _engine(name: str, seed: int) -> Engine:
    cfg = load_config(name)
    return Engine(cfg, random_params(cfg, seed), ECFG, compute_dtype=np.float32)


@pytest.fixture(scope="module")
def prompt() -> list[int]:
    return [2, *np.random.default_rng(5).integers(3, 512, 19).tolist()]


@pytest.fixture(scope="module")
def plain(prompt) -> list[int]:
    return _engine("tiny-a", 0).generate([prompt], 24, ignore_eos=True).outputs[0]


@pytest.mark.parametrize("k", [1, 3])
@pytest.mark.parametrize(
    ("draft", "seed"), [("tiny-a", 0), ("tiny-a", 1), pytest.param("tiny-b", 2, marks=pytest.mark.slow)]
)
def test_greedy_tokens_identical_with_and_without_speculation(prompt, plain, draft, seed, k):
    target = _engine("tiny-a", 0)
    res = speculative_generate(target, ModelProposer(_engine(draft, seed)), prompt, 24, k=k, ignore_eos=True)
    assert res.tokens == plain
    assert res.drafted == res.rounds * k
    if (draft, seed) == ("tiny-a", 0):
        assert res.acceptance_rate == 1.0  # the drafter is the target: every draft is its argmax
        assert res.mean_accept_length == k + 1
    else:
        assert res.acceptance_rate < 1.0


def test_verify_rows_are_next_token_logits(prompt):
    """Row j of a verify call is the logits after position start + j (against plain prefill)."""
    a, b = _engine("tiny-a", 0), _engine("tiny-a", 0)
    rows = Verifier(a).verify(0, prompt[:12], 0)
    for j in (0, 5, 11):
        b.prefill(0, prompt[: j + 1], 0)
        np.testing.assert_allclose(rows[j], np.asarray(b.last_logits).reshape(-1), atol=1e-4)


# ---------------------------------------------------------------------------- acceptance rule
def test_greedy_rule_keeps_exactly_the_target_argmax():
    p = probs_from_logits(np.array([[0, 5, 1], [3, 0, 1], [0, 0, 9]], float), 0)
    q = probs_from_logits(np.array([[0, 5, 1], [0, 4, 1]], float), 0)
    tokens, kept = accept_draft(p, q, np.array([1, 1]), np.random.default_rng(0))
    assert (tokens, kept) == ([1, 0], 1)  # draft 0 is the argmax; draft 1 is not → target's argmax 0


def test_bad_shapes_are_named():
    with pytest.raises(ValueError, match=r"\[k\+1, V\]"):
        accept_draft(np.ones((2, 4)) / 4, np.ones((2, 4)) / 4, np.array([0, 1]), np.random.default_rng(0))


def _markov_counts(P: np.ndarray, Q: np.ndarray, rule: str, n_tokens: int, k: int) -> np.ndarray:
    """Counts of the first `n_tokens` emitted after token 0, speculative with k drafts per round."""
    V = P.shape[0]
    rng = np.random.default_rng(11)
    counts = np.zeros((V,) * n_tokens)
    for _ in range(DRAWS):
        ctx = [0]
        while len(ctx) <= n_tokens:
            draft: list[int] = []
            qs: list[np.ndarray] = []
            for _ in range(k):
                prev = draft[-1] if draft else ctx[-1]
                qs.append(Q[prev])
                draft.append(int(rng.choice(V, p=Q[prev])))
            ps = np.stack([P[t] for t in [ctx[-1], *draft]])
            emitted, _ = accept_draft(ps, np.stack(qs), np.array(draft), rng, rule=rule)
            ctx.extend(emitted)
        counts[tuple(ctx[1 : n_tokens + 1])] += 1
    return counts


def _chi2_p(counts: np.ndarray, probs: np.ndarray) -> float:
    """Chi-square p-value with cells of expected count < 5 pooled into one."""
    counts, expected = counts.reshape(-1), probs.reshape(-1) * counts.sum()
    small = expected < 5
    obs = np.append(counts[~small], counts[small].sum())
    exp = np.append(expected[~small], expected[small].sum())
    if exp[-1] == 0:
        obs, exp = obs[:-1], exp[:-1]
    return float(chisquare(obs, exp).pvalue)


@pytest.fixture(scope="module")
def markov():
    rng = np.random.default_rng(3)
    V = 6
    P = rng.dirichlet(np.full(V, 0.7), size=V)
    Q = rng.dirichlet(np.full(V, 0.7), size=V)
    exact = np.zeros((V,) * 3)
    for a, b, c in itertools.product(range(V), repeat=3):
        exact[a, b, c] = P[0, a] * P[a, b] * P[b, c]
    return P, Q, exact


def test_markov_chain_joint_law_matches_plain_sampling(markov):
    P, Q, exact = markov
    assert _chi2_p(_markov_counts(P, Q, "residual", 3, k=2), exact) > 0.01


def test_markov_chain_wrong_rule_is_detected(markov):
    P, Q, exact = markov
    assert _chi2_p(_markov_counts(P, Q, "resample-target", 3, k=2), exact) < 0.01


@pytest.fixture(scope="module")
def tiny_dists(prompt):
    target, draft = _engine("tiny-a", 0), _engine("tiny-a", 1)
    target.prefill(0, prompt, 0)
    draft.prefill(0, prompt, 0)
    p = probs_from_logits(np.asarray(target.last_logits).reshape(-1), 1.0)
    q = probs_from_logits(np.asarray(draft.last_logits).reshape(-1), 1.0)
    return p, q


@pytest.mark.parametrize(("rule", "agrees"), [("residual", True), ("resample-target", False)])
def test_tiny_model_first_token_law_at_temperature_1(tiny_dists, rule, agrees):
    p, q = tiny_dists
    rng = np.random.default_rng(7)
    counts = np.zeros_like(p)
    bonus = np.stack([p, p])  # the row after the draft does not affect the first emitted token
    drafts = rng.choice(len(q), size=DRAWS, p=q)
    for d in drafts:
        tokens, _ = accept_draft(bonus, q[None], np.array([d]), rng, rule=rule)
        counts[tokens[0]] += 1
    pvalue = _chi2_p(counts, p)
    assert (pvalue > 0.01) if agrees else (pvalue < 0.01), pvalue


@pytest.mark.slow
def test_batch_verify_matches_per_slot_verify(prompt):
    """verify_all (every slot k+1 tokens in one call, the step `plan --spec-k` prices) gives each
    slot the logits a one-slot verify of the same tokens gives."""
    ecfg = EngineConfig(max_slots=2, max_len=128, chunk_size=32, min_kv_bucket=32, kv_dtype="f32")
    cfg = load_config("tiny-a")
    params = random_params(cfg, 0)
    a, b = (
        Engine(cfg, params, ecfg, compute_dtype=np.float32),
        Engine(cfg, params, ecfg, compute_dtype=np.float32),
    )
    for slot, n in ((0, 12), (1, 15)):
        a.prefill(slot, prompt[:n], 0)
        b.prefill(slot, prompt[:n], 0)
    runs = np.array([prompt[12:16], prompt[15:19]])
    both = np.asarray(Verifier(a).verify_all(runs, np.array([12, 15])))
    vb = Verifier(b)
    for slot, start in ((0, 12), (1, 15)):
        np.testing.assert_allclose(both[slot], vb.verify(slot, runs[slot].tolist(), start), atol=1e-4)


@pytest.mark.slow
def test_greedy_with_a_grammar_matches_plain_constrained_decoding(prompt):
    """A grammar (lowercase letters, 3..10, then EOS) on tiny-a: speculative greedy with a drafter
    that ignores the grammar emits exactly the plain constrained greedy tokens, and the request's
    matcher only ever sees emitted tokens (it would raise on a forbidden one)."""
    from g4bench.engine.grammar import byte_vocab

    vocab, grammar = byte_vocab(512), "start: /[a-z]{3,10}/"
    plain_eng, m = _engine("tiny-a", 0), vocab.matcher(grammar)
    plain_eng.prefill(0, prompt, 0)
    logits, pos, plain_tokens = np.asarray(plain_eng.last_logits).reshape(-1), len(prompt), []
    for _ in range(16):
        masked = np.where(m.next_mask(), logits, -np.inf)
        tok = int(np.argmax(masked))
        m.advance(tok)
        plain_tokens.append(tok)
        if tok == 1:
            break
        logits = np.asarray(plain_eng.decode_logits(np.array([tok]), np.array([pos]), np.array([True])))[0]
        pos += 1
    assert plain_tokens[-1] == 1 and 4 <= len(plain_tokens) <= 11

    spec_m = vocab.matcher(grammar)
    res = speculative_generate(_engine("tiny-a", 0), ModelProposer(_engine("tiny-a", 1)), prompt, 16, k=3,
                               constraint=spec_m)  # fmt: skip
    assert res.tokens == plain_tokens
    assert res.acceptance_rate < 1.0  # the unconstrained drafter was rejected at least once
    assert spec_m.is_done()
