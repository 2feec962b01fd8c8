"""Timing maths and error handling of the streaming client, against an in-process aiohttp
server that plays back scripted SSE events, with a scripted clock."""

from __future__ import annotations

import asyncio
import json

import pytest
from aiohttp import web

from tracetune.engine_adapter.openai_client import new_session, stream_completion


def sse(*events, done=True) -> bytes:
    lines = [f"data: {json.dumps(e)}\n\n" for e in events]
    if done:
        lines.append("data: [DONE]\n\n")
    return "".join(lines).encode()


class ScriptedClock:
    def __init__(self, readings):
        self.readings = list(readings)

    def __call__(self):
        return self.readings.pop(0)


def run(handler, **kwargs):
    """Serve `handler` on a free local port and send one request to it."""
    async def go():
        app = web.Application()
        app.router.add_post("/v1/completions", handler)
        app.router.add_post("/v1/chat/completions", handler)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]
        try:
            async with new_session() as session:
                return await stream_completion(session, f"http://127.0.0.1:{port}", model="m", **kwargs)
        finally:
            await runner.cleanup()
    return asyncio.run(go())


def replay(body: bytes, status: int = 200, seen: list | None = None):
    async def handler(request):
        if seen is not None:
            seen.append((request.path, await request.json()))
        return web.Response(body=body, status=status, content_type="text/event-stream")
    return handler


COMPLETION = sse(
    {"choices": [{"text": "Hel"}]},
    {"choices": [{"text": "lo"}]},
    {"choices": [{"text": " world", "finish_reason": "length"}]},
    {"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 4}},
)


def test_timing_identity_e2e_minus_ttft_is_sum_of_itl():
    # send, 3 text events, usage event, end
    clock = ScriptedClock([100.0, 100.25, 100.30, 100.42, 100.43, 100.5])
    out = run(replay(COMPLETION), prompt="hi", max_tokens=4, clock=clock)
    assert out.success and out.text == "Hello world"
    assert out.ttft_s == pytest.approx(0.25)
    assert out.itl_s == pytest.approx([0.05, 0.12])
    assert out.e2e_s == pytest.approx(0.5)
    assert out.chunk_times_s[-1] - out.ttft_s == pytest.approx(sum(out.itl_s))
    # Token counts come from usage, not from counting events (3 events carried 4 tokens).
    assert (out.prompt_tokens, out.output_tokens, out.finish_reason) == (5, 4, "length")


def test_request_body_for_completions_and_chat():
    seen = []
    run(replay(COMPLETION, seen=seen), prompt="p", max_tokens=7, ignore_eos=True)
    path, body = seen[-1]
    assert path == "/v1/completions" and body["prompt"] == "p" and body["max_tokens"] == 7
    assert body["ignore_eos"] is True and body["stream"] is True and body["stream_options"] == {"include_usage": True}
    out = run(replay(sse({"choices": [{"delta": {"content": "ok"}}]}), seen=seen),
              messages=[{"role": "user", "content": "q"}])
    assert seen[-1][0] == "/v1/chat/completions" and out.text == "ok"


def test_http_error_is_data_not_an_exception():
    out = run(replay(b'{"error": "max_tokens too large"}', status=400), prompt="p")
    assert not out.success and "HTTP 400" in out.error and "max_tokens too large" in out.error


def test_connection_refused_is_data():
    async def go():
        async with new_session() as session:
            return await stream_completion(session, "http://127.0.0.1:9", model="m", prompt="p")
    out = asyncio.run(go())
    # Nobody listening is the server's side of the line, not a client-side failure.
    assert not out.success and "ConnectionRefused" in out.error and not out.client_error


def test_timeout_is_data():
    async def slow(request):
        await asyncio.sleep(5)
        return web.Response(body=COMPLETION)
    out = run(slow, prompt="p", timeout_s=0.2)
    assert not out.success and out.error == "timed out after 0.2s"


def test_exactly_one_of_prompt_or_messages():
    with pytest.raises(ValueError):
        run(replay(COMPLETION), prompt="a", messages=[])
