"""The library side of `g4bench verify`: our engine against transformers on the same weights and prompt.

Data flow:

    checkpoint dir ──load_checkpoint(f32)──▶ our params ──forward(all_logits)──▶ prefill logits [P, V]
                                                       └─Engine.prefill/decode─▶ greedy tokens g0..gN,
                                                                                 decode logits [N, V]
    prompt + g0..g(N-1) ──transformers (hf_logits, float64 or float32)──▶ reference logits [P+N, V]

The reference runs once over the whole sequence our engine produced (teacher forcing): causal
attention makes its logits at position t those of a fresh forward over the first t+1 tokens, so
prefill position t compares with reference row t and decode step k (fed at position P+k-1) with
row P+k-1. Greedy agreement counts the generated tokens whose argmax matches the reference's
argmax at the same position; a disagreement at a near-tie (top-2 reference gap below the
tolerance) is reported as such rather than as an error.

The tolerance scales with the checkpoint. A fixed 1e-4 fits the checkpoints we designed, but on
one with large activations (strong norm weights, say) float32 arithmetic itself is off by more: a
held-out tiny checkpoint gave transformers' own float32 run a max |Δlogit| of 1.5e-3 against its
float64 run. So with a float64 reference, transformers also runs the same sequence in float32, and
its max |Δlogit| against float64 over the same positions is the *float32 floor*: the error any
correct float32 implementation can be expected to show there. Ours is judged against
max(tolerance, 2 × floor), and both figures are reported.

Our side always computes in f32 with an f32 KV cache (the platform's bf16 compute would be its own,
much larger, error), and a W4A16 checkpoint is dequantized at load to exactly the bf16 values
compressed-tensors produces, which is also what the reference runs with.

Needs the `parity` extra (torch, transformers, compressed-tensors); they are imported only inside
the reference call, so importing this module needs none of them.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

PARITY_INSTALL_HINT = "pip install 'g4bench[parity]'  (CPU wheels: torch==2.13.0 from the PyTorch CPU index)"


@dataclass
class VerifyReport:
    """Per-position max |Δlogit| of our engine against the reference, and greedy agreement."""

    checkpoint: str
    reference_dtype: str
    prompt: list[int]
    prefill_err: np.ndarray  # f32[P]: max over vocab of |ours − ref| at each prompt position
    decode_err: np.ndarray  # f32[N]: the same for decode steps 1..N
    ours: list[int]  # g0..gN: g0 from the prefill, g_k from decode step k
    ref_argmax: list[int]  # the reference's argmax at the positions g0..gN were chosen from
    ref_gap: list[float]  # the reference's top-2 logit gap at those positions
    tolerance: float  # the fixed floor of the tolerance (1e-4 by default)
    notes: list[str] = field(default_factory=list)
    # transformers' float32 max |Δlogit| against its float64 run over the same positions (None
    # when not measured: a float32 reference, or the floor switched off)
    f32_floor: float | None = None

    @property
    def effective_tolerance(self) -> float:
        """max(tolerance, 2 × the float32 floor): what the max error is judged against."""
        return self.tolerance if self.f32_floor is None else max(self.tolerance, 2.0 * self.f32_floor)

    @property
    def max_err(self) -> float:
        return float(max(self.prefill_err.max(initial=0.0), self.decode_err.max(initial=0.0)))

    @property
    def agreement(self) -> int:
        return sum(a == b for a, b in zip(self.ours, self.ref_argmax, strict=True))

    @property
    def near_tie_disagreements(self) -> int:
        return sum(
            a != b and gap < self.effective_tolerance
            for a, b, gap in zip(self.ours, self.ref_argmax, self.ref_gap, strict=True)
        )

    @property
    def passed(self) -> bool:
        """Within tolerance everywhere, and every greedy disagreement is a reference near-tie."""
        return (
            self.max_err <= self.effective_tolerance
            and self.agreement + self.near_tie_disagreements == len(self.ours)
        )


def make_prompt(vocab_size: int, length: int, seed: int = 0, bos: int = 2) -> list[int]:
    """BOS followed by `length − 1` random non-special ids (deterministic in `seed`)."""
    rng = np.random.default_rng(seed)
    return [bos, *rng.integers(3, vocab_size, size=max(0, length - 1)).tolist()]


def ours_logits(
    checkpoint: str | Path,
    prompt: list[int],
    decode_steps: int,
    *,
    sliding_kv: str = "ring",
    chunk_size: int | None = None,
) -> tuple[np.ndarray, np.ndarray, list[int]]:
    """Our side: (prefill logits f32[P, V], decode logits f32[N, V], greedy tokens g0..gN).

    The prefill logits come from one `forward(all_logits=True)` over the prompt; the greedy
    continuation from the engine (prefill in chunks of `chunk_size`, then `decode_steps` steps)."""
    import jax
    import jax.numpy as jnp

    from g4bench.engine.engine import Engine
    from g4bench.engine.engine_config import EngineConfig
    from g4bench.model.checkpoint import load_checkpoint, to_device
    from g4bench.model.forward import forward
    from g4bench.model.kv_cache import CacheLayout, init_cache
    from g4bench.model.params import WeightFormat

    cfg, host = load_checkpoint(checkpoint, WeightFormat(layers="f32", ple="f32", embed="f32"))
    params = to_device(host)
    P = len(prompt)
    layout = CacheLayout(max_len=P, kv_dtype="f32", ring=False)
    run = jax.jit(forward, static_argnames=("cfg", "layout", "all_logits", "compute_dtype"))
    all_logits, _ = run(
        params,
        jnp.asarray([prompt], jnp.int32),
        jnp.zeros((1,), jnp.int32),
        jnp.full((1,), P, jnp.int32),
        init_cache(cfg, 1, layout),
        cfg=cfg,
        layout=layout,
        all_logits=True,
        compute_dtype=jnp.float32,
    )
    prefill = np.asarray(all_logits[0])

    chunk = chunk_size or P
    max_len = P + decode_steps + 1
    ecfg = EngineConfig(
        max_slots=1,
        max_len=max_len,
        kv_dtype="f32",
        sliding_kv=sliding_kv,
        chunk_size=chunk,
        min_kv_bucket=max_len,
        keep_logits=True,
    )
    engine = Engine(cfg, params, ecfg, compute_dtype=jnp.float32)
    from g4bench.engine.sampling import SamplingParams

    for s in range(0, P, chunk):
        nxt = engine.prefill(0, prompt[s : s + chunk], s, SamplingParams() if s + chunk >= P else None)
    assert nxt is not None
    tokens = [nxt]
    decode = []
    for k in range(decode_steps):
        out = engine.decode(np.array([tokens[-1]]), np.array([P + k]), np.array([True]))
        assert engine.last_logits is not None
        decode.append(np.asarray(engine.last_logits[0]))
        tokens.append(int(out[0]))
    V = prefill.shape[-1]
    return prefill, np.asarray(decode, np.float32).reshape(decode_steps, V), tokens


def verify_checkpoint(
    checkpoint: str | Path,
    *,
    prompt_len: int = 40,
    decode_steps: int = 8,
    tolerance: float = 1e-4,
    reference_dtype: str = "float64",
    seed: int = 0,
    sliding_kv: str = "ring",
    chunk_size: int | None = None,
    f32_floor: bool = True,
) -> VerifyReport:
    """Run both sides on one random prompt; raises ImportError when the parity extra is missing.
    With `f32_floor` and a float64 reference, transformers also runs in float32 to measure the
    floor the tolerance scales with (module docstring)."""
    if prompt_len < 1 or decode_steps < 0:
        raise ValueError(f"prompt_len must be >= 1 and decode_steps >= 0, got {prompt_len}, {decode_steps}")
    if reference_dtype not in ("float64", "float32"):
        raise ValueError(f"reference_dtype must be float64 or float32, got {reference_dtype!r}")
    import torch  # noqa: F401  (fail early and precisely when the parity extra is missing)
    import transformers  # noqa: F401

    from g4bench.model.config import load_config
    from harness.checks.parity import hf_logits

    cfg = load_config(checkpoint)
    prompt = make_prompt(cfg.vocab_size, prompt_len, seed, cfg.bos_token_id)
    prefill, decode, ours = ours_logits(
        checkpoint, prompt, decode_steps, sliding_kv=sliding_kv, chunk_size=chunk_size
    )
    sequence = [prompt + ours[:-1]]
    ref = hf_logits(checkpoint, sequence, dtype=reference_dtype)[0]  # [P+N, V]
    floor = None
    if f32_floor and reference_dtype == "float64":
        floor = float(np.abs(hf_logits(checkpoint, sequence, dtype="float32")[0] - ref).max())
    P = len(prompt)
    chosen = ref[P - 1 :]  # rows g0..gN were chosen from
    top2 = np.sort(chosen, axis=-1)[:, -2:]
    report = VerifyReport(
        checkpoint=str(checkpoint),
        reference_dtype=reference_dtype,
        prompt=prompt,
        prefill_err=np.abs(prefill - ref[:P]).max(axis=-1),
        decode_err=np.abs(decode - ref[P:]).max(axis=-1) if decode_steps else np.zeros(0, np.float32),
        ours=ours,
        ref_argmax=np.argmax(chosen, axis=-1).tolist(),
        ref_gap=(top2[:, 1] - top2[:, 0]).tolist(),
        tolerance=tolerance,
        f32_floor=floor,
    )
    if prompt_len <= cfg.sliding_window:
        report.notes.append(
            f"prompt ({prompt_len}) does not exceed the sliding window ({cfg.sliding_window}): "
            "the window cutoff is not exercised"
        )
    return report


def verify_config(config: str | Path, *, seed: int = 0, **kwargs) -> VerifyReport:
    """Synthetic random weights for `config` (transformers' own save_pretrained, in a temporary
    directory) verified like a checkpoint."""
    import torch  # noqa: F401  (the parity extra, before any work)

    from g4bench.model.config import resolve_config_path
    from harness.checks.parity import write_hf_checkpoint

    path = resolve_config_path(config)
    with tempfile.TemporaryDirectory(prefix="g4bench-verify-") as tmp:
        ckpt = write_hf_checkpoint(path, Path(tmp) / "ckpt", seed=seed)
        report = verify_checkpoint(ckpt, seed=seed, **kwargs)
    report.checkpoint = f"{path} (synthetic weights, seed {seed})"
    return report
