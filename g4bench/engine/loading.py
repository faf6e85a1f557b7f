"""From a `--model` argument to ready parameters: a preset or config (synthetic weights) or a checkpoint.

    cfg, params, tokenizer_dir = load_model("e2b")          # synthetic, checkpoint shapes
    engine, tokenizer_dir = load_engine("/ckpt/gemma-4-E2B-it-qat-w4a16-ct", EngineConfig())

`model` is a preset short name ("e2b", "e4b", "small", "tiny-a"), a config .json path (synthetic
weights with exactly that config's shapes) or a checkpoint directory (config.json + *.safetensors,
weights read without torch; its tokenizer.json is used by the server and `generate`).
"""

from __future__ import annotations

from pathlib import Path

import jax

from g4bench.engine.engine import Engine, platform_compute_dtype
from g4bench.engine.engine_config import EngineConfig
from g4bench.model.checkpoint import load_checkpoint, to_device
from g4bench.model.config import ModelConfig, load_config
from g4bench.model.params import Params, WeightFormat, init_params


def default_format(cfg: ModelConfig | None = None) -> WeightFormat:
    """The synthetic-weight storage used when none is asked for.

    Accelerators: the QAT checkpoint's own layout (W4A16 layers, bf16 PLE table and embeddings).
    CPU: f32 dense layers and embeddings, bf16 PLE table. Measured on a 2-core host (DESIGN.md,
    Machines): f32 matmuls are the fastest CPU path at every batch, bf16 weights cast at use cost
    5-10× more, and W4A16 unpacking only fuses at batch 1; the gathered PLE table costs nothing to
    keep in bf16."""
    if platform_compute_dtype() == jax.numpy.float32:
        return WeightFormat(layers="f32", ple="bf16", embed="f32")
    return WeightFormat(layers="w4a16", ple="bf16", embed="bf16")


def is_checkpoint(model: str | Path) -> bool:
    p = Path(model)
    return p.is_dir() and any(p.glob("*.safetensors"))


def load_model(
    model: str | Path, fmt: WeightFormat | None = None, seed: int = 0
) -> tuple[ModelConfig, Params, Path | None]:
    """(config, device params, tokenizer directory or None for synthetic models)."""
    if is_checkpoint(model):
        cfg, host = load_checkpoint(model, fmt)
        tok_dir = Path(model) if (Path(model) / "tokenizer.json").is_file() else None
        return cfg, to_device(host), tok_dir
    cfg = load_config(model)
    return cfg, init_params(cfg, fmt or default_format(cfg), seed), None


def load_engine(
    model: str | Path, ecfg: EngineConfig | None = None, fmt: WeightFormat | None = None, seed: int = 0
) -> tuple[Engine, Path | None]:
    cfg, params, tok_dir = load_model(model, fmt, seed)
    return Engine(cfg, params, ecfg or EngineConfig()), tok_dir
