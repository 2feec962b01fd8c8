"""The replay's stored records (`tracetune.stored.Record`): the summary, the per-request lines, a span's
cores and the trace profile write what they always wrote, in the same order, and older rows read back."""

from __future__ import annotations

import json
import math

from tests.replay.test_metrics import rec
from tracetune.replay.machine import Share
from tracetune.replay.metrics import LAG_BOUND_S, Summary, parse_slos, summarize
from tracetune.replay.profile import profile_records
from tracetune.replay.trace import TraceRecord
from tracetune.replay.types import ReplayOptions, ReplayResult, RequestRecord

SUMMARY_KEYS = ["requests", "succeeded", "errors", "client_errors", "client_overloaded", "lag_bound_s",
                "connection_waits", "connection_limit", "error_rate", "duration_s", "stream_faults",
                "first_stream_fault", "request_throughput_rps", "output_throughput_tps", "latency_s",
                "schedule_lag_s", "slo_met", "engine", "error_examples"]


def test_a_summary_stores_its_keys_in_their_order_and_the_set_ones_after():
    records = [rec(i, 0.01 * (i + 1), 1.5, 10) for i in range(10)]
    plain = summarize(ReplayResult(records=records, duration_s=2.0, options=ReplayOptions()))
    assert list(plain.as_dict()) == SUMMARY_KEYS and plain.as_dict()["engine"] is None
    full = summarize(ReplayResult(records=records, duration_s=2.0, options=ReplayOptions()), parse_slos("ttft:p99<1s"))
    full.capacity, full.acceptance, full.cost, full.ended = {"steps": []}, {"forced": {}}, {"wall_s": 1.0}, "ended"
    assert list(full.as_dict()) == [*SUMMARY_KEYS, "goodput_rps", "slo_attainment", "capacity", "acceptance", "cost",
                                    "ended"]


def test_a_summary_keeps_the_records_stored_inside_it_as_they_were():
    capacity = {"capacity_scale": 1.5, "steps": [{"attainment": math.nan, "outcome": "pass", "slo_ratio": None}]}
    stored = Summary(capacity=capacity).as_dict()
    assert json.dumps(stored["capacity"]) == json.dumps(capacity)  # NaN stays NaN, not null
    assert json.dumps(Summary.from_dict(json.loads(json.dumps(stored))).capacity) == json.dumps(capacity)


def test_a_summary_stored_otherwise_reads_with_defaults():
    back = Summary.from_dict({"requests": "12", "errors": "many", "lag_bound_s": None, "engine": {"hits": None},
                              "latency_s": {"ttft": {"p50": {"value": 0.2}}, "e2e": 3}, "capacity": "none"})
    assert (back.requests, back.errors, back.lag_bound_s, back.capacity) == (12, 0, LAG_BOUND_S, None)
    assert back.engine is not None and math.isnan(back.engine["hits"])  # the key stays, as no number
    assert back.estimate("ttft", "p50").value == 0.2 and back.estimate("e2e", "p50") is None
    assert math.isnan(Summary.from_dict(None).duration_s)


def test_a_request_line_rounds_its_times_and_leaves_out_what_was_not_kept():
    record = RequestRecord(index=3, id=None, scheduled_s=0, send_s=1.23456789, lag_s=0.0, success=True, error="",
                           ttft_s=0.1, e2e_s=0.30000049, itl_s=[0.1, 0.1000004], prompt_tokens=4, output_tokens=3,
                           requested_tokens=3, finish_reason="length")
    line = record.to_json()
    assert line.startswith('{"index": 3, "id": null, "scheduled_s": 0, "send_s": 1.234568, ')
    stored = json.loads(line)
    assert stored["itl_s"] == [0.1, 0.1] and stored["tpot_s"] == 0.1 and list(stored)[-2:] == ["client_error", "tpot_s"]
    assert "text" not in stored and "draft_tokens" not in stored
    kept = json.loads(RequestRecord(index=0, text="", draft_tokens=0).to_json())
    assert (kept["text"], kept["draft_tokens"], kept["tpot_s"]) == ("", 0, None)  # kept empty, not left out


def test_an_older_request_line_reads_with_defaults_and_todays_count():
    back = RequestRecord.from_dict({"index": "7", "success": True, "ttft_s": 0.1, "e2e_s": 0.4, "itl_s": [0.1, 0.2],
                                    "output_tokens": None, "tpot_s": 9, "level": 2})
    assert (back.index, back.output_tokens, back.requested_tokens, back.text, back.error) == (7, 3, 0, None, "")


def test_a_share_stores_its_cores_to_a_thousandth():
    share = Share(seconds=10.0004, cpus=4, engine=1.23456, client=0.2, others=1 / 3, steal=0.0, idle=2.0)
    assert share.as_dict() == {"seconds": 10.0, "cpus": 4, "engine": 1.235, "client": 0.2, "others": 0.333,
                               "steal": 0.0, "idle": 2.0}


def test_a_trace_profile_stores_its_rates_and_series_as_lists():
    stored = profile_records([TraceRecord(timestamp=t, input_length=10, output_length=5) for t in (0.0, 1.0)]).as_dict()
    assert list(stored)[:4] == ["requests", "duration_s", "mean_rps", "rates"]
    assert [list(r) for r in stored["rates"]] == [["scale_s", "peak", "p90", "p50"]]
    assert isinstance(stored["over_time"], list)
