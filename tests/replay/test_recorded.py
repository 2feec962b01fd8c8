"""What the recording proxy writes for one request (replay/recorded.py): the response's summary, the
trace record built from the request, and the summary's percentiles."""

from __future__ import annotations

import json

import pytest

from tracetune.replay.recorded import ResponseSummary, build_record, percentile, summarize_response

CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]


def test_summarize_stream_and_json():
    stream = (b'data: {"choices":[{"index":0,"text":"a"}]}\n\n'
              b'data: {"choices":[{"index":1,"text":"X"}]}\n\n'
              b'data: {"choices":[{"index":0,"text":"b"}]}\r\n\r\n'
              b'data: {"choices":[],"usage":{"completion_tokens":7}}\n\ndata: [DONE]\n\n')
    s = summarize_response(stream, chat=False, sse=True)
    assert (s.completion_tokens, s.text, s.text_events) == (7, "ab", 2)
    chat = b'data: {"choices":[{"delta":{"role":"assistant"}}]}\n\ndata: {"choices":[{"delta":{"content":"hi"}}]}\n\n'
    s = summarize_response(chat, chat=True, sse=True)
    assert (s.completion_tokens, s.text, s.text_events) == (None, "hi", 1)
    body = json.dumps({"choices": [{"message": {"role": "assistant", "content": "yo"}}],
                       "usage": {"completion_tokens": 2}}).encode()
    s = summarize_response(body, chat=True, sse=False)
    assert (s.completion_tokens, s.text, s.error) == (2, "yo", False)
    # vLLM reports some failures as an error event inside a 200 stream.
    s = summarize_response(b'data: {"error": {"message": "boom", "code": 500}}\n\ndata: [DONE]\n\n', chat=False, sse=True)
    assert s.error


def body(**fields) -> bytes:
    return json.dumps(fields).encode()


def test_output_length_prefers_usage_then_max_tokens_then_events():
    usage = ResponseSummary(completion_tokens=9, text="x", text_events=3)
    no_usage = ResponseSummary(text="x", text_events=3)
    assert build_record("completion", body(prompt="p", max_tokens=20), usage).output_length == 9
    assert build_record("completion", body(prompt="p", max_tokens=20, n=2), usage).output_length == 5
    assert build_record("completion", body(prompt="p", max_tokens=20), no_usage).output_length == 20
    assert build_record("chat", body(messages=CHAT, max_completion_tokens=11), no_usage).output_length == 11
    assert build_record("completion", body(prompt="p"), no_usage).output_length == 3
    assert build_record("completion", body(prompt="p"), ResponseSummary()) is None


def test_what_the_trace_cannot_hold_is_not_recorded():
    ok = ResponseSummary(completion_tokens=1)
    assert build_record("completion", body(prompt=[1, 2, 3]), ok) is None  # token ids
    assert build_record("completion", body(prompt=["a", "b"]), ok) is None  # several prompts
    assert build_record("completion", body(prompt=["a"]), ok).prompt == "a"
    image = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]
    assert build_record("chat", body(messages=image), ok) is None
    parts = [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]
    assert build_record("chat", body(messages=parts), ok).messages[0].content == "ab"
    assert build_record("chat", b"not json", ok) is None
    # A sampling value the trace cannot hold drops only that field.
    record = build_record("completion", body(prompt="p", top_p=0, temperature=0.5), ok)
    assert record.sampling.model_dump(exclude_none=True) == {"temperature": 0.5}


def test_percentile():
    assert percentile([3, 1, 2], 50) == 2
    assert percentile([0, 10], 99) == pytest.approx(9.9)
    assert percentile([], 50) != percentile([], 50)  # NaN
