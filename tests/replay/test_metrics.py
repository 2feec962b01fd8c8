"""Summary maths on hand-made records (no network)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tracetune.engine_adapter.metrics import EngineMetrics
from tracetune.errors import InputError
from tracetune.replay.metrics import SLO, bootstrap_ci, parse_slos, summarize
from tracetune.replay.types import ReplayOptions, ReplayResult, RequestRecord


def rec(i, ttft, e2e, out, itl=None, ok=True, lag=0.0):
    return RequestRecord(index=i, id=None, scheduled_s=float(i), send_s=float(i) + lag, lag_s=lag, success=ok,
                         error="" if ok else "HTTP 500: boom", ttft_s=ttft if ok else None, e2e_s=e2e,
                         itl_s=itl if itl is not None else [(e2e - ttft) / max(out - 1, 1)] * max(out - 1, 0),
                         prompt_tokens=10, output_tokens=out if ok else None, requested_tokens=out,
                         finish_reason="length")


def test_parse_slos():
    assert parse_slos("ttft:p99<500ms, tpot:p50<50ms,e2e:mean<2s") == [
        SLO("ttft", "p99", 0.5), SLO("tpot", "p50", 0.05), SLO("e2e", "mean", 2.0)]
    assert parse_slos(None) == [] and parse_slos("") == []


@pytest.mark.parametrize("bad", ["ttft<500ms", "ttft:p99<500", "latency:p50<1s", "ttft:p100<1s", "ttft:p99>5ms"])
def test_bad_slos_name_the_flag(bad):
    with pytest.raises(InputError, match="--slo"):
        parse_slos(bad)


@pytest.mark.parametrize(("bad", "says"), [
    ("ttft:p99<0s", "the threshold in 'ttft:p99<0s' must be above 0"),
    ("tpot:mean<0.0ms", "the threshold in 'tpot:mean<0.0ms' must be above 0"),
    ("ttft:p99<1s,ttft:p99<2s", "ttft:p99 is bound twice ('ttft:p99<1s' and 'ttft:p99<2s'); keep one"),
    ("e2e:p90<1s, e2e:p90.0<3s", "e2e:p90.0 is bound twice ('e2e:p90<1s' and 'e2e:p90.0<3s')"),
])
def test_a_zero_threshold_or_a_statistic_bound_twice_is_refused(bad, says):
    with pytest.raises(InputError) as info:
        parse_slos(bad)
    assert str(info.value).startswith(f"--slo: {says}"), info.value


def test_one_metric_may_bound_several_statistics():
    assert parse_slos("ttft:p50<1s,ttft:p99<2s,ttft:mean<1s") == [
        SLO("ttft", "p50", 1.0), SLO("ttft", "p99", 2.0), SLO("ttft", "mean", 1.0)]


def test_tpot_definition():
    r = rec(0, ttft=0.1, e2e=1.0, out=10)
    assert r.tpot_s == pytest.approx(0.1)
    assert rec(0, 0.1, 0.1, 1).tpot_s is None


def test_summary_values_throughput_goodput_errors():
    records = [rec(i, ttft=0.1 * (i + 1), e2e=1.0 + 0.1 * i, out=11) for i in range(9)]
    records.append(rec(9, 0.0, 0.3, 11, ok=False))
    result = ReplayResult(records=records, duration_s=10.0, options=ReplayOptions(),
                          engine_delta=EngineMetrics(prefix_cache_queries=100, prefix_cache_hits=25))
    s = summarize(result, parse_slos("ttft:p50<450ms"))
    assert (s.requests, s.succeeded, s.errors, s.error_rate) == (10, 9, 1, 0.1)
    assert s.latency["ttft"]["p50"].value == pytest.approx(0.5)
    assert s.latency["ttft"]["mean"].value == pytest.approx(0.5)
    assert s.request_throughput_rps.value == pytest.approx(0.9)
    assert s.output_throughput_tps.value == pytest.approx(9 * 11 / 10.0)
    # Requests with TTFT 0.1..0.4 meet the per-request threshold: 4 of 10.
    assert s.goodput_rps.value == pytest.approx(0.4) and s.slo_attainment == pytest.approx(0.4)
    assert s.slo_met == {"ttft:p50<450ms": False}
    assert s.engine["prefix_cache_hit_rate"] == 0.25
    assert s.error_examples == ["HTTP 500: boom"]
    for est in (s.latency["ttft"]["p50"], s.request_throughput_rps, s.goodput_rps):
        assert est.low <= est.value <= est.high


def test_itl_is_pooled_over_requests():
    records = [rec(0, 0.1, 0.4, 4, itl=[0.1, 0.1, 0.1]), rec(1, 0.1, 1.0, 2, itl=[0.9])]
    s = summarize(ReplayResult(records=records, duration_s=2.0, options=ReplayOptions()))
    assert s.latency["itl"]["mean"].value == pytest.approx(0.3)
    assert s.latency["itl"]["p50"].value == pytest.approx(0.1)


def test_bootstrap_interval_narrows_with_more_data():
    rng = np.random.default_rng(1)
    small = bootstrap_ci(rng.exponential(1.0, 30), "p50")
    large = bootstrap_ci(rng.exponential(1.0, 3000), "p50")
    assert small.low <= small.value <= small.high
    assert (large.high - large.low) < (small.high - small.low)
    assert math.isnan(bootstrap_ci([], "mean").value)


def test_large_samples_get_the_large_sample_interval_close_to_the_bootstrap():
    """Past BOOTSTRAP_MAX_VALUES the interval is the order-statistic one (percentiles) or the normal
    one (mean): it covers the true value and is as wide as the bootstrap's, in a fraction of the time."""
    from tracetune.replay.metrics import BOOTSTRAP_MAX_VALUES, bootstrap_ci, large_sample_ci

    rng = np.random.default_rng(1)
    data = rng.exponential(1.0, size=BOOTSTRAP_MAX_VALUES + 1000)
    truth = {"p50": np.log(2), "p99": np.log(100), "mean": 1.0}
    for stat, true in truth.items():
        low, high = large_sample_ci(data, stat)
        assert low <= true <= high
        est = bootstrap_ci(data, stat)
        assert (est.low, est.high) == (min(low, est.value), max(high, est.value))
        from scipy import stats
        boot = stats.bootstrap((data,), lambda x, axis, stat=stat: np.percentile(x, float(stat[1:]), axis=axis)
                               if stat != "mean" else x.mean(axis=axis), n_resamples=300, method="percentile",
                               vectorized=True, random_state=np.random.default_rng(0)).confidence_interval
        assert (high - low) == pytest.approx(boot.high - boot.low, rel=0.35)


