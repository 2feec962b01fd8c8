"""Timing maths and error handling of the streaming client, against an in-process aiohttp
server that plays back scripted SSE events, with a scripted clock; and what makes an answer a
success: an event stream of completion chunks, ended, with valid token counts and the forced
number of tokens (anything else is that request's failure, with its reason, never an exception)."""

from __future__ import annotations

import asyncio
import json

import pytest
from aiohttp import web

from tracetune.engine_adapter.openai_client import new_session, stream_completion, stream_fault


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


def replay(body: bytes, status: int = 200, seen: list | None = None, content_type: str = "text/event-stream"):
    async def handler(request):
        if seen is not None:
            seen.append((request.path, await request.json()))
        return web.Response(body=body, status=status, content_type=content_type)
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


TOKENS = [{"choices": [{"text": f"t{i}"}]} for i in range(3)]


def failed(body: bytes, **kwargs) -> str:
    """The reason a request answered with `body` failed (it must fail, and not as this machine's)."""
    out = run(replay(body, content_type=kwargs.pop("content_type", "text/event-stream")), prompt="p", **kwargs)
    assert not out.success and out.error and not out.client_error
    return out.error


def test_an_html_page_answered_with_200_is_not_a_stream():
    error = failed(b"<!doctype html><html><body>It works!</body></html>", content_type="text/html")
    assert error == "not an OpenAI stream: text/html (HTTP 200, body '<!doctype html><html><body>It works!</body></html>')"
    assert stream_fault(error)
    # JSON where a stream was asked for is no stream either.
    assert failed(b'{"choices": []}', content_type="application/json").startswith(
        "not an OpenAI stream: application/json")


def test_a_json_completion_counts_where_no_stream_was_asked_for():
    body = json.dumps({"choices": [{"message": {"content": "hi there"}, "finish_reason": "stop"}],
                       "usage": {"prompt_tokens": 3, "completion_tokens": 2}}).encode()
    out = run(replay(body, content_type="application/json"), messages=[{"role": "user", "content": "q"}],
              extra_body={"stream": False})
    assert out.success and out.text == "hi there" and (out.output_tokens, out.finish_reason) == (2, "stop")
    assert len(out.chunk_times_s) == 1  # its one answer is its first output


@pytest.mark.parametrize("events,done,forced,error", [
    (TOKENS, False, True, "truncated stream: 3 of 8 tokens (no finish reason, no [DONE])"),
    (TOKENS, True, True, "truncated stream: 3 of 8 tokens (no finish reason)"),
    (TOKENS + [{"choices": [], "usage": {"completion_tokens": 3}}], True, True,
     "truncated stream: 3 of 8 tokens (no finish reason)"),
    (TOKENS, False, False, "truncated stream: 3 tokens, then the end (no finish reason, no [DONE])"),
])
def test_a_stream_that_stops_short_without_a_finish_reason_is_truncated(events, done, forced, error):
    assert failed(sse(*events, done=done), max_tokens=8, ignore_eos=forced) == error


def test_a_finish_reason_or_done_ends_a_stream_that_was_not_forced():
    stop = {"choices": [{"text": "", "finish_reason": "stop"}], "usage": {"completion_tokens": 3}}
    for events, done, forced in ((TOKENS + [stop], False, True), (TOKENS, True, False)):
        out = run(replay(sse(*events, done=done)), prompt="p", max_tokens=8, ignore_eos=forced,
                  extra_body={"stop": ["\n\n"]} if forced else None)
        assert out.success and out.error == "", out.error  # a stop string ends a forced stream early


@pytest.mark.parametrize("value,error", [
    ('"2"', 'bad usage: completion_tokens "2" is not a whole number of tokens'),
    ("-100", "bad usage: completion_tokens -100 is outside 0..10,000,000"),
    ("1e400", "bad usage: completion_tokens Infinity is not a whole number of tokens"),
    ("NaN", "bad usage: completion_tokens NaN is not a whole number of tokens"),
    ("2.5", "bad usage: completion_tokens 2.5 is not a whole number of tokens"),
    ("true", "bad usage: completion_tokens true is not a whole number of tokens"),
    ("10000001", "bad usage: completion_tokens 10000001 is outside 0..10,000,000"),
])
def test_a_bad_token_count_is_that_requests_error(value, error):
    body = sse(*TOKENS) + b'data: {"choices": [], "usage": {"prompt_tokens": 2, "completion_tokens": %s}}\n\n' % (
        value.encode())
    assert failed(body) == error
    assert failed(body.replace(b'"completion_tokens": ' + value.encode(), b'"completion_tokens": 3').replace(
        b'"prompt_tokens": 2', b'"prompt_tokens": ' + value.encode())) == error.replace("completion_tokens", "prompt_tokens")


