"""Informed first trials (tuner.presets): what the space offers, what the trace shows, room left."""

from __future__ import annotations

from tracetune.replay.trace import TraceRecord
from tracetune.search_spaces.space import SearchSpace
from tracetune.tuner.presets import copy_rate, presets

FULL = {"name": "s", "parameters": {"weight_bits": {"choices": [16, 8, 4]}, "kv_cache_dtype": {"choices": ["auto", "fp8"]},
                                    "speculative": {"choices": ["none", "ngram"]}, "max_num_seqs": {"choices": [4, 8]}}}


def space(**drop) -> SearchSpace:
    return SearchSpace.model_validate(FULL).without(drop)


def rec(prompt: str, response: str | None) -> TraceRecord:
    return TraceRecord(timestamp=0, prompt=prompt, output_length=8, response=response)


COPYING = [rec("def add(a, b): return a + b  # fix the bug in this function please", "def add(a, b): return a + b")]
FREE = [rec("Tell me a story about a dragon.", "Once upon a time there lived a kind old wizard")]


def test_eight_bit_weights_with_an_eight_bit_kv_cache_where_the_platform_runs_both():
    """Only the preset's knobs change; the rest sit nearest vLLM's defaults (the largest batch limit
    offered, no speculation), not at random."""
    assert presets(space(), FREE) == [{"weight_bits": 8, "kv_cache_dtype": "fp8", "max_num_seqs": 8,
                                       "speculative": "none"}]
    # a platform without an fp8 KV cache (its choice removed from the space): 8-bit weights alone
    assert presets(space(kv_cache_dtype=["fp8"]), FREE)[0]["weight_bits"] == 8
    assert presets(space(kv_cache_dtype=["fp8"]), FREE)[0]["kv_cache_dtype"] == "auto"
    assert presets(space(weight_bits=[8]), FREE) == []


def test_the_default_space_presets_keep_vllms_defaults_elsewhere():
    from tracetune.search_spaces.space import DEFAULT_SPACE, load_space

    (preset,) = presets(load_space(DEFAULT_SPACE), FREE)
    assert preset == {"weight_bits": 8, "kv_cache_dtype": "fp8", "max_num_seqs": 64, "enable_chunked_prefill": True,
                      "max_num_batched_tokens": 4096, "speculative": "none", "enable_prefix_caching": True}


def test_ngram_speculation_only_when_recorded_outputs_copy_their_prompts():
    assert copy_rate(COPYING) == 1.0 and copy_rate(FREE) == 0.0
    assert copy_rate([rec("no response recorded here at all", None)]) is None
    def ngram(found):
        return [p for p in found if p.get("speculative") == "ngram"]

    assert ngram(presets(space(), COPYING)) == [{"weight_bits": 16, "kv_cache_dtype": "auto", "max_num_seqs": 8,
                                                "speculative": "ngram"}]
    assert not ngram(presets(space(), FREE))
    assert not ngram(presets(space(), [rec("a b c d e", None)]))  # no evidence


def test_a_space_over_both_engines_presets_vllm_8_bit_and_llamacpp_q8_0():
    from tracetune.engine_adapter.registry import engine_kind
    from tracetune.search_spaces.space import CPU_SPACE, load_space

    vllm_8bit, llama_q8 = presets(load_space(CPU_SPACE, engine_kind("vllm+llamacpp")), FREE)
    assert vllm_8bit == {"engine": "vllm", "weight_bits": 8, "max_num_seqs": 32, "enable_prefix_caching": True}
    # llama-server's defaults for the rest the space offers: a sampled quantized V cache with flash
    # attention off made the preset one that cannot run, a sampled single thread left a core idle
    # (the quickstart's studies, 2026-12-04)
    assert llama_q8 == {"engine": "llamacpp", "weight_format": "Q8_0", "parallel_slots": 16, "kv_cache_type": "f16",
                        "batch_size": 2048, "ubatch_size": 512, "cache_reuse": 0, "flash_attn": "on",
                        "threads": 2}