def test_an_slo_on_a_percentile_outside_the_usual_ones_is_summarized_and_read_as_a_constraint():
    """p95 is not one of STATS: the summary holds it anyway, so the constraint is its value, not a violation."""
    from tracetune.tuner.objectives import constraint_values

    records = [rec(i, 0.01 * (i + 1), 1.5, 10) for i in range(100)]
    slos = parse_slos("ttft:p95<500ms")
    s = summarize(ReplayResult(records=records, duration_s=2.0, options=ReplayOptions()), slos)
    assert s.latency["ttft"]["p95"].value == pytest.approx(0.9505, abs=0.01)
    assert constraint_values(s, None, slos, None) == [pytest.approx(s.latency["ttft"]["p95"].value - 0.5)]


def _summary(slos=()):
    records = [rec(i, 0.01 * (i + 1), 1.5, 10) for i in range(40)] + [rec(40, 0.1, 1.0, 5, ok=False)]
    return summarize(ReplayResult(records=records, duration_s=2.0, options=ReplayOptions(),
                                  engine_delta=EngineMetrics(prefix_cache_queries=10, prefix_cache_hits=4)), slos)


def test_a_summary_reads_back_what_it_stored():
    """`Summary.from_dict` is `as_dict`'s inverse: the stored JSON is the same after a round trip."""
    import json

    from tracetune.replay.metrics import Summary

    for slos in ((), parse_slos("ttft:p95<500ms,tpot:p50<50ms")):
        stored = json.loads(json.dumps(_summary(slos).as_dict()))
        back = Summary.from_dict(stored)
        assert json.loads(json.dumps(back.as_dict())) == stored
        assert back.latency["ttft"]["p50"].value == stored["latency_s"]["ttft"]["p50"]["value"]
        assert (back.goodput_rps is None) == (not slos)


def test_a_summary_of_an_older_tracetune_reads_with_defaults():
    """Fields an older study did not store (client errors, stream faults, connection limits, goodput,
    a statistic its SLO did not name) take their defaults; nothing raises."""
    from tracetune.replay.metrics import LAG_BOUND_S, Summary

    old = {"requests": 10, "succeeded": 9, "errors": 1, "error_rate": 0.1, "duration_s": 5.0,
           "request_throughput_rps": {"value": 2.0, "ci_low": 1.5, "ci_high": 2.5},
           "output_throughput_tps": {"value": 20.0, "ci_low": 15.0, "ci_high": 25.0},
           "latency_s": {"ttft": {"p50": {"value": 0.1, "ci_low": 0.09, "ci_high": 0.11}}},
           "schedule_lag_s": {"p99": 0.001}, "slo_met": {}, "engine": None, "error_examples": ["HTTP 500"]}
    s = Summary.from_dict(old)
    assert (s.requests, s.errors, s.client_errors, s.stream_faults, s.connection_limit) == (10, 1, 0, 0, 0)
    assert s.lag_bound_s == LAG_BOUND_S and not s.client_overloaded and s.first_stream_fault == ""
    assert s.goodput_rps is None and s.slo_attainment is None and s.capacity is None
    assert s.estimate("ttft", "p50").value == 0.1 and s.estimate("ttft", "p99") is None
    assert s.estimate("e2e", "p50") is None
    assert s.request_throughput_rps.high == 2.5


def test_engine_counters_read_back_what_they_stored():
    stored = EngineMetrics(prefix_cache_queries=10, prefix_cache_hits=4, spec_decode_drafts=2,
                           spec_decode_draft_tokens=6, spec_decode_accepted_tokens=3).as_dict()
    back = EngineMetrics.from_dict(stored)
    assert back.as_dict() == pytest.approx(stored, nan_ok=True)
    assert back.prefix_cache_hit_rate == 0.4 and back.spec_decode_mean_accepted_length == 2.5
    # an older dump without the speculative counters, and a value that is not a number
    old = EngineMetrics.from_dict({"prefix_cache_queries": 8, "prefix_cache_hits": "x", "unknown": 1})
    assert old.prefix_cache_queries == 8 and old.prefix_cache_hits == 0 and old.spec_decode_drafts == 0
    assert EngineMetrics.from_dict(None) == EngineMetrics()
