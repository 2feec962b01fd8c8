"""Speculative decoding as a server reports it per request: llama-server's `timings` (`draft_n`
draft tokens proposed, `draft_n_accepted` accepted) read by the streaming client into each
request's completion and record, a malformed count failing its request like a bad usage does, and
a replay's summary taking the records' sums where the engine's /metrics counted no draft token."""

from __future__ import annotations

import asyncio
import json
import math

import pytest

from tests.engine_adapter.test_openai_client import failed, replay, run
from tests.replay.sse_server import SSEServer
from tracetune.cli.results import spec_text
from tracetune.engine_adapter.metrics import EngineMetrics
from tracetune.engine_adapter.openai_client import stream_fault
from tracetune.replay.metrics import summarize
from tracetune.replay.replayer import Replayer
from tracetune.replay.send import prepare
from tracetune.replay.trace import Trace, TraceRecord
from tracetune.replay.types import ReplayOptions, ReplayResult, RequestRecord

CHAT = [{"role": "user", "content": "hi"}]


def replayed(server: SSEServer, **fields) -> list[RequestRecord]:
    """The records of two requests replayed against `server`."""
    trace = Trace(source="t.jsonl", records=[TraceRecord(timestamp=t, output_length=4, **fields) for t in (0, 0)])
    options = ReplayOptions()

    async def go() -> list[RequestRecord]:
        await server.start()
        try:
            return (await Replayer(server.base_url, "m", options).run(prepare(trace, options)))[0]
        finally:
            await server.stop()

    return asyncio.run(go())


@pytest.mark.parametrize("ask", [{"prompt": "p"}, {"messages": CHAT}], ids=["completion", "chat"])
def test_timings_reach_the_record_and_its_json(ask):
    timings = {"prompt_n": 7, "predicted_n": 4, "draft_n": 6, "draft_n_accepted": 4}
    records = replayed(SSEServer(tokens=4, timings=timings), **ask)
    assert [(r.success, r.draft_tokens, r.accepted_tokens) for r in records] == [(True, 6, 4)] * 2
    stored = json.loads(records[0].to_json())
    assert (stored["draft_tokens"], stored["accepted_tokens"]) == (6, 4)
    back = RequestRecord.from_dict(stored)  # (times come back rounded to the microsecond)
    assert (back.draft_tokens, back.accepted_tokens) == (6, 4)


def test_a_server_that_reports_no_drafts_leaves_them_unknown_and_unwritten():
    """vLLM never reports them; llama-server without drafting writes `timings` with no draft_n."""
    for server in (SSEServer(tokens=4), SSEServer(tokens=4, timings={"prompt_n": 7, "predicted_n": 4})):
        record = replayed(server, prompt="p")[0]
        assert record.success and (record.draft_tokens, record.accepted_tokens) == (None, None)
        assert "draft_tokens" not in json.loads(record.to_json())
        back = RequestRecord.from_dict(json.loads(record.to_json()))
        assert (back.draft_tokens, back.accepted_tokens) == (None, None)


def per_token(compact: bool) -> bytes:
    """llama-server with `timings_per_token`: every event carries the request's running totals,
    the last of them on plain text events (here none on the finish or the usage event)."""
    totals = [{"predicted_n": 1}, {"predicted_n": 2, "draft_n": 4, "draft_n_accepted": 3},
              {"predicted_n": 3, "draft_n": 8, "draft_n_accepted": 5}]
    events = [{"choices": [{"text": f"t{i}", "finish_reason": None}], "timings": t} for i, t in enumerate(totals)]
    events += [{"choices": [{"text": "", "finish_reason": "length"}]},
               {"choices": [], "usage": {"prompt_tokens": 2, "completion_tokens": 3}}]
    separators = (",", ":") if compact else (", ", ": ")
    return b"".join(b"data: %s\n\n" % json.dumps(e, separators=separators).encode() for e in events) + \
        b"data: [DONE]\n\n"


