"""Typed view of an engine server's Prometheus `/metrics` (vLLM's `vllm:*` and llama-server's
`llamacpp:*` series).

Counters are read with prometheus_client's own text parser and summed over every label set
(one server can report several engines or model names). Differences between two snapshots give
what happened during one phase (e.g. one replay) without resetting the server.
"""

from __future__ import annotations

import dataclasses
import math

from prometheus_client.parser import text_string_to_metric_families

from tracetune.errors import EngineError
from tracetune.stored import Record

# Sample names as vLLM and llama-server export them. Several names are listed where vLLM renamed a
# metric between releases (the first one found wins); `_total` is part of the sample name of counters.
_COUNTERS: dict[str, tuple[str, ...]] = {
    "prefix_cache_queries": ("vllm:prefix_cache_queries_total", "vllm:gpu_prefix_cache_queries_total"),
    "prefix_cache_hits": ("vllm:prefix_cache_hits_total", "vllm:gpu_prefix_cache_hits_total"),
    "spec_decode_drafts": ("vllm:spec_decode_num_drafts_total", "llamacpp:spec_decode_num_drafts_total"),
    "spec_decode_draft_tokens": ("vllm:spec_decode_num_draft_tokens_total",
                                 "llamacpp:spec_decode_num_draft_tokens_total"),
    "spec_decode_accepted_tokens": ("vllm:spec_decode_num_accepted_tokens_total",
                                    "llamacpp:spec_decode_num_accepted_tokens_total"),
    "preemptions": ("vllm:num_preemptions_total",),
    "prompt_tokens": ("vllm:prompt_tokens_total",),
    "generation_tokens": ("vllm:generation_tokens_total", "llamacpp:tokens_predicted_total"),
    "requests_finished": ("vllm:request_success_total",),
}
_GAUGES: dict[str, tuple[str, ...]] = {
    "kv_cache_usage": ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc", "vllm:cpu_cache_usage_perc"),
    "requests_running": ("vllm:num_requests_running", "llamacpp:requests_processing"),
    "requests_waiting": ("vllm:num_requests_waiting", "llamacpp:requests_deferred"),
}
# Fields an engine exports in parts, summed, read when none of the field's own names is there.
# llama-server counts the prompt tokens it computed apart from those its slots' caches served
# (`prompt_tokens_total` excludes cached tokens), so every prompt token is the sum, and each is
# looked up in the cache: the sum is also the cache's queries, the cached part its hits.
_LLAMACPP_PROMPT = ("llamacpp:prompt_tokens_total", "llamacpp:prompt_tokens_cached_total")
_SUMS: dict[str, tuple[str, ...]] = {
    "prompt_tokens": _LLAMACPP_PROMPT,
    "prefix_cache_queries": _LLAMACPP_PROMPT,
    "prefix_cache_hits": ("llamacpp:prompt_tokens_cached_total",),
}


@dataclasses.dataclass(frozen=True)
class EngineMetrics(Record[dict[str, float]]):
    """One snapshot of the engine's counters (cumulative since start) and gauges (now).

    A counter the engine does not export (e.g. speculative counters with speculation off) is 0.
    `kv_cache_usage` is a fraction in [0, 1]. Stored with its rates (`derived`: read back, they
    are derived again); a counter an older or another engine's dump left out, or stored as no
    number, reads as 0.
    """

    prefix_cache_queries: float = 0.0
    prefix_cache_hits: float = 0.0
    spec_decode_drafts: float = 0.0
    spec_decode_draft_tokens: float = 0.0
    spec_decode_accepted_tokens: float = 0.0
    preemptions: float = 0.0
    prompt_tokens: float = 0.0
    generation_tokens: float = 0.0
    requests_finished: float = 0.0
    kv_cache_usage: float = 0.0
    requests_running: float = 0.0
    requests_waiting: float = 0.0

    @property
    def prefix_cache_hit_rate(self) -> float:
        """Hit tokens over queried tokens; NaN when nothing was queried."""
        if self.prefix_cache_queries <= 0:
            return math.nan
        return self.prefix_cache_hits / self.prefix_cache_queries

    @property
    def spec_decode_acceptance_rate(self) -> float:
        """Accepted over proposed draft tokens; NaN when nothing was proposed."""
        if self.spec_decode_draft_tokens <= 0:
            return math.nan
        return self.spec_decode_accepted_tokens / self.spec_decode_draft_tokens

    @property
    def spec_decode_mean_accepted_length(self) -> float:
        """Tokens one verification step yields: 1 (the target's own) + accepted draft tokens per
        draft, as vLLM's "mean acceptance length"; NaN when nothing was drafted."""
        if self.spec_decode_drafts <= 0:
            return math.nan
        return 1.0 + self.spec_decode_accepted_tokens / self.spec_decode_drafts

    def delta(self, earlier: EngineMetrics) -> EngineMetrics:
        """Counters minus `earlier`'s counters; gauges as in this (later) snapshot."""
        changes = {name: getattr(self, name) - getattr(earlier, name) for name in _COUNTERS}
        return dataclasses.replace(self, **changes)

    def derived(self) -> dict[str, float]:
        return {"prefix_cache_hit_rate": self.prefix_cache_hit_rate,
                "spec_decode_acceptance_rate": self.spec_decode_acceptance_rate,
                "spec_decode_mean_accepted_length": self.spec_decode_mean_accepted_length}


def parse_metrics(text: str) -> EngineMetrics:
    """Parse Prometheus exposition text from a vLLM or llama.cpp server into `EngineMetrics`."""
    sums: dict[str, float] = {}
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                sums[sample.name] = sums.get(sample.name, 0.0) + float(sample.value)
    except ValueError as exc:
        raise EngineError(f"The engine's /metrics output is not valid Prometheus text: {exc}") from exc

    values: dict[str, float] = {}
    for field, names in (_COUNTERS | _GAUGES).items():
        for name in names:
            if name in sums:
                values[field] = sums[name]
                break
    for field, parts in _SUMS.items():
        if field not in values and any(name in sums for name in parts):
            values[field] = sum(sums.get(name, 0.0) for name in parts)
    if "kv_cache_usage" in values and values["kv_cache_usage"] > 1.0:
        # Some releases export a percentage rather than a fraction.
        values["kv_cache_usage"] /= 100.0
    return EngineMetrics(**values)
