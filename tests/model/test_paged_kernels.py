"""The Pallas paged kernel (g4bench/model/paged_kernels.py) in TPU interpret mode on the CPU, against
our attention over the same paged read (paged_kv.paged_update_and_read, gathered, then `attend`):
ragged lengths, block and chunk boundaries, sliding windows (full-length and window reads), head
dims 256 and 512, grouped and single KV heads, int8 per-token scales, a shared-KV layer's one query,
idle rows; f32 within 1e-5, bf16 within twice bf16's own floor (`attend` in bf16 vs in f32 on the
same rounded inputs). Soft cap and scale, which our attention does not have, are checked against
JAX's ragged_paged_attention reference where the layouts meet.
`PARITY` collects each case's max |Δ| and tolerance; `test_parity_table` prints it (-s)."""

from __future__ import annotations

import zlib
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from g4bench.model.attention import attend, visible_keys
from g4bench.model.kv_cache import as_bits, quantize_kv
from g4bench.model.paged_kernels import PagedKernel, paged_attention, visible_block_range
from g4bench.model.paged_kv import PagedKeys, paged_update_and_read

F32_TOL = 1e-5
PARITY: list[tuple[str, float, float]] = []


def _read(seed: int, *, B: int, T: int, nh: int, kvh: int, hd: int, starts: list[int], n_valid: list[int],
          window_read: int | None, kv_dtype: str, bs: int = 16, kv_len: int = 128) -> dict[str, Any]:  # fmt: skip
    """One layer's call: pools full of earlier keys (every row's blocks in a shuffled physical order,
    block 0 the null block), this call's T tokens per row written by paged_update_and_read, and the
    read it returns; queries in f32."""
    rng = np.random.default_rng(seed)
    MB = kv_len // bs
    NB = 1 + B * MB
    table = jnp.asarray(rng.permutation(np.arange(1, NB)).reshape(B, MB), jnp.int32)
    start = jnp.asarray(starts, jnp.int32)
    nv = jnp.asarray(n_valid, jnp.int32)
    positions = start[:, None] + jnp.arange(T, dtype=jnp.int32)[None, :]
    valid_q = jnp.arange(T)[None, :] < nv[:, None]

    def normal(*shape: int) -> jax.Array:
        return jnp.asarray(rng.standard_normal(shape), jnp.float32)

    old_k, old_v = normal(NB, kvh, bs, hd).at[0].set(0), normal(NB, kvh, bs, hd).at[0].set(0)
    new_k, new_v = normal(B, kvh, T, hd), normal(B, kvh, T, hd)
    if kv_dtype == "int8":
        (ok, oks), (ov, ovs) = quantize_kv(old_k), quantize_kv(old_v)
        (nk, nks), (nv_, nvs) = quantize_kv(new_k), quantize_kv(new_v)
        entry = {"k": ok, "v": ov, "ks": as_bits(oks), "vs": as_bits(ovs)}
        new = {"k": nk, "v": nv_, "ks": nks, "vs": nvs}
        dtypes = {"k": jnp.dtype(jnp.int8), "v": jnp.dtype(jnp.int8), "ks": oks.dtype, "vs": ovs.dtype}
    else:
        dt = jnp.dtype(jnp.bfloat16 if kv_dtype == "bf16" else jnp.float32)
        entry = {"k": as_bits(old_k.astype(dt)), "v": as_bits(old_v.astype(dt))}
        new, dtypes = {"k": new_k, "v": new_v}, {"k": dt, "v": dt}
    _, paged, key_pos, key_ok = paged_update_and_read(
        entry, new, table, positions, valid_q, start, block_size=bs, kv_len=kv_len, window=window_read,
        dtypes=dtypes,
    )  # fmt: skip
    return {"q": normal(B, T, nh, hd), "paged": paged, "key_pos": key_pos, "key_ok": key_ok,
            "positions": positions, "valid_q": valid_q, "n_valid": nv}  # fmt: skip


def _reference(r: dict[str, Any], q: jax.Array, window: int | None, f32: bool = True) -> np.ndarray:
    """`attend` over the gathered read (the pools widened to f32 first when `f32`)."""
    kv = r["paged"].gather()
    if f32:
        kv = {name: x.astype(jnp.float32) if x.dtype != jnp.int8 else x for name, x in kv.items()}
    mask = visible_keys(r["key_pos"], r["key_ok"], r["positions"], window)
    return np.asarray(attend(q, kv["k"], kv["v"], kv.get("ks"), kv.get("vs"), mask).astype(jnp.float32))


