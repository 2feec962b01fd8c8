"""Schedule and bookkeeping of the replay runner, against an in-process streaming server."""

from __future__ import annotations

import asyncio

import pytest

from tests.replay.sse_server import SSEServer
from tracetune.errors import InputError
from tracetune.replay.replayer import Replayer
from tracetune.replay.send import prepare
from tracetune.replay.trace import Trace, TraceRecord
from tracetune.replay.types import ReplayOptions


def trace(*timestamps, **fields):
    defaults = {"prompt": "p", "output_length": 4}
    defaults.update(fields)
    return Trace(source="t.jsonl", records=[TraceRecord(timestamp=t, **defaults) for t in timestamps])


def run(requests, options, server=None):
    server = server or SSEServer(tokens=10)

    async def go():
        await server.start()
        try:
            replayer = Replayer(server.base_url, "m", options)
            return await replayer.run(requests)
        finally:
            await server.stop()

    records, duration, warm_failed = asyncio.run(go())
    return records, duration, server


def test_prepare_scales_caps_and_passes_sampling():
    t = trace(0, 1, 2, 3, 4, sampling={"temperature": 0.5, "seed": 1})
    reqs = prepare(t, ReplayOptions(time_scale=0.5, max_requests=2, warmup_requests=1, max_output_tokens=3))
    assert [r.scheduled_s for r in reqs] == [0, 0.5, 1.0]  # 1 warm-up + 2 measured
    assert all(r.max_tokens == 3 for r in reqs)
    assert reqs[0].extra_body == {"temperature": 0.5, "seed": 1}
    assert [r.index for r in prepare(t, ReplayOptions(max_duration_s=2.5))] == [0, 1, 2]


def test_length_only_request_without_tokenizer_is_a_named_error():
    t = Trace(source="t.jsonl", records=[TraceRecord(timestamp=0, input_length=10, output_length=2)])
    with pytest.raises(InputError, match=r"t.jsonl:1: field 'input_length'"):
        prepare(t, ReplayOptions())


@pytest.mark.parametrize("bad", [{"time_scale": 0}, {"mode": "burst"}, {"concurrency": 0}, {"warmup_requests": -1}])
def test_bad_options(bad):
    with pytest.raises(InputError):
        ReplayOptions(**bad)


def test_open_loop_sends_on_schedule_and_skips_warmup_in_records():
    t = trace(0.0, 0.05, 0.10, 0.30, 0.31, 0.60)
    options = ReplayOptions(warmup_requests=1)
    records, duration, server = run(prepare(t, options), options)
    assert [r.index for r in records] == [1, 2, 3, 4, 5]
    # Scheduled times are relative to the first measured request.
    assert [r.scheduled_s for r in records] == pytest.approx([0.0, 0.05, 0.25, 0.26, 0.55])
    for r in records:
        assert r.success and r.output_tokens == 4 and 0 <= r.lag_s < 0.05
        assert r.send_s == pytest.approx(r.scheduled_s + r.lag_s)
    gaps = [b - a for a, b in zip(server.arrivals[1:], server.arrivals[2:])]
    assert gaps == pytest.approx([0.05, 0.20, 0.01, 0.29], abs=0.03)
    assert duration >= 0.55


def test_open_loop_does_not_wait_for_slow_responses():
    """Open loop: a slow engine must not delay later sends (the client is not closed-loop)."""
    server = SSEServer(tokens=5, gap_s=0.1)  # every response takes ~0.5 s
    t = trace(*[i * 0.05 for i in range(8)])
    records, _, server = run(prepare(t, ReplayOptions()), ReplayOptions(), server)
    # A closed loop would send each request ~0.5 s late; the bound leaves room for a test run sharing
    # 2 cores with 3 other test processes (70 ms measured so in CI, stop 52's rehearsal)
    assert max(r.lag_s for r in records) < 0.2
    assert server.peak >= 5


def test_closed_loop_caps_concurrency():
    server = SSEServer(tokens=3, gap_s=0.02)
    t = trace(*[0.0] * 10, output_length=3)  # the tokens it serves: fewer than forced is a failure
    options = ReplayOptions(mode="closed", concurrency=3)
    records, _, server = run(prepare(t, options), options, server)
    assert len(records) == 10 and all(r.success for r in records)
    assert server.peak == 3


def test_ignore_eos_and_chat_requests_are_sent_as_recorded():
    t = trace(0.0, messages=[{"role": "user", "content": "hi"}], prompt=None, output_length=2)
    records, _, server = run(prepare(t, ReplayOptions()), ReplayOptions())
    body = server.bodies[0]
    assert body["ignore_eos"] is True and body["max_tokens"] == 2 and body["messages"][0]["content"] == "hi"
    assert records[0].output_tokens == 2 and records[0].requested_tokens == 2


def test_failed_requests_are_records_not_exceptions():
    options = ReplayOptions(request_timeout_s=5)
    replayer = Replayer("http://127.0.0.1:9", "m", options)
    records, _, _ = asyncio.run(replayer.run(prepare(trace(0.0, 0.01), options)))
    assert len(records) == 2 and not any(r.success for r in records)
    assert all("ConnectionRefused" in r.error and not r.client_error for r in records)
