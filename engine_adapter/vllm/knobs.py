"""vLLM's search-space knobs: the parameter names a search space may search or fix for vLLM, and
what each sets. `weight_bits` is realised per platform by `translate.py`; `speculative` and its
companions fill `SpeculativeConfig`; the rest are `VLLMConfig` fields of the same name."""

from __future__ import annotations

from tracetune.engine_adapter.kind import Knob, Knobs

WEIGHT_BITS = (16, 8, 4)

KNOBS: Knobs = {
    "weight_bits": Knob("weight quantization bits (16 = unquantized)", values=WEIGHT_BITS),
    "max_num_seqs": Knob("max sequences per batch"),
    "max_num_batched_tokens": Knob("max tokens per scheduler step"),
    "kv_cache_dtype": Knob("KV-cache precision (auto, fp8, ...)"),
    "speculative": Knob("speculative decoding method (none, ngram, draft_model)"),
    "num_speculative_tokens": Knob("draft length"),
    "draft_model": Knob("draft model directory, or derived:layers-N (speculative=draft_model)"),
    "prompt_lookup_max": Knob("ngram: longest n-gram matched"),
    "enable_prefix_caching": Knob("prefix caching on/off"),
    "enable_chunked_prefill": Knob("chunked prefill on/off"),
    "enforce_eager": Knob("eager (no compilation/graphs) vs compiled"),
    "dtype": Knob("activation/weight dtype"),
    "gpu_memory_utilization": Knob("fraction of device memory"),
    "kv_cache_space_gib": Knob("explicit KV-cache size"),
    "max_model_len": Knob("context length"),
    "attention_backend": Knob("GPU attention backend"),
    "tensor_parallel_size": Knob("GPUs one replica spans (capacity is compared per GPU)"),
}
