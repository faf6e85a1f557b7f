"""The mixed step computes what the chunk path computes: the same requests, once as separate
`prefill` and `decode` calls and once as `Engine.step` calls carrying decode rows and prefill
pieces together, give the same logits (f32, within 1e-5 of the logits' scale) and the same greedy
tokens, and leave caches that decode identically afterwards.

tiny-a (sliding window 8), paged with 4-token blocks, chunk size 64 so a chunk is two 32-token
piece rows that must attend to each other inside one call; prompts of 5..70 tokens cross the
window, block and piece boundaries. Both sliding-KV variants (ring: the window block group).
"""

from __future__ import annotations

import numpy as np
import pytest

from g4bench.engine.engine_config import EngineConfig
from g4bench.engine.mixed import PIECE_TOKENS, Piece, pack, piece_rows, row_buckets
from g4bench.engine.sampling import SamplingParams
from g4bench.model.config import load_config
from tests.engine.test_engine import make_engine, random_params

REL_TOL = 1e-5  # of max |logit|; measured ≈ 1e-6 (summation order of the flattened linears)
S = 4


@pytest.fixture(scope="module")
def cfg():
    return load_config("tiny-a")


@pytest.fixture(scope="module")
def params(cfg):
    return random_params(cfg)


def prompts(cfg, seed=3):
    rng = np.random.default_rng(seed)
    return {slot: [cfg.bos_token_id, *rng.integers(3, cfg.vocab_size, n - 1).tolist()]
            for slot, n in ((0, 11), (1, 5), (2, 70), (3, 37))}  # fmt: skip


def engines(cfg, params, sliding):
    kw = dict(
        max_slots=S, max_len=128, chunk_size=64, kv_layout="paged", sliding_kv=sliding, max_batched_tokens=160
    )
    return make_engine(cfg, params, **kw), make_engine(cfg, params, **kw)


def _decode_args(slots, tokens, positions):
    tok, pos, act = np.zeros(S, np.int32), np.zeros(S, np.int32), np.zeros(S, bool)
    for s in slots:
        tok[s], pos[s], act[s] = tokens[s], positions[s], True
    return tok, pos, act


def _close(a, b, what):
    a, b = np.asarray(a), np.asarray(b)
    scale = float(np.abs(b).max())
    err = float(np.abs(a - b).max())
    assert err <= REL_TOL * scale, f"{what}: max |Δ| {err:.3g} > {REL_TOL} × {scale:.3g}"


@pytest.mark.parametrize("sliding", ["full", "ring"])
def test_mixed_step_equals_separate_prefill_and_decode(sliding, cfg, params):
    """Slots 0 and 1 decode while slot 2 (70 tokens: a 64-token chunk, then 6) and slot 3 (37
    tokens in one chunk) prefill in the same calls; then all four decode together."""
    chunked, mixed = engines(cfg, params, sliding)
    p = prompts(cfg)
    greedy = SamplingParams()
    nxt, pos = {}, {}
    for e in (chunked, mixed):  # the decoding streams start the same way on both engines
        for s in (0, 1):
            nxt[s] = e.prefill(s, p[s], 0, greedy)
            pos[s] = len(p[s])

    # call 1: decode 0, 1 + slot 2's first chunk + all of slot 3
    tok, ps, act = _decode_args((0, 1), nxt, pos)
    ref_next = chunked.decode(tok, ps, act)
    ref_dec = np.asarray(chunked.last_logits)
    chunked.prefill(2, p[2][:64], 0)
    ref3 = chunked.prefill(3, p[3], 0, greedy)
    ref3_logits = np.asarray(chunked.last_logits)
    logits, first = mixed.step(
        tok, ps, act, [Piece(2, p[2][:64], 0), Piece(3, p[3], 0, greedy)], decode_logits=True
    )
    _close(np.asarray(logits)[[0, 1]], ref_dec[[0, 1]], "decode rows")
    _close(mixed.piece_logits(3)[0], ref3_logits, "slot 3's last position")
    assert first == {3: ref3}
    got_next = mixed.sample_logits(logits, ps, np.arange(S), None)
    assert got_next[[0, 1]].tolist() == ref_next[[0, 1]].tolist()

    # call 2: decode 0, 1, 3 + slot 2's last 6 tokens (its first token sampled in the same call)
    for s in (0, 1):
        nxt[s], pos[s] = int(ref_next[s]), pos[s] + 1
    nxt[3], pos[3] = ref3, len(p[3])
    tok, ps, act = _decode_args((0, 1, 3), nxt, pos)
    ref_next = chunked.decode(tok, ps, act)
    ref_dec = np.asarray(chunked.last_logits)
    ref2 = chunked.prefill(2, p[2][64:], 64, greedy)
    ref2_logits = np.asarray(chunked.last_logits)
    out, first = mixed.step(tok, ps, act, [Piece(2, p[2][64:], 64, greedy)])
    assert out[[0, 1, 3]].tolist() == ref_next[[0, 1, 3]].tolist()
    assert first == {2: ref2}
    _close(mixed.piece_logits(2)[0], ref2_logits, "slot 2's last position")

    # the caches agree: eight plain decode steps of all four slots
    for s in (0, 1, 3):
        nxt[s], pos[s] = int(ref_next[s]), pos[s] + 1
    nxt[2], pos[2] = ref2, len(p[2])
    for _ in range(8):
        tok, ps, act = _decode_args(range(S), nxt, pos)
        a, b = chunked.decode(tok, ps, act), mixed.decode(tok, ps, act)
        _close(mixed.last_logits, chunked.last_logits, "decode after the mixed calls")
        assert a.tolist() == b.tolist()
        for s in range(S):
            nxt[s], pos[s] = int(a[s]), pos[s] + 1


