"""Reference side of correctness: transformers' Gemma4ForCausalLM and compressed-tensors.

Everything here talks to ``torch``, ``transformers`` and ``compressed_tensors`` (the ``parity`` extra).
Those are imported lazily inside the functions, so this module imports without torch.

- ``write_hf_checkpoint``: a Gemma4ForCausalLM with deterministic random weights (fp32), saved by
  ``save_pretrained`` (safetensors + config.json).
- ``hf_logits``: transformers' logits (fp32, eager attention) for a checkpoint, dense or compressed.
- ``write_ct_w4a16_checkpoint``: the same weights cast to bf16, quantized (symmetric int4, group 32,
  min-max scales) and compressed to ``pack-quantized`` by compressed-tensors itself, then saved.
- ``ct_decompressed_weights``: compressed-tensors' own decompression of every packed tensor.

A tensor's random values depend only on ``seed`` and its name, so the dense and the W4A16
checkpoint written with the same config and seed hold the same weights before quantization.

Notes on transformers 5.24 that matter to the engine side:
- ``save_pretrained`` writes no ``global_head_dim``: ``Gemma4TextConfig`` pops it and writes
  ``per_layer_config: {"<full layer index>": {"head_dim": <global_head_dim>}}`` instead.
- The tied ``lm_head.weight`` is not saved; ``layer_scalar`` is saved as ``model.layers.N.layer_scalar``
  with shape [1]; KV-shared layers have no k_proj/v_proj/k_norm (and v_norm never has a weight).
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

# Random-weight scales (see build_hf_model). With scaling 1.0 and unit q/k norm weights the attention
# scores have std ~sqrt(head_dim) and the tiny models amplify f32 rounding to ~5e-4 in the logits
# (f32 vs f64 forward), which no independent f32 implementation could match to 1e-4. q/k norm
# weights around 0.3 and embeddings at 0.3 bring that to ~2e-5 with logits up to ~10-15, where the
# final softcap (30) still bends them.
LINEAR_STD = 0.08
EMBED_STD = 0.3
NORM_STD = 0.1
QK_NORM_MEAN, QK_NORM_STD = 0.3, 0.05
LAYER_SCALAR_RANGE = (0.3, 1.0)

# The W4A16 scheme of the Gemma 4 QAT "-qat-w4a16-ct" exports.
W4A16_GROUP_SIZE = 32
W4A16_IGNORE = ("lm_head",)


def load_config_dict(config: dict[str, Any] | str | Path) -> dict[str, Any]:
    """A flat Gemma4TextConfig dict from a dict or a config .json path (nested ``text_config`` accepted)."""
    d = json.loads(Path(config).read_text()) if isinstance(config, (str, Path)) else dict(config)
    if isinstance(d.get("text_config"), dict):
        d = dict(d["text_config"])
    d.pop("quantization_config", None)
    d["model_type"] = "gemma4_text"
    d["architectures"] = ["Gemma4ForCausalLM"]
    return d


def shared_kv_layers(config: dict[str, Any] | str | Path) -> list[int]:
    """Indices of the layers that reuse another layer's KV (transformers' kv_sharing_modes == "reuse")."""
    d = load_config_dict(config)
    n = int(d["num_hidden_layers"])
    return list(range(n - int(d.get("num_kv_shared_layers") or 0), n))


def _random_value(name: str, shape: tuple[int, ...], seed: int) -> np.ndarray:
    """Deterministic float32 values for one named tensor (depends on seed and name only)."""
    rng = np.random.default_rng([seed, zlib.crc32(name.encode())])
    if name.endswith("layer_scalar"):
        lo, hi = LAYER_SCALAR_RANGE
        return rng.uniform(lo, hi, size=shape).astype(np.float32)
    if name.endswith(("q_norm.weight", "k_norm.weight")):
        return (QK_NORM_MEAN + QK_NORM_STD * rng.standard_normal(shape)).astype(np.float32)
    if len(shape) == 1:  # every other 1-D parameter of Gemma 4 text is an RMSNorm weight
        return (1.0 + NORM_STD * rng.standard_normal(shape)).astype(np.float32)
    if name.endswith(("embed_tokens.weight", "embed_tokens_per_layer.weight")):
        return (EMBED_STD * rng.standard_normal(shape)).astype(np.float32)
    return (LINEAR_STD * rng.standard_normal(shape)).astype(np.float32)


def build_hf_model(config: dict[str, Any] | str | Path, seed: int = 0):
    """A Gemma4ForCausalLM (fp32, eval mode, eager attention) with deterministic random weights.

    RMSNorm weights 1 + 0.1·N(0,1), except q_norm/k_norm 0.3 + 0.05·N(0,1) (see LINEAR_STD's comment);
    ``layer_scalar`` U[0.3, 1.0]; embeddings (token and PLE, the pad row included) 0.3·N(0,1); every
    linear 0.08·N(0,1). The LM head is tied to ``embed_tokens``.
    """
    import torch
    from transformers import Gemma4ForCausalLM, Gemma4TextConfig
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # per-tensor load/save bars are noise for tiny checkpoints
    cfg = Gemma4TextConfig(**load_config_dict(config))
    cfg._attn_implementation = "eager"
    torch.manual_seed(seed)
    # transformers types .to() through a decorator wrapper whose stub loses the dtype overload
    model = Gemma4ForCausalLM(cfg).to(torch.float32).eval()  # type: ignore[arg-type]
    if not cfg.tie_word_embeddings:
        raise ValueError("g4bench's Gemma 4 E-series configs tie the LM head (tie_word_embeddings: true)")
    with torch.no_grad():
        for name, tensor in model.state_dict().items():
            if name == "lm_head.weight":
                continue  # tied: same storage as model.embed_tokens.weight
            value = _random_value(name, tuple(tensor.shape), seed)
            tensor.copy_(torch.from_numpy(value))
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    return model


def write_hf_checkpoint(
    config: dict[str, Any] | str | Path,
    out_dir: str | Path,
    seed: int = 0,
    extra_shared_kv: bool = False,
) -> Path:
    """Write an fp32 Gemma4ForCausalLM checkpoint with random weights via ``save_pretrained``.

    Files: model.safetensors (names ``model.embed_tokens.weight``, ``model.layers.N...``, no
    ``lm_head.weight``), config.json, generation_config.json. With ``extra_shared_kv`` the KV-shared
    layers also get unused ``self_attn.{k_proj,v_proj,k_norm}.weight`` tensors (random), as in the
    base ``google/gemma-4-E2B-it`` export; transformers ignores them on load.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model = build_hf_model(config, seed)
    model.save_pretrained(out)
    if extra_shared_kv:
        _add_shared_kv_tensors(model, out, seed)
    return out


def _add_shared_kv_tensors(model, out: Path, seed: int) -> None:
    import torch
    from safetensors.torch import load_file, save_file

    cfg = model.config
    path = out / "model.safetensors"
    tensors = load_file(path)
    for i in shared_kv_layers(cfg.to_dict()):
        head_dim = cfg.per_layer_config[i].head_dim
        n_kv_heads = cfg.per_layer_config[i].num_key_value_heads
        shapes = {
            "k_proj.weight": (n_kv_heads * head_dim, cfg.hidden_size),
            "v_proj.weight": (n_kv_heads * head_dim, cfg.hidden_size),
            "k_norm.weight": (head_dim,),
        }
        for suffix, shape in shapes.items():
            name = f"model.layers.{i}.self_attn.{suffix}"
            tensors[name] = torch.from_numpy(_random_value(name, shape, seed + 1))
    save_file(tensors, path, metadata={"format": "pt"})


def _token_tensor(token_ids: Sequence[Sequence[int]] | np.ndarray):
    import torch

    ids = np.asarray(token_ids, dtype=np.int64)
    if ids.ndim != 2:
        raise ValueError(f"token_ids must be [batch, seq] with rows of equal length; got shape {ids.shape}")
    return torch.from_numpy(ids)


def load_hf_model(checkpoint_dir: str | Path, dtype: str = "float32"):
    """transformers' Gemma4ForCausalLM from a checkpoint dir: eager attention, eval mode, every parameter in ``dtype``.

    A compressed-tensors checkpoint is loaded with ``CompressedTensorsConfig(dequantize=True)``: every
    packed weight is decompressed by compressed-tensors (to the scale dtype: bf16(q·s)) and then widened
    exactly to ``dtype``, so the model is the dense model of compressed-tensors' dequantized weights.
    (The other route, ``dequantize=False``, creates the scales in the load dtype and decompresses on
    the first forward as q·s in fp32, without the bf16 rounding: ~24% of the weights differ by one
    bf16 ulp from ``ct_decompressed_weights``.)
    """
    import warnings

    import torch
    from transformers import Gemma4ForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    torch_dtype = {"float32": torch.float32, "float64": torch.float64}[dtype]
    path = Path(checkpoint_dir)
    kwargs: dict[str, Any] = {}
    cfg = json.loads((path / "config.json").read_text())
    if cfg.get("quantization_config", {}).get("quant_method") == "compressed-tensors":
        from transformers import CompressedTensorsConfig

        kwargs["quantization_config"] = CompressedTensorsConfig(dequantize=True)
    with warnings.catch_warnings():
        # "You passed `quantization_config` ... already has a `quantization_config`": intended
        warnings.filterwarnings("ignore", message=".*quantization_config.*", category=UserWarning)
        model = Gemma4ForCausalLM.from_pretrained(
            path, attn_implementation="eager", dtype=torch_dtype, **kwargs
        )
    model.eval()
    bad = {n: p.dtype for n, p in model.named_parameters() if p.dtype != torch_dtype}
    if bad:
        raise RuntimeError(f"{path}: parameters not {dtype} after load: {sorted(bad.items())[:4]}")
    return model


def hf_logits(
    checkpoint_dir: str | Path, token_ids: Sequence[Sequence[int]] | np.ndarray, dtype: str = "float32"
) -> np.ndarray:
    """transformers' full logits [B, T, V] as float32 numpy (after the final softcap), unpadded same-length rows.

    ``dtype="float64"`` runs transformers in float64: a reference whose own rounding error is negligible,
    so the whole difference is the other implementation's.
    """
    import torch

    model = load_hf_model(checkpoint_dir, dtype)
    ids = _token_tensor(token_ids)
    with torch.inference_mode():
        out = model(input_ids=ids, use_cache=False)
    return out.logits.to(torch.float32).numpy()


def hf_greedy(
    checkpoint_dir: str | Path, prompt_ids: Sequence[int], max_new_tokens: int, dtype: str = "float32"
) -> tuple[list[int], np.ndarray]:
    """transformers' own cached greedy decode (``generate``) of one prompt.

    Returns (new tokens, logits [max_new_tokens, V] float32): row k holds the logits the k-th new token
    was chosen from (row 0 = the prefill's last position).
    """
    import torch

    model = load_hf_model(checkpoint_dir, dtype)
    ids = _token_tensor([list(prompt_ids)])
    with torch.inference_mode():
        out = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=max_new_tokens,
            min_new_tokens=max_new_tokens,
            do_sample=False,
            output_logits=True,
            return_dict_in_generate=True,
            pad_token_id=model.config.pad_token_id,
        )
    new = out.sequences[0, ids.shape[1] :].tolist()
    logits = torch.stack([step[0] for step in out.logits]).to(torch.float32).numpy()
    return new, logits


