"""Full-size E2B and E4B, abstractly (no weights allocated): parameter bytes per weight format and KV
bytes per token, asserted against values derived by hand from the architecture below.

Hand derivation (each model: H hidden, V vocab, L layers, nh query heads, kvh KV heads, hd / ghd
sliding / full head dims, I MLP width (doubled on KV-shared layers when double-wide), P PLE width,
layers ≥ `first` share KV):
  linears per layer (out × in elements): q, o = H·nh·d each; k, v = H·kvh·d each (KV owners only);
  gate, up, down = H·I_i each; ple_gate, ple_up = H·P each; plus ple_proj = H·L·P once.
  W4A16 costs 9/16 byte per element (a 4-byte word per 8 weights = 1/2, a 2-byte scale per 32 = 1/16).
  norms (f32): per layer 5·H + d (q_norm) + d (k_norm, owners) + 1 (layer_scalar); plus P + H.
  embed V·H (bf16 or f32); PLE table V·L·P in bf16 (2 B), int8 (1 B + a bf16 scale per 256-slice:
  V·L·2 B) or int4 (1/2 B + the same scales).
  KV per token (both K and V): Σ over owners 2·kvh·d·bytes (+ 2·kvh·2 B bf16 scales for int8).
"""

from __future__ import annotations

import jax
import pytest

from g4bench.model.config import load_config
from g4bench.model.kv_cache import CacheLayout, init_cache
from g4bench.model.params import WeightFormat, init_params, param_specs, tree_bytes

# Architecture by hand (capacity-anchors D2 / issue 2), not read from the config objects.
ARCH = {
    "e2b": dict(H=1536, V=262144, L=35, nh=8, kvh=1, hd=256, ghd=512, I=6144, P=256, first=15, double=True,
                full=(4, 9, 14, 19, 24, 29, 34)),
    "e4b": dict(H=2560, V=262144, L=42, nh=8, kvh=2, hd=256, ghd=512, I=10240, P=256, first=24, double=False,
                full=(5, 11, 17, 23, 29, 35, 41)),
}  # fmt: skip
LINEAR_BYTES = {"w4a16": lambda n: n * 9 // 16, "bf16": lambda n: 2 * n, "f32": lambda n: 4 * n}


def hand_param_bytes(a: dict, layers: str, ple: str, embed: str) -> int:
    H, V, L, P = a["H"], a["V"], a["L"], a["P"]
    linear = H * L * P  # ple_proj
    norms = P + H  # ple_norm, final_norm
    for i in range(L):
        d = a["ghd"] if i in a["full"] else a["hd"]
        owner = i < a["first"]
        width = a["I"] * (2 if a["double"] and not owner else 1)
        linear += 2 * H * a["nh"] * d + (2 * H * a["kvh"] * d if owner else 0) + 3 * H * width + 2 * H * P
        norms += 5 * H + d + (d if owner else 0) + 1
    table = {"bf16": 2 * V * L * P, "int8": V * L * P + 2 * V * L, "int4": V * L * P // 2 + 2 * V * L}[ple]
    return LINEAR_BYTES[layers](linear) + table + V * H * {"bf16": 2, "f32": 4}[embed] + 4 * norms


def hand_kv_bytes_per_token(a: dict, kv_dtype: str) -> int:
    per_elem = {"bf16": 2, "int8": 1, "f32": 4}[kv_dtype]
    total = 0
    for i in range(a["first"]):
        d = a["ghd"] if i in a["full"] else a["hd"]
        total += 2 * a["kvh"] * d * per_elem + (2 * a["kvh"] * 2 if kv_dtype == "int8" else 0)
    return total


def test_e2b_known_figures():
    """The two figures issue 2 quotes, by the hand arithmetic above."""
    e2b = ARCH["e2b"]
    assert hand_param_bytes(e2b, "w4a16", "bf16", "bf16") == 6_559_782_028  # ≈ 6.56 GB
    assert hand_kv_bytes_per_token(e2b, "bf16") == 18_432  # 12 sliding × 1 KiB + 3 full × 2 KiB
    assert hand_kv_bytes_per_token(e2b, "int8") == 9_216 + 15 * 2 * 2
    assert hand_kv_bytes_per_token(ARCH["e4b"], "bf16") == 20 * 2048 + 4 * 4096


@pytest.mark.parametrize("model", ["e2b", "e4b"])
@pytest.mark.parametrize("layers", ["w4a16", "bf16", "f32"])
@pytest.mark.parametrize("ple", ["bf16", "int8", "int4"])
def test_param_bytes_per_format(model, layers, ple):
    cfg = load_config(model)
    fmt = WeightFormat(layers=layers, ple=ple, embed="f32" if layers == "f32" else "bf16")
    assert tree_bytes(param_specs(cfg, fmt)) == hand_param_bytes(ARCH[model], layers, ple, fmt.embed)


@pytest.mark.parametrize("model", ["e2b", "e4b"])
def test_synthetic_init_has_the_described_shapes(model):
    """init_params, traced with jax.eval_shape (nothing allocated on the device), builds exactly the spec tree."""
    cfg = load_config(model)
    fmt = WeightFormat(layers="w4a16", ple="int4")
    shapes = jax.eval_shape(lambda: init_params(cfg, fmt, seed=0))
    specs = param_specs(cfg, fmt)
    assert jax.tree_util.tree_structure(shapes) == jax.tree_util.tree_structure(specs)
    assert all(
        (a.shape, a.dtype) == (b.shape, b.dtype)
        for a, b in zip(jax.tree_util.tree_leaves(shapes), jax.tree_util.tree_leaves(specs), strict=True)
    )


@pytest.mark.parametrize("model", ["e2b", "e4b"])
@pytest.mark.parametrize("kv_dtype", ["bf16", "int8"])
def test_kv_bytes_per_token(model, kv_dtype):
    cfg, a, ctx = load_config(model), ARCH[model], 1024
    full_len = jax.eval_shape(lambda: init_cache(cfg, 2, CacheLayout(max_len=ctx, kv_dtype=kv_dtype)))
    assert tree_bytes(full_len) == 2 * ctx * hand_kv_bytes_per_token(a, kv_dtype)
    assert cfg.kv_bytes_per_token(kv_dtype) == hand_kv_bytes_per_token(a, kv_dtype)

    # Ring: sliding layers hold the 512-entry window whatever the context; full layers hold ctx.
    ring = jax.eval_shape(lambda: init_cache(cfg, 1, CacheLayout(max_len=ctx, kv_dtype=kv_dtype, ring=True)))
    per_elem = {"bf16": 2, "int8": 1}[kv_dtype]
    per_seq = 0
    for i in range(a["first"]):
        d = a["ghd"] if i in a["full"] else a["hd"]
        per_token = 2 * a["kvh"] * d * per_elem + (4 * a["kvh"] if kv_dtype == "int8" else 0)
        per_seq += per_token * (ctx if i in a["full"] else 512)
    assert tree_bytes(ring) == per_seq
    assert cfg.kv_bytes_per_token(kv_dtype, sliding="ring", ctx=ctx) == pytest.approx(per_seq / ctx)


def test_e2b_ring_kv_at_8k():
    """E2B at ctx 8192 with a ring: 12 sliding layers × 1 KiB × 512 + 3 full layers × 2 KiB × 8192."""
    per_seq = 12 * 1024 * 512 + 3 * 2048 * 8192
    assert per_seq == 56_623_104
    assert load_config("e2b").kv_bytes_per_token("bf16", sliding="ring", ctx=8192) == per_seq / 8192 == 6912
