"""Timing maths of the streaming client, with a scripted clock and an in-process transport."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from engine_adapter.openai_client import stream_completion


def sse(*events, done=True) -> bytes:
    lines = [f"data: {json.dumps(e)}\n\n" for e in events]
    if done:
        lines.append("data: [DONE]\n\n")
    return "".join(lines).encode()


class ScriptedClock:
    """Returns the given readings in order, one per call."""

    def __init__(self, readings):
        self.readings = list(readings)

    def __call__(self):
        return self.readings.pop(0)


def run(transport, **kwargs):
    async def go():
        async with httpx.AsyncClient(transport=transport) as client:
            return await stream_completion(client, "http://engine", model="m", **kwargs)
    return asyncio.run(go())


def completion_events():
    return (
        {"choices": [{"text": "Hel"}]},
        {"choices": [{"text": "lo"}]},
        {"choices": [{"text": " world", "finish_reason": "length"}]},
        {"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 4}},
    )


def test_timing_identity_e2e_minus_ttft_is_sum_of_itl():
    transport = httpx.MockTransport(lambda request: httpx.Response(200, content=sse(*completion_events())))
    # send, 3 text events, usage event, end
    clock = ScriptedClock([100.0, 100.25, 100.30, 100.42, 100.43, 100.5])
    out = run(transport, prompt="hi", max_tokens=4, clock=clock)
    assert out.success and out.text == "Hello world"
    assert out.ttft_s == pytest.approx(0.25)
    assert out.itl_s == pytest.approx([0.05, 0.12])
    assert out.e2e_s == pytest.approx(0.5)
    assert out.chunk_times_s[-1] - out.ttft_s == pytest.approx(sum(out.itl_s))
    # Token counts come from usage, not from counting events (3 events carried 4 tokens).
    assert (out.prompt_tokens, out.output_tokens, out.finish_reason) == (5, 4, "length")


def test_request_body_for_completions_and_chat():
    seen = []

    def handler(request):
        seen.append((request.url.path, json.loads(request.content)))
        return httpx.Response(200, content=sse(*completion_events()))

    run(httpx.MockTransport(handler), prompt="p", max_tokens=7, ignore_eos=True)
    path, body = seen[-1]
    assert path == "/v1/completions" and body["prompt"] == "p" and body["max_tokens"] == 7
    assert body["ignore_eos"] is True and body["stream"] is True and body["stream_options"] == {"include_usage": True}

    def chat_handler(request):
        seen.append((request.url.path, json.loads(request.content)))
        return httpx.Response(200, content=sse({"choices": [{"delta": {"content": "ok"}}]}))

    out = run(httpx.MockTransport(chat_handler), messages=[{"role": "user", "content": "q"}])
    assert seen[-1][0] == "/v1/chat/completions" and out.text == "ok"


def test_http_error_is_data_not_an_exception():
    transport = httpx.MockTransport(lambda request: httpx.Response(400, text='{"error": "max_tokens too large"}'))
    out = run(transport, prompt="p")
    assert not out.success and "HTTP 400" in out.error and "max_tokens too large" in out.error


def test_connection_error_is_data():
    def handler(request):
        raise httpx.ConnectError("refused")

    out = run(httpx.MockTransport(handler), prompt="p")
    assert not out.success and "ConnectError" in out.error


def test_exactly_one_of_prompt_or_messages():
    with pytest.raises(ValueError):
        run(httpx.MockTransport(lambda r: httpx.Response(200)), prompt="a", messages=[])
