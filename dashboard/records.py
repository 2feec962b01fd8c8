"""A trial's request records, for the drill-down: latency CDFs, the request timeline, engine counters,
its speculation's acceptance probe."""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Iterable, Sequence

from tracetune.dashboard.trial import TrialView
from tracetune.replay.types import RequestRecord


# -- per-request data (drill-down) --------------------------------------------------------------
def request_records(trial: TrialView) -> list[RequestRecord]:
    """A trial's stored request records (parsed once per text: the detail page draws four charts from them)."""
    return _parsed(trial.requests_jsonl) if trial.requests_jsonl else []


@functools.lru_cache(maxsize=8)
def _parsed(text: str) -> list[RequestRecord]:
    return [RequestRecord.from_dict(json.loads(line)) for line in text.splitlines() if line.strip()]


# A CDF drawn with more points than this is thinned to evenly spaced ranks: 600 requests of 256
# tokens give 150,000 inter-token gaps, megabytes a browser must draw for a curve 400 pixels wide.
CDF_POINTS = 400


def cdf(values: Iterable[float | None], max_points: int = CDF_POINTS) -> tuple[list[float], list[float]]:
    """Empirical CDF: sorted values and the fraction of values <= each; beyond `max_points` values,
    only evenly spaced ranks (the first and the last, the tail, always among them)."""
    xs = sorted(v for v in values if v is not None and not math.isnan(v))
    n = len(xs)
    ranks = range(n) if n <= max_points else sorted({round(k * (n - 1) / (max_points - 1)) for k in range(max_points)})
    return [xs[i] for i in ranks], [(i + 1) / n for i in ranks]


def latency_cdfs(records: Sequence[RequestRecord]) -> dict[str, tuple[list[float], list[float]]]:
    """TTFT, ITL (pooled gaps) and E2E CDFs of the successful requests, in seconds."""
    ok = [r for r in records if r.success]
    return {
        "ttft": cdf(r.ttft_s for r in ok),
        "itl": cdf(g for r in ok for g in r.itl_s),
        "e2e": cdf(r.e2e_s for r in ok),
    }


def timeline(records: Sequence[RequestRecord]) -> list[RequestRecord]:
    """The requests in the order sent (send time since replay start): TTFT and E2E latency, success, error."""
    return sorted(records, key=lambda r: r.send_s)


def engine_counters(trial: TrialView) -> dict[str, float | None]:
    """The engine's own counters over the measured phase, with the rates people look at: the
    prefix-cache hit rate, and where anything was drafted, speculation's acceptance rate (accepted
    over draft tokens) and mean accepted length (1 + accepted tokens per draft)."""
    from tracetune.dashboard.metrics import speculation

    engine = trial.counters
    acceptance, length = speculation(engine)
    if engine is None:
        return dict.fromkeys(_COUNTERS, None)
    rate = engine.prefix_cache_hit_rate
    return {
        "prefix_cache_hit_rate": None if math.isnan(rate) else rate,
        "prefix_cache_hits": engine.prefix_cache_hits, "prefix_cache_queries": engine.prefix_cache_queries,
        "spec_decode_acceptance_rate": acceptance, "spec_decode_mean_accepted_length": length,
        "spec_decode_drafts": engine.spec_decode_drafts,
        "spec_decode_accepted_tokens": engine.spec_decode_accepted_tokens,
        "spec_decode_draft_tokens": engine.spec_decode_draft_tokens,
        "preemptions": engine.preemptions,
        "prompt_tokens": engine.prompt_tokens, "generation_tokens": engine.generation_tokens,
    }


_COUNTERS = ("prefix_cache_hit_rate", "prefix_cache_hits", "prefix_cache_queries", "spec_decode_acceptance_rate",
             "spec_decode_mean_accepted_length", "spec_decode_drafts", "spec_decode_accepted_tokens",
             "spec_decode_draft_tokens", "preemptions", "prompt_tokens", "generation_tokens")


def acceptance_figures(trial: TrialView) -> dict[str, float | int | None] | None:
    """The acceptance probe's figures (`replay.acceptance`; None without one): draft acceptance with
    natural stops beside forced to the recorded lengths (as the replay sends them), the draft tokens
    each rests on, the share of accepted draft tokens past the model's natural end, and how many probe
    prompts were recorded text, synthesized, and ended by the model early. A rate with nothing drafted
    is None."""
    acceptance = trial.acceptance
    if acceptance is None:
        return None

    def rate(value: float) -> float | None:
        return None if math.isnan(value) else value

    return {
        "natural_rate": rate(acceptance.natural.rate), "forced_rate": rate(acceptance.forced.rate),
        "natural_accepted": acceptance.natural.accepted, "natural_drafted": acceptance.natural.drafted,
        "forced_accepted": acceptance.forced.accepted, "forced_drafted": acceptance.forced.drafted,
        "past_end_share": rate(acceptance.past_end_share),
        "prompts": acceptance.prompts, "recorded": acceptance.recorded, "synthesized": acceptance.synthesized,
        "ended": acceptance.ended,
    }
