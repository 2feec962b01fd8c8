"""Informed first trials (tuner.presets): what the space offers, what the trace shows, room left."""

from __future__ import annotations

from replay.trace import TraceRecord
from search_spaces.space import SearchSpace
from tuner.presets import copy_rate, presets

FULL = {"name": "s", "parameters": {"weight_bits": {"choices": [16, 8, 4]}, "kv_cache_dtype": {"choices": ["auto", "fp8"]},
                                    "speculative": {"choices": ["none", "ngram"]}, "max_num_seqs": {"choices": [4, 8]}}}


def space(**drop) -> SearchSpace:
    return SearchSpace.model_validate(FULL).without(drop)


def rec(prompt: str, response: str | None) -> TraceRecord:
    return TraceRecord(timestamp=0, prompt=prompt, output_length=8, response=response)


COPYING = [rec("def add(a, b): return a + b  # fix the bug in this function please", "def add(a, b): return a + b")]
FREE = [rec("Tell me a story about a dragon.", "Once upon a time there lived a kind old wizard")]


def test_eight_bit_weights_with_an_eight_bit_kv_cache_where_the_platform_runs_both():
    assert presets(space(), FREE) == [{"weight_bits": 8, "kv_cache_dtype": "fp8"}]
    # a platform without an fp8 KV cache (its choice removed from the space): 8-bit weights alone
    assert presets(space(kv_cache_dtype=["fp8"]), FREE) == [{"weight_bits": 8}]
    assert presets(space(weight_bits=[8]), FREE) == []


def test_ngram_speculation_only_when_recorded_outputs_copy_their_prompts():
    assert copy_rate(COPYING) == 1.0 and copy_rate(FREE) == 0.0
    assert copy_rate([rec("no response recorded here at all", None)]) is None
    assert {"speculative": "ngram"} in presets(space(), COPYING)
    assert {"speculative": "ngram"} not in presets(space(), FREE)
    assert {"speculative": "ngram"} not in presets(space(), [rec("a b c d e", None)])  # no evidence