def test_seeded_sampling_of_a_first_token_matches_prefill(cfg, params):
    """At temperature 1 with a seed, a piece samples the same first token as a prefill call."""
    chunked, mixed = engines(cfg, params, "ring")
    p = prompts(cfg, seed=11)
    for seed in range(6):
        sp = SamplingParams(temperature=1.0, seed=seed)
        ref = chunked.prefill(3, p[3], 0, sp)
        _, first = mixed.step(
            np.zeros(S, np.int32), np.zeros(S, np.int32), np.zeros(S, bool), [Piece(3, p[3], 0, sp)]
        )
        assert first == {3: ref}


def test_pack_cuts_pieces_into_rows():
    pieces = [Piece(1, list(range(70)), 10), Piece(2, [5, 6], 0, SamplingParams())]
    rows = pack(pieces, 4)
    assert rows.n_valid.tolist() == [32, 32, 6, 2]
    assert rows.start.tolist() == [10, 42, 74, 0]
    assert rows.slots.tolist() == [1, 1, 1, 2]
    assert rows.tokens[2, :6].tolist() == list(range(64, 70))
    assert rows.sampled_rows == {2: 3} and rows.pick.tolist() == [3, 0, 0, 0]
    with pytest.raises(ValueError, match="more than 3 rows"):
        pack(pieces, 3)


def test_row_buckets_cover_the_budget_and_a_whole_chunk():
    assert row_buckets(512, 256) == (1, 2, 4, 8, 16)
    assert row_buckets(100, 256) == (1, 2, 4, 8)  # one 256-token chunk still fits
    assert row_buckets(600, 64) == (1, 2, 4, 8, 16, 19)
    assert piece_rows(1) == 1 and piece_rows(PIECE_TOKENS + 1) == 2


def test_bad_steps_are_refused_with_the_reason(cfg, params):
    _, mixed = engines(cfg, params, "full")
    z = np.zeros(S, np.int32)
    act = np.array([True, False, False, False])
    cases = [
        ([Piece(0, [3], 0)], "both decodes and prefills"),
        ([Piece(1, [3], 0), Piece(1, [4], 1)], "two pieces"),
        ([Piece(1, [3] * 65, 0)], "must be 1..64"),
        ([Piece(9, [3], 0)], "out of range"),
        ([Piece(1, [3], 127), Piece(2, [3], 0)][:1] + [Piece(2, [3, 3], 127)], "exceed max_len"),
        ([], "at least one prefill piece"),
        ([Piece(s, [3], 0, SamplingParams()) for s in (1, 2, 3)] * 2, "more than 4 pieces sample"),
    ]
    for pieces, message in cases:
        with pytest.raises(ValueError, match=message):
            mixed.step(z, z, act, pieces)


def test_policy_defaults_to_mixed_only_when_paged():
    assert EngineConfig(kv_layout="paged").policy == "mixed"
    assert EngineConfig(kv_layout="contiguous").policy == "chunk"
    assert EngineConfig(kv_layout="paged", prefill_policy="chunk").policy == "chunk"
    with pytest.raises(ValueError, match="needs the paged KV layout"):
        EngineConfig(kv_layout="contiguous", prefill_policy="mixed")