def w4a16_quantization_config():
    """compressed-tensors QuantizationConfig: symmetric int4, group 32, pack-quantized, all Linear but lm_head."""
    from compressed_tensors.quantization import QuantizationArgs, QuantizationConfig, QuantizationScheme

    weights = QuantizationArgs(
        num_bits=4, type="int", symmetric=True, strategy="group", group_size=W4A16_GROUP_SIZE
    )
    return QuantizationConfig(
        config_groups={"group_0": QuantizationScheme(targets=["Linear"], weights=weights)},
        ignore=list(W4A16_IGNORE),
        format="pack-quantized",
    )


def write_ct_w4a16_checkpoint(
    config: dict[str, Any] | str | Path, out_dir: str | Path, seed: int = 0
) -> Path:
    """A W4A16 checkpoint quantized and compressed by compressed-tensors, saved with ``save_pretrained``.

    Recipe: the ``build_hf_model`` weights cast to bf16 (so scales are bf16, as in the QAT exports) ->
    ``apply_quantization_config`` -> per-group min-max scales from ``calculate_qparams`` ->
    ``ModelCompressor.from_pretrained_model(model, "pack-quantized").compress_model`` ->
    ``save_pretrained`` -> ``ModelCompressor.update_config`` (writes ``quantization_config``).
    Every Linear except ``lm_head`` (tied to the bf16 embeddings) is quantized: q/k/v/o, the MLP and
    the three PLE projections. Norms, ``layer_scalar`` and both embeddings stay bf16.
    """
    import torch
    from compressed_tensors.compressors import ModelCompressor
    from compressed_tensors.quantization import QuantizationStatus, apply_quantization_config
    from compressed_tensors.quantization.utils import calculate_qparams

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model = build_hf_model(config, seed).to(torch.bfloat16)
    apply_quantization_config(model, w4a16_quantization_config(), show_progress=False)

    n_quantized = 0
    with torch.no_grad():
        for _, module in model.named_modules():
            scheme = getattr(module, "quantization_scheme", None)
            if scheme is None or scheme.weights is None:
                continue
            args = scheme.weights
            w = module.weight
            out_f, in_f = w.shape
            if in_f % args.group_size:
                raise ValueError(
                    f"input dim {in_f} of a quantized Linear is not a multiple of {args.group_size}"
                )
            groups = w.reshape(out_f, in_f // args.group_size, args.group_size)
            scale, zero_point = calculate_qparams(groups.amin(-1), groups.amax(-1), args)
            module.weight_scale.copy_(scale.to(module.weight_scale.dtype))
            if hasattr(module, "weight_zero_point"):
                module.weight_zero_point.copy_(zero_point.to(module.weight_zero_point.dtype))
            module.quantization_status = QuantizationStatus.FROZEN
            n_quantized += 1
    if n_quantized == 0:
        raise RuntimeError("compressed-tensors matched no Linear module")

    compressor = ModelCompressor.from_pretrained_model(model, quantization_format="pack-quantized")
    compressor.compress_model(model)
    model.save_pretrained(out)
    compressor.update_config(str(out))
    return out


def ct_decompressed_weights(checkpoint_dir: str | Path) -> dict[str, np.ndarray]:
    """compressed-tensors' decompression of every packed tensor: ``<module>.weight`` -> float32 [out, in].

    The values are exactly compressed-tensors' output (dtype of the scale, bf16 here), widened to
    float32 without rounding.
    """
    import torch
    from compressed_tensors.compressors import BaseCompressor
    from compressed_tensors.quantization import QuantizationConfig
    from compressed_tensors.utils.match import match_name
    from safetensors.torch import load_file

    path = Path(checkpoint_dir)
    qdict = json.loads((path / "config.json").read_text()).get("quantization_config")
    if not qdict:
        raise ValueError(f"{path / 'config.json'} has no quantization_config")
    qconfig = QuantizationConfig.model_validate(qdict)
    tensors: dict[str, torch.Tensor] = {}
    for f in sorted(path.glob("*.safetensors")):
        tensors.update(load_file(f))

    result: dict[str, np.ndarray] = {}
    for key in sorted(k for k in tensors if k.endswith(".weight_packed")):
        prefix = key.removesuffix(".weight_packed")
        scheme = next(
            (g for g in qconfig.config_groups.values() if any(match_name(prefix, t) for t in g.targets)),
            None,
        ) or next(iter(qconfig.config_groups.values()))
        fmt = scheme.format or qconfig.format
        compressor = BaseCompressor.get_value_from_registry(fmt)
        state = {
            name: tensors[f"{prefix}.{name}"]
            for name in ("weight_packed", "weight_scale", "weight_shape", "weight_zero_point", "weight_g_idx")
            if f"{prefix}.{name}" in tensors
        }
        dense = compressor.decompress(state, scheme)["weight"]
        result[f"{prefix}.weight"] = dense.to(torch.float32).numpy()
    return result


def unpack_w4a16_numpy(packed: np.ndarray, scale: np.ndarray, shape: Sequence[int]) -> np.ndarray:
    """Independent numpy unpacking (capacity-anchors D5): nibble i of word j is column 8j+i, stored q+8.

    ``packed`` int32 [out, ceil(in/8)]; ``scale`` [out, in/group] (any float dtype, e.g. ml_dtypes
    bfloat16). Returns q·scale rounded once to the scale dtype (what compressed-tensors computes).
    """
    out_f, in_f = (int(s) for s in shape)
    words = np.ascontiguousarray(packed).view(np.uint32)
    nibbles = (words[:, :, None] >> (4 * np.arange(8, dtype=np.uint32))) & np.uint32(0xF)
    q = nibbles.reshape(out_f, -1)[:, :in_f].astype(np.int32) - 8
    group = in_f // scale.shape[1]
    s = np.repeat(np.asarray(scale, dtype=np.float32), group, axis=1)
    return (q.astype(np.float32) * s).astype(scale.dtype)