def _exact(r: dict[str, Any], q: jax.Array, window: int | None) -> np.ndarray:
    """The same attention in float64 (numpy) over the gathered read: what both are measured against."""
    kv = {name: np.asarray(x.astype(jnp.float32), np.float64) for name, x in r["paged"].gather().items()}
    qq = np.asarray(q.astype(jnp.float32), np.float64)
    B, T, nh, hd = qq.shape
    n = nh // kv["k"].shape[1]
    mask = np.asarray(visible_keys(r["key_pos"], r["key_ok"], r["positions"], window))
    out = np.zeros((B, T, nh, hd))
    for b in range(B):
        for h in range(nh):
            s = qq[b, :, h] @ kv["k"][b, h // n].T * (kv["ks"][b, h // n][None, :] if "ks" in kv else 1.0)
            s = np.where(mask[b], s, -np.inf)
            p = np.exp(s - np.max(s, axis=1, keepdims=True, initial=-1e300))
            p = p / np.maximum(p.sum(axis=1, keepdims=True), 1e-300)
            out[b, :, h] = (p * (kv["vs"][b, h // n][None, :] if "vs" in kv else 1.0)) @ kv["v"][b, h // n]
    return out.reshape(B, T, nh * hd)


def _f32_check(case: str, r: dict[str, Any], got: np.ndarray, window: int | None) -> None:
    """f32: the kernel within max(1e-5, 2 × our f32 attention's own error), both against float64
    (hd 512's scores reach |q·k| ≈ 75, where one pass in f32 is itself 4.5e-5 off)."""
    real = _real(r)
    exact = _exact(r, r["q"], window)
    floor = float(np.abs(_reference(r, r["q"], window) - exact)[real].max())
    tol = max(F32_TOL, 2 * floor)
    delta = float(np.abs(got - exact)[real].max())
    PARITY.append((case, delta, tol))
    assert delta <= tol


def _kernel(r: dict[str, Any], q: jax.Array, window: int | None, **kw: Any) -> np.ndarray:
    out = PagedKernel(interpret=True, **kw)(q, r["paged"], r["key_pos"], r["positions"], r["valid_q"], window)
    return np.asarray(out.astype(jnp.float32))


def _real(r: dict[str, Any]) -> np.ndarray:
    return np.asarray(r["valid_q"])


CASES = {
    # name: (read shape, window of the mask, kernel options)
    "decode, ragged rows at block edges, hd 256": (
        dict(B=4, T=1, nh=8, kvh=1, hd=256, starts=[0, 15, 16, 77], n_valid=[1, 1, 1, 1], window_read=None), None, {}),
    "decode with an idle row, full-length sliding read, hd 256": (
        dict(B=3, T=1, nh=8, kvh=1, hd=256, starts=[100, 31, 0], n_valid=[1, 1, 0], window_read=None), 24, {}),
    "decode, window read (ring group), hd 256": (
        dict(B=3, T=1, nh=8, kvh=1, hd=256, starts=[100, 47, 5], n_valid=[1, 1, 1], window_read=24), 24, {}),
    "prefill chunk across blocks, GQA, hd 512": (
        dict(B=2, T=32, nh=4, kvh=2, hd=512, starts=[5, 40], n_valid=[32, 20], window_read=None), None,
        {"queries_per_block": 8}),
    "mixed: decode + chunk + idle row, window 24, hd 256": (
        dict(B=3, T=16, nh=8, kvh=1, hd=256, starts=[90, 16, 0], n_valid=[1, 16, 0], window_read=None), 24, {}),
    "chunk, window read, pages per block 3, hd 256": (
        dict(B=2, T=16, nh=2, kvh=1, hd=256, starts=[64, 30], n_valid=[16, 9], window_read=24), 24,
        {"pages_per_block": 3}),
}  # fmt: skip


@pytest.mark.parametrize("name", list(CASES))
def test_f32_matches_attend(name: str) -> None:
    shape, window, kw = CASES[name]
    r = _read(zlib.crc32(name.encode()) % 1000, kv_dtype="f32", **shape)
    got = _kernel(r, r["q"], window, **kw)
    _f32_check(f"f32 {name}", r, got, window)
    assert np.all(got[~_real(r)] == 0)  # padding and idle rows see nothing and get zeros


@pytest.mark.parametrize("name", ["decode, ragged rows at block edges, hd 256", "prefill chunk across blocks, GQA, hd 512",
                                  "mixed: decode + chunk + idle row, window 24, hd 256"])  # fmt: skip
def test_bf16_within_its_floor(name: str) -> None:
    """bf16 queries and pools, as on the chip: the kernel is no further from f32 attention over the
    same rounded inputs than our own attention computed in bf16 is (twice that floor)."""
    shape, window, kw = CASES[name]
    r = _read(zlib.crc32(name.encode()) % 1000, kv_dtype="bf16", **shape)
    q16 = r["q"].astype(jnp.bfloat16)
    exact = _reference(r, q16.astype(jnp.float32), window)
    floor = float(np.abs(_reference(r, q16, window, f32=False) - exact)[_real(r)].max())
    delta = float(np.abs(_kernel(r, q16, window, **kw) - exact)[_real(r)].max())
    PARITY.append((f"bf16 {name}", delta, 2 * floor))
    assert 0 < floor < 0.1 and delta <= 2 * floor


@pytest.mark.parametrize(
    "name", ["decode, window read (ring group), hd 256", "prefill chunk across blocks, GQA, hd 512"]
)
def test_int8_scales_match_attend(name: str) -> None:
    """int8 K/V with one bf16 scale per token and head, folded in as `attend` folds them."""
    shape, window, kw = CASES[name]
    r = _read(zlib.crc32(name.encode()) % 1000 + 1, kv_dtype="int8", **shape)
    _f32_check(f"int8 {name}", r, _kernel(r, r["q"], window, **kw), window)


def test_shared_kv_layer_one_query() -> None:
    """A KV-shared layer after the last-token cut: one query per row at its last real position,
    attending the source layer's read of the whole chunk (forward.py)."""
    r = _read(
        9, B=2, T=16, nh=8, kvh=1, hd=512, starts=[20, 3], n_valid=[16, 7], window_read=None, kv_dtype="f32"
    )
    last = r["n_valid"] - 1
    b = jnp.arange(2)
    q1, pos1 = r["q"][b, last][:, None], r["positions"][b, last][:, None]
    out = PagedKernel(interpret=True)(q1, r["paged"], r["key_pos"], pos1, r["n_valid"][:, None] > 0, None)
    mask = visible_keys(r["key_pos"], r["key_ok"], pos1, None)
    kv = r["paged"].gather()
    want = attend(q1, kv["k"], kv["v"], None, None, mask)
    delta = float(np.abs(np.asarray(out) - np.asarray(want)).max())
    PARITY.append(("f32 shared-KV layer, one query at the last position, hd 512", delta, F32_TOL))
    assert delta <= F32_TOL


def _jax_ragged(r: dict[str, Any], window: int, soft_cap: float, scale: float) -> np.ndarray:
    """JAX's ragged_paged_attention over the same read: its one K/V-interleaved pool built from ours
    (a copy the engine never makes), each row's real queries as ragged tokens. Its causal mask puts
    a row's queries at the end of its keys, so kv_len = start + q_len.
    Its kernel itself does not run in jax 0.10.2's TPU interpret mode (`force_tpu_interpret_mode`:
    "AttributeError: 'ReshapeTransform' object has no attribute 'indices'", from its kv_ref.reshape),
    so its pure-JAX reference, which its own tests hold the kernel to, stands in."""
    from jax.experimental.pallas.ops.tpu.ragged_paged_attention import kernel as rpa

    paged: PagedKeys = r["paged"]
    k, v = (paged.pools[n].transpose(0, 2, 1, 3) for n in ("k", "v"))  # [NB, bs, kvh, hd]
    kv_pages = jnp.stack([k, v], axis=3).reshape(*k.shape[:2], 2 * k.shape[2], k.shape[3])
    nv = np.asarray(r["n_valid"])
    q = jnp.concatenate([r["q"][i, : nv[i]] for i in range(len(nv))], axis=0)
    cu = jnp.asarray(np.concatenate([[0], np.cumsum(nv)]), jnp.int32)
    kv_lens = (r["positions"][:, 0] + r["n_valid"]).astype(jnp.int32)
    args = (q, kv_pages, kv_lens, paged.ids, cu, jnp.array([len(nv)], jnp.int32))
    opts = dict(sm_scale=scale, sliding_window=window, soft_cap=soft_cap)
    return np.asarray(rpa.ref_ragged_paged_attention(*args, **opts))


def test_soft_cap_and_scale_match_jax_ragged_paged_attention() -> None:
    """Where the layouts meet (a full read from logical block 0, every row's real queries), our
    kernel with soft cap 5 and scale 1/8 equals JAX's ragged_paged_attention."""
    window, soft_cap, scale = 24, 5.0, 0.125
    r = _read(21, B=3, T=8, nh=4, kvh=2, hd=256, starts=[40, 3, 70], n_valid=[8, 1, 5], window_read=None,
              kv_dtype="f32", kv_len=128)  # fmt: skip
    paged = r["paged"]
    ours = np.asarray(paged_attention(r["q"], paged.pools, paged.ids, jnp.zeros(3, jnp.int32), r["positions"][:, 0],
                                      r["n_valid"], dtypes=paged.dtypes, window=window, soft_cap=soft_cap,
                                      scale=scale, interpret=True))  # fmt: skip
    nv = np.asarray(r["n_valid"])
    ours_ragged = np.concatenate([ours[i, : nv[i]] for i in range(3)]).reshape(-1, 4, 256)
    theirs = _jax_ragged(r, window, soft_cap, scale)
    delta = float(np.abs(ours_ragged - theirs).max())
    PARITY.append(
        ("f32 soft cap 5, scale 1/8, window 24, GQA vs JAX ref_ragged_paged_attention", delta, F32_TOL)
    )
    assert delta <= F32_TOL


def test_visible_range_skips_blocks_no_query_sees() -> None:
    """The compute blocks a row visits: from the window's first key (or key 0) to its last query."""
    lo, hi = visible_block_range(jnp.array([0, 0, 2, 0]), jnp.array([100, 100, 40, 7]), jnp.array([1, 1, 4, 0]),
                                 num_blocks=8, block_size=16, pages_per_block=2, window=None)  # fmt: skip
    assert lo.tolist() == [0, 0, 0, 0] and hi.tolist()[:3] == [3, 3, 0] and hi[3] < lo[3]
    lo, hi = visible_block_range(jnp.array([0, 4]), jnp.array([100, 100]), jnp.array([1, 1]),
                                 num_blocks=8, block_size=16, pages_per_block=2, window=24)  # fmt: skip
    assert lo.tolist() == [2, 0] and hi.tolist() == [3, 1]


def test_dense_read_and_bad_shapes_fail_loudly() -> None:
    r = _read(3, B=1, T=1, nh=2, kvh=1, hd=256, starts=[4], n_valid=[1], window_read=None, kv_dtype="f32")
    dense = r["paged"].gather()
    with pytest.raises(ValueError, match="paged cache"):
        PagedKernel(interpret=True)(r["q"], dense, r["key_pos"], r["positions"], r["valid_q"], None)
    paged = r["paged"]
    with pytest.raises(ValueError, match="does not fit pools"):
        paged_attention(r["q"][..., :128], paged.pools, paged.ids, jnp.zeros(1, jnp.int32), r["positions"][:, 0],
                        r["n_valid"], dtypes=paged.dtypes, window=None, interpret=True)  # fmt: skip


def test_parity_table() -> None:
    """Runs last in this file: prints the parity table gathered above (pytest -s shows it)."""
    for case, delta, tol in PARITY:
        print(f"| {case} | {delta:.2e} | {tol:.2e} |")
    assert all(delta <= tol for _, delta, tol in PARITY)


def test_a_block_table_past_the_prefetch_budget_runs_as_row_groups(monkeypatch) -> None:
    """A batch whose block table would overflow TPU SMEM (int8 KV, ring sliding KV: ~620 rows of 512
    blocks at ctx 8192 on v6e) runs as one kernel call per group of rows, with the same output."""
    import g4bench.model.paged_kernels as pk

    shape, window, kw = CASES["mixed: decode + chunk + idle row, window 24, hd 256"]
    r = _read(11, kv_dtype="f32", **shape)
    whole = _kernel(r, r["q"], window, **kw)
    nb = r["paged"].ids.shape[1]
    monkeypatch.setattr(pk, "PREFETCH_BYTES", 4 * (nb + 5))  # one row per call
    calls = []
    real_call = pk.pl.pallas_call
    monkeypatch.setattr(pk.pl, "pallas_call", lambda *a, **k: calls.append(1) or real_call(*a, **k))
    split = _kernel(r, r["q"], window, **kw)
    assert len(calls) == shape["B"]
    np.testing.assert_array_equal(split, whole)
