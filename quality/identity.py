"""Which configurations share one quality measurement (`quality_key`), and which cannot differ from
the reference but by the platform's noise (`lossless_by_construction`), from their stored settings."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from tracetune.stored import Stored

# What a configuration's output quality depends on: the weights and their precision, the KV cache's
# precision, the attention kernels and the decoding path (speculation). Batching, caching and
# scheduling knobs change when a token is computed, not which one: configurations that differ only in
# those share one quality measurement (their differences are the platform's noise, which the floor
# measures); so does tensor parallelism (the same matmuls split across GPUs: another rounding order).
# Unknown engine arguments are counted in, to be safe.
QUALITY_SETTINGS = ("model", "dtype", "quantization", "kv_cache_dtype", "speculative", "attention_backend",
                    "load_format", "extra_args")


# Settings that cannot change the output distribution by construction: speculative decoding verifies
# every draft token against the target model, which keeps the target's distribution.
LOSSLESS_SETTINGS = ("speculative",)

# Another engine's configurations name it ("engine" in their stored settings) and the same ideas in
# its own settings. llama.cpp: the GGUF weights (format or file), the K and V cache types, flash
# attention, its draft (lossless) and unknown arguments; slots, context, batch sizes, cache reuse
# and threads are scheduling. Such a configuration never shares a quality, nor counts as lossless,
# with one of another engine: the engine is part of its identity (vLLM's keys are as before).
ENGINE_SETTINGS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "llamacpp": (("model", "weights", "gguf", "cache_type_k", "cache_type_v", "flash_attn", "draft_model",
                  "extra_args"), ("draft_model",)),
}
# Values that mean the engine's default, read as unset: vLLM's "auto", llama.cpp's f16 KV cache.
_DEFAULTS = {"vllm": ("auto",), "llamacpp": ("auto", "f16")}


def _quality_settings(config_json: Stored, lossless_too: bool = True) -> dict[str, object]:
    """The settings a configuration's quality depends on (without the lossless ones unless
    `lossless_too`), each as it takes effect: the model (and an explicit GGUF) named by its file
    name (as `config_key`), an engine default the same as unset, no speculation the same whatever
    its unused draft length."""
    engine = str(config_json.get("engine") or "vllm")
    settings, lossless = ENGINE_SETTINGS.get(engine, (QUALITY_SETTINGS, LOSSLESS_SETTINGS))
    names = [k for k in settings if lossless_too or k not in lossless]
    defaults = _DEFAULTS.get(engine, ("auto",))
    ident = {k: None if isinstance(v := config_json.get(k), str) and v in defaults else v for k in names}
    ident["model"] = Path(str(ident["model"] or "")).name
    if ident.get("gguf"):
        ident["gguf"] = Path(str(ident["gguf"])).name
    spec = ident.get("speculative")
    if isinstance(spec, dict) and spec.get("method", "none") == "none":
        ident["speculative"] = {"method": "none"}
    if engine != "vllm":
        ident["engine"] = engine
    return ident


def quality_key(config_json: Stored) -> str:
    """Identity of a configuration's quality."""
    ident = _quality_settings(config_json)
    return "quality:" + hashlib.sha256(json.dumps(ident, sort_keys=True, default=str).encode()).hexdigest()[:40]


def lossless_by_construction(config_json: Stored, reference_json: Stored) -> bool:
    """The configuration has the reference's engine, weights, precisions and kernels, and differs
    from it at most in batching, caching, scheduling and speculation: it must measure within the
    noise floor."""
    return _quality_settings(config_json, False) == _quality_settings(reference_json, False)