@pytest.mark.parametrize("keep_text", [False, True])
@pytest.mark.parametrize("compact", [True, False], ids=["compact", "spaced"])
def test_timings_on_plain_events_are_read_and_the_last_totals_win(keep_text, compact):
    """Without the text kept, plain events skip the JSON parser: one carrying timings must not."""
    out = run(replay(per_token(compact)), prompt="p", max_tokens=3, keep_text=keep_text)
    assert out.success, out.error
    assert (out.draft_tokens, out.accepted_tokens, len(out.chunk_times_s)) == (8, 5, 3)


@pytest.mark.parametrize("timings,error", [
    ('{"draft_n": "6", "draft_n_accepted": 4}', 'bad timings: draft_n "6" is not a whole number of tokens'),
    ('{"draft_n": -1, "draft_n_accepted": 0}', "bad timings: draft_n -1 is outside 0..10,000,000"),
    ('{"draft_n": 2.5, "draft_n_accepted": 1}', "bad timings: draft_n 2.5 is not a whole number of tokens"),
    ('{"draft_n": 6, "draft_n_accepted": true}', "bad timings: draft_n_accepted true is not a whole number"),
    ("[6, 4]", "malformed SSE event: 'timings' is not an object"),
])
def test_a_malformed_draft_count_is_that_requests_error(timings, error):
    body = (b'data: {"choices": [{"text": "t0", "finish_reason": "length"}]}\n\n'
            b'data: {"choices": [], "usage": {"prompt_tokens": 2, "completion_tokens": 1}, "timings": %s}\n\n'
            b"data: [DONE]\n\n") % timings.encode()
    reason = failed(body)
    assert reason.startswith(error) and stream_fault(reason), reason


def drafted(i: int, draft: int | None, accepted: int | None) -> RequestRecord:
    return RequestRecord(index=i, id=None, scheduled_s=0.0, send_s=0.0, lag_s=0.0, success=True, error="",
                         ttft_s=0.1, e2e_s=0.5, itl_s=[0.1] * 3, prompt_tokens=5, output_tokens=4,
                         requested_tokens=4, finish_reason="length", draft_tokens=draft, accepted_tokens=accepted)


RECORDS = [drafted(0, 10, 6), drafted(1, 6, 4), drafted(2, None, None)]


def test_the_summary_takes_the_records_drafts_where_the_engine_counted_none():
    """llama-server's /metrics has no speculative counters: the answers' sums stand in, the number
    of drafts stays unknown, and what shows the counters shows the acceptance rate alone."""
    engine = EngineMetrics(prefix_cache_queries=100.0, prefix_cache_hits=40.0)
    summary = summarize(ReplayResult(records=RECORDS, duration_s=1.0, options=ReplayOptions(), engine_delta=engine))
    assert summary.engine is not None
    counters = EngineMetrics.from_dict(summary.engine)
    assert (counters.spec_decode_draft_tokens, counters.spec_decode_accepted_tokens) == (16.0, 10.0)
    assert counters.spec_decode_drafts == 0.0 and counters.prefix_cache_hits == 40.0
    assert summary.engine["spec_decode_acceptance_rate"] == pytest.approx(10 / 16)
    assert math.isnan(summary.engine["spec_decode_mean_accepted_length"])
    assert spec_text(summary.engine) == "62%"


def test_the_summary_keeps_the_engines_own_draft_counters():
    """vLLM (or a llama-server exporting them) counted the same tokens: never added twice."""
    engine = EngineMetrics(spec_decode_drafts=5.0, spec_decode_draft_tokens=20.0, spec_decode_accepted_tokens=12.0)
    summary = summarize(ReplayResult(records=RECORDS, duration_s=1.0, options=ReplayOptions(), engine_delta=engine))
    assert summary.engine == engine.as_dict()
    assert spec_text(summary.engine) == "60% x3.4"
    nothing = summarize(ReplayResult(records=RECORDS[2:], duration_s=1.0, options=ReplayOptions(),
                                     engine_delta=EngineMetrics()))
    assert nothing.engine is not None and nothing.engine["spec_decode_draft_tokens"] == 0.0
    assert spec_text(nothing.engine) == "-"