@pytest.mark.parametrize("payload,error", [
    (b'{"choices": [{"text": "t1"', "malformed SSE event (Expecting ',' delimiter): '{\"choices\": [{\"text\": \"t1\"'"),
    (b"[1, 2]", "malformed SSE event: not a JSON object: '[1, 2]'"),
    (b'{"choices": "t1"}', "malformed SSE event: 'choices' is not a list of objects"),
    (b'{"choices": [{"text": 7}]}', "malformed SSE event: a choice's text or finish reason is not a string"),
    (b'{"choices": [], "usage": [3]}', "malformed SSE event: 'usage' is not an object"),
    (b"\xff\xfe", "malformed SSE event ("),
])
def test_a_malformed_event_is_that_requests_error_with_its_reason(payload, error, caplog):
    body = b"data: " + b'{"choices": [{"text": "t0"}]}' + b"\n\ndata: " + payload + b"\n\ndata: [DONE]\n\n"
    for keep_text in (False, True):  # the JSON-free path reads no malformed event as output either
        with caplog.at_level("WARNING"):
            reason = failed(body, keep_text=keep_text)
        assert reason.startswith(error) and stream_fault(reason) and "closed" not in reason, reason
        assert not [r for r in caplog.records if r.name == "asyncio"]  # no event-loop traceback


def test_the_json_free_path_trusts_only_the_shape_of_a_common_event():
    """Its documented limit: an event shaped `{...}` with a string text and nothing else to read is
    taken as output unparsed (parsing a vLLM token event took about 6 us, reading it without
    parsing about 2 us); with the text kept, every event is parsed and this one fails."""
    body = b'data: {"choices": [{"text": "t0"}]}\n\ndata: {"choices": [{"text": "t1"}]}}\n\ndata: [DONE]\n\n'
    assert run(replay(body), prompt="p", keep_text=False).success
    assert failed(body, keep_text=True).startswith("malformed SSE event (Extra data): ")


def test_a_chat_delta_that_is_not_an_object_is_malformed():
    out = run(replay(sse({"choices": [{"delta": "hi"}]})), messages=[{"role": "user", "content": "q"}],
              keep_text=False)
    assert not out.success and out.error.startswith("malformed SSE event: a choice's text")


def test_an_error_event_is_the_servers_error_not_a_stream_fault():
    error = failed(sse({"choices": [{"text": "t0"}]}, {"error": {"message": "boom", "code": 500}}))
    assert error == "error event in the stream: boom" and not stream_fault(error)


# What vLLM's OpenAI server sends (vllm/entrypoints/openai: completion and chat serving), byte for
# byte in form: pydantic's compact JSON, unset fields left out, a token chunk's finish_reason null,
# a first chat chunk that only declares the role, the usage in a last chunk of no choices (asked by
# stream_options.include_usage), then [DONE]; an error mid-stream as {"error": {...}}.
VLLM_COMPLETION = (
    b'data: {"id":"cmpl-1","object":"text_completion","created":1,"model":"m","choices":[{"index":0,'
    b'"text":" the","logprobs":null,"finish_reason":null,"stop_reason":null}]}\n\n'
    b'data: {"id":"cmpl-1","object":"text_completion","created":1,"model":"m","choices":[{"index":0,'
    b'"text":" cat","logprobs":null,"finish_reason":null,"stop_reason":null}]}\n\n'
    b'data: {"id":"cmpl-1","object":"text_completion","created":1,"model":"m","choices":[{"index":0,'
    b'"text":" sat","logprobs":null,"finish_reason":"length","stop_reason":null}]}\n\n'
    b'data: {"id":"cmpl-1","object":"text_completion","created":1,"model":"m","choices":[],'
    b'"usage":{"prompt_tokens":5,"total_tokens":8,"completion_tokens":3}}\n\n'
    b"data: [DONE]\n\n")
VLLM_CHAT = (
    b'data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,'
    b'"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}\n\n'
    b'data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,'
    b'"delta":{"content":" the"},"logprobs":null,"finish_reason":null}]}\n\n'
    b'data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,'
    b'"delta":{"content":" cat"},"logprobs":null,"finish_reason":null}]}\n\n'
    b'data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,'
    b'"delta":{"content":" sat"},"logprobs":null,"finish_reason":"length","stop_reason":null}]}\n\n'
    b'data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[],'
    b'"usage":{"prompt_tokens":5,"total_tokens":8,"completion_tokens":3}}\n\n'
    b"data: [DONE]\n\n")


@pytest.mark.parametrize("keep_text", [False, True])
@pytest.mark.parametrize("body,ask", [(VLLM_COMPLETION, {"prompt": "p"}),
                                      (VLLM_CHAT, {"messages": [{"role": "user", "content": "q"}]})],
                         ids=["completion", "chat"])
def test_vllms_stream_counts_in_full(body, ask, keep_text):
    async def handler(request):  # with the charset, as uvicorn sends it
        return web.Response(body=body, headers={"Content-Type": "text/event-stream; charset=utf-8"})

    out = run(handler, max_tokens=3, ignore_eos=True, keep_text=keep_text, **ask)
    assert out.success and out.error == "", out.error
    assert (out.prompt_tokens, out.output_tokens, out.finish_reason) == (5, 3, "length")
    assert len(out.chunk_times_s) == 3  # the chat role chunk carries no output
    assert out.text == " the cat sat" or not keep_text


def test_vllms_error_event_fails_the_request_with_its_message():
    error = (b'data: {"error": {"message": "the engine died", "type": "InternalServerError", "param": null, '
             b'"code": 500}}\n\ndata: [DONE]\n\n')
    body = VLLM_COMPLETION.split(b"\n\n", 1)[0] + b"\n\n" + error
    assert failed(body, max_tokens=3, ignore_eos=True) == "error event in the stream: the engine died"
