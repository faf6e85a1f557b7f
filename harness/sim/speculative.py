"""Does speculative decoding pay? Speculative TPOT and goodput beside plain decoding, per batch.

    rows = price_speculative(pricer, drafter_cfg, k=3, accept_rate=0.7, batches=(1, 4, 8, 32), ctx=8192)

Data flow per batch B (every sequence at context `ctx`):

    t_decode  = pricer's decode model on decode_cost(B, ctx)                     plain: 1 token / step
    t_verify  = the profile's prefill model (mixed if it has one) on verify_cost(B, k, ctx):
                B sequences × (k+1) query tokens in one step, every position's logits
    t_draft   = the decode model on draft_cost(B, ctx): one drafter step (its weights, the target's
                KV re-read by each drafter layer, its head); k of them per round
    E[tokens per round] = (1 − α^(k+1)) / (1 − α)       α = per-draft acceptance (i.i.d.), k+1 at α = 1
    speculative TPOT = (k·t_draft + t_verify) / E;   goodput = B·E / (k·t_draft + t_verify)
    break-even α*: E(α*) = (k·t_draft + t_verify) / t_decode (bisection; "never" when even α = 1
                   does not pay, i.e. the round costs more than k+1 plain steps)

The costs come from g4bench.model.costs' parts, so the same roofline features feed the fitted
model as for decode and prefill (harness/calibrate/steptime.py). `basis` says which fitted model
priced each step: a verify priced by the decode model's rates (no prefill fit) says so.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from g4bench.model import costs
from g4bench.model.drafter import DrafterConfig, drafter_specs
from g4bench.model.params import tree_bytes

DEFAULT_BATCHES = (1, 4, 8, 32)


def verify_cost(cfg: Any, fmt: Any, layout: Any, batch: int, k: int, kv_len: int) -> costs.StepCost:
    """One verify step: `batch` sequences × (k+1) new positions, every layer on every position
    (all k+1 logits are needed, so KV-shared layers cannot run on the last position alone)."""
    if batch < 1 or k < 1 or kv_len < 1:
        raise ValueError(f"batch, k and kv_len must be positive, got {batch}, {k}, {kv_len}")
    q = k + 1
    rows = costs.gathered_row_bytes(cfg, fmt)
    base = costs.decode_cost(cfg, fmt, layout, batch, kv_len)
    parts = {
        **costs.streamed_weight_bytes(cfg, fmt),
        "embed_gather": batch * q * rows["embed"],
        "ple_gather": batch * q * rows["ple"],
        "kv_read": costs.kv_read_bytes(cfg, layout, batch, kv_len),
        "kv_write": costs.kv_write_bytes(cfg, layout, batch, q),
        "kv_copy": 0,
        "logits": 2 * batch * q * cfg.vocab_size * costs.LOGIT_BYTES,
    }
    flops = {name: q * v for name, v in base.flops_by_part.items()}  # every part scales with queries
    return costs.StepCost(bytes_by_part=parts, flops_by_part=flops)


def draft_cost(
    dc: DrafterConfig, target: Any, fmt: Any, layout: Any, batch: int, kv_len: int
) -> costs.StepCost:
    """One drafter step for `batch` sequences: its linears streamed once, each drafter layer reads
    the target's KV of its type (the target's last KV-owning layer), and its head scores the whole
    vocabulary (or, with ordered embeddings, the centroids and top-k clusters' rows)."""
    specs = drafter_specs(dc, fmt)
    embed = specs.pop("embed")
    specs.pop("token_ordering", None)
    weights = tree_bytes(specs)
    per_pos = costs.kv_position_bytes(target, layout)
    c = dc.text
    kv = 0
    attn = 0
    for i, ltype in enumerate(c.layer_types):
        src = target.kv_store_layer(ltype)
        keys = costs.keys_read(target, layout, src, kv_len)
        kv += batch * per_pos[src] * keys
        attn += 4 * batch * c.num_attention_heads * c.head_dim_of(i) * keys
    row_bytes = embed.shape[1] * embed.dtype.itemsize
    if dc.use_ordered_embeddings:
        scored = dc.centroid_top_k * (c.vocab_size // dc.num_centroids)
        head_bytes = batch * scored * row_bytes
        head_flops = 2 * batch * c.hidden_size * (scored + dc.num_centroids)
    else:
        head_bytes = tree_bytes(embed)
        head_flops = 2 * batch * c.hidden_size * c.vocab_size
    linear_params = _linear_params(specs)
    parts = {
        "weights": weights,
        "lm_head": head_bytes,
        "embed_gather": batch * costs.gathered_row_bytes(target, fmt)["embed"],
        "kv_read": kv,
        "logits": 2 * batch * c.vocab_size * costs.LOGIT_BYTES,
    }
    flops = {"linears": 2 * batch * linear_params, "attention": attn, "lm_head": head_flops}
    return costs.StepCost(bytes_by_part=parts, flops_by_part=flops)


def _linear_params(tree: Any) -> int:
    """Weights (unpacked) of every linear in a spec tree: `w` [in, out] or W4A16 `packed` [out, in/8]."""
    if isinstance(tree, list):
        return sum(_linear_params(v) for v in tree)
    if not isinstance(tree, dict):
        return 0
    if "w" in tree:
        return int(tree["w"].shape[0] * tree["w"].shape[1])
    if "packed" in tree:
        return int(tree["packed"].shape[0] * tree["packed"].shape[1] * 8)
    return sum(_linear_params(v) for v in tree.values())


def expected_tokens(alpha: float, k: int) -> float:
    """Tokens emitted per verify round at per-draft acceptance α (i.i.d.): Σ_{i≤k} α^i."""
    if not 0 <= alpha <= 1:
        raise ValueError(f"acceptance rate must be in [0, 1], got {alpha}")
    return float(k + 1) if alpha == 1 else (1 - alpha ** (k + 1)) / (1 - alpha)


def break_even(round_over_decode: float, k: int) -> float | None:
    """α at which a round (k drafts + verify, in plain decode steps) emits as many tokens as it
    costs; None when even α = 1 does not pay."""
    if round_over_decode > k + 1:
        return None
    if round_over_decode <= 1:
        return 0.0
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if expected_tokens(mid, k) < round_over_decode else (lo, mid)
    return hi


@dataclass
class SpecRow:
    batch: int
    ctx: int
    k: int
    accept_rate: float
    decode_ms: float
    verify_ms: float
    draft_ms: float
    basis: dict[str, str]

    @property
    def round_ms(self) -> float:
        return self.k * self.draft_ms + self.verify_ms

    @property
    def tokens_per_round(self) -> float:
        return expected_tokens(self.accept_rate, self.k)

    @property
    def spec_tpot_ms(self) -> float:
        return self.round_ms / self.tokens_per_round

    @property
    def speedup(self) -> float:
        return self.decode_ms / self.spec_tpot_ms

    @property
    def break_even_accept(self) -> float | None:
        return break_even(self.round_ms / self.decode_ms, self.k)

    def as_dict(self) -> dict[str, Any]:
        return {
            "batch": self.batch, "ctx": self.ctx, "k": self.k, "accept_rate": self.accept_rate,
            "decode_ms": self.decode_ms, "verify_ms": self.verify_ms, "draft_ms": self.draft_ms,
            "round_ms": self.round_ms, "tokens_per_round": self.tokens_per_round,
            "plain_tpot_ms": self.decode_ms, "spec_tpot_ms": self.spec_tpot_ms,
            "plain_goodput_tok_s": 1e3 * self.batch / self.decode_ms,
            "spec_goodput_tok_s": 1e3 * self.batch / self.spec_tpot_ms,
            "speedup": self.speedup, "break_even_accept": self.break_even_accept, "basis": self.basis,
        }  # fmt: skip


def price_speculative(
    pricer: Any,
    dc: DrafterConfig,
    *,
    k: int,
    accept_rate: float,
    batches: tuple[int, ...] = DEFAULT_BATCHES,
    ctx: int = 8192,
) -> list[SpecRow]:
    """One SpecRow per batch, priced by `pricer` (harness/sim/pricing.py's StepPricer)."""
    expected_tokens(accept_rate, k)  # validates α
    if k < 1:
        raise ValueError(f"--spec-k must be >= 1, got {k}")
    dc.check_target(pricer.cfg)
    cfg, fmt, layout = pricer.cfg, pricer.fmt, pricer.layout
    verify_model = "mixed" if pricer.profile is not None and pricer.profile.model("mixed") else "prefill"
    out = []
    for b in batches:
        ms = {
            "decode": _ms(pricer, "decode", costs.decode_cost(cfg, fmt, layout, b, ctx)),
            "verify": _ms(pricer, verify_model, verify_cost(cfg, fmt, layout, b, k, ctx)),
            "draft": _ms(pricer, "decode", draft_cost(dc, cfg, fmt, layout, b, ctx)),
        }
        basis = {
            "decode": pricer.model_for("decode")[1],
            "verify": pricer.model_for(verify_model)[1],
            "draft": pricer.model_for("decode")[1],
        }
        out.append(SpecRow(b, ctx, k, accept_rate, ms["decode"], ms["verify"], ms["draft"], basis))
    return out


def _ms(pricer: Any, program: str, cost: costs.StepCost) -> float:
    model, _ = pricer.model_for(program)
    if model is not None:
        return float(model.predict(cost))
    if not (pricer.peak_bytes_per_s and pricer.peak_flop_per_s):
        raise ValueError("no profile and no hardware peak figures: cannot price a speculative step")
    return 1e3 * max(cost.bytes / pricer.peak_bytes_per_s, cost.flops / pricer.peak_flop_per_s)


def run_speculative(
    target: Any, *, k: int, accept_rate: float, batches: tuple[int, ...], ctx: int, kv_dtype: str = "bf16",
    sliding_kv: str = "ring", drafter: str | None = None,
) -> dict[str, Any]:  # fmt: skip
    """`plan --spec-k`: price plain vs speculative decoding on `target` (harness/sim/planner.py's
    Target) with the `<model>-assistant` drafter preset (or `drafter`); returns the JSON document."""
    from g4bench.model.drafter import load_drafter_config
    from harness.sim.simulate import ServerShape

    dc = load_drafter_config(drafter or f"{target.model}-assistant")
    shape = ServerShape(model=target.model, max_slots=max(batches), max_len=ctx + 256, kv_dtype=kv_dtype,
                        sliding_kv=sliding_kv)  # fmt: skip
    rows = price_speculative(
        target.pricer_for(shape), dc, k=k, accept_rate=accept_rate, batches=batches, ctx=ctx
    )
    assumptions = [
        *target.assumptions,
        f"drafter {dc.name} ({dc.text.num_hidden_layers} layers, hidden {dc.text.hidden_size}; dims assumed, "
        "see its preset's _source); draft steps priced with the decode model",
        f"acceptance α = {accept_rate:g} per draft, independent across drafts (E[tokens/round] = (1−α^(k+1))/(1−α)); "
        f"KV {kv_dtype}, sliding {sliding_kv}, every sequence at ctx {ctx}",
        "verify = one step with k+1 query tokens per sequence and all k+1 logits (harness/sim/speculative.py)",
    ]
    return {"target": target.id, "k": k, "accept_rate": accept_rate, "ctx": ctx, "drafter": dc.name,
            "assumptions": assumptions, "rows": [r.as_dict() for r in rows]}  # fmt: skip


def print_speculative(doc: dict[str, Any], console: Any) -> None:
    from rich.markup import escape

    from harness.tables import fitted_table

    for line in doc["assumptions"]:
        console.print(f"  assumption: {escape(line)}", soft_wrap=True)
    for program, basis in doc["rows"][0]["basis"].items():
        console.print(f"  priced: {program} by {escape(basis)}", soft_wrap=True)

    def be(v: float | None) -> str:
        return "never" if v is None else f"{v:.2f}"

    table = [
        [str(r["batch"]), f"{r['decode_ms']:.2f}", f"{r['verify_ms']:.2f}", f"{r['draft_ms']:.2f}",
         f"{r['spec_tpot_ms']:.2f}", f"{r['plain_goodput_tok_s']:.0f}", f"{r['spec_goodput_tok_s']:.0f}",
         f"{r['speedup']:.2f}×", be(r["break_even_accept"])]
        for r in doc["rows"]
    ]  # fmt: skip
    title = (f"plan · {doc['target']} · speculative k={doc['k']} α={doc['accept_rate']:g} · ctx {doc['ctx']} "
             "(ms; tok/s per chip)")  # fmt: skip
    console.print(fitted_table(title, ["batch", "decode", "verify", "draft", "spec TPOT", "plain tok/s",
                                       "spec tok/s", "speedup", "break-even α"], table))  # fmt: skip
