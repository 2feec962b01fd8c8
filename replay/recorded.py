"""What one recorded exchange becomes: the response summarized (usage, output text, SSE or JSON,
compressed bodies), and the native trace record built from the request and that summary (see
`replay.record` for the proxy that records them)."""

from __future__ import annotations

import dataclasses
import json
import math
import zlib
from collections.abc import Mapping
from typing import TYPE_CHECKING

from tracetune.engine_adapter.http_stream import sse_payloads

if TYPE_CHECKING:
    from tracetune.replay.trace import TraceRecord

# Recorded paths and the kind of request each carries.
RECORDED_PATHS = {"/v1/completions": "completion", "/v1/chat/completions": "chat"}
SAMPLING_FIELDS = ("temperature", "top_p", "top_k", "seed", "stop")


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile (0-100) with linear interpolation; NaN for no values."""
    if not values:
        return math.nan
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100
    lo = math.floor(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


@dataclasses.dataclass
class ResponseSummary:
    """What the proxy read from a response: usage, text of the first choice, text-carrying events,
    and whether the server reported an error inside a 200 response (e.g. an SSE error event)."""

    completion_tokens: int | None = None
    text: str = ""
    text_events: int = 0
    error: bool = False


def decoded(raw: bytes, content_encoding: str) -> bytes | None:
    """The body without its content coding, or None when it cannot be undone."""
    coding = content_encoding.strip().lower()
    if coding in ("", "identity"):
        return raw
    if coding in ("gzip", "x-gzip", "deflate"):
        try:
            return zlib.decompressobj(wbits=47).decompress(raw)  # 47: gzip or zlib header, detected
        except zlib.error:
            return None
    return None


def _choice_text(choice: Mapping[str, object], chat: bool, stream: bool) -> str | None:
    if chat:
        part = choice.get("delta" if stream else "message")
        content = part.get("content") if isinstance(part, dict) else None
    else:
        content = choice.get("text")
    return content if isinstance(content, str) else None


def summarize_response(raw: bytes, *, chat: bool, sse: bool) -> ResponseSummary:
    """Usage and first-choice text of an SSE stream or a JSON completion body."""
    out = ResponseSummary()
    parts: list[str] = []
    if sse:
        payloads, _ = sse_payloads(raw + b"\n\n")  # the stream's last event may lack its blank line
        events = []
        for data in payloads:
            if not data or data == b"[DONE]":
                continue
            try:
                events.append(json.loads(data))
            except ValueError:
                continue
    else:
        try:
            events = [json.loads(raw.decode("utf-8", errors="replace"))]
        except ValueError:
            events = []
    for event in events:
        if not isinstance(event, dict):
            continue
        if event.get("error"):
            out.error = True
        usage = event.get("usage")
        if isinstance(usage, dict) and isinstance(usage.get("completion_tokens"), int):
            out.completion_tokens = usage["completion_tokens"]
        for choice in event.get("choices") or ():
            if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                continue
            piece = _choice_text(choice, chat, sse)
            if piece:
                parts.append(piece)
                out.text_events += 1
    out.text = "".join(parts)
    return out


def _message(raw: object) -> dict[str, object] | None:
    """A chat message as the trace's `{role, content}`, or None when it holds more than text."""
    if not isinstance(raw, dict):
        return None
    content = raw.get("content")
    if isinstance(content, list):  # content parts: only text parts can be recorded
        if not all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str) for p in content):
            return None
        content = "".join(p["text"] for p in content)
    if not isinstance(content, str):
        return None
    return {"role": raw.get("role"), "content": content}


def _sampling(body: Mapping[str, object]) -> dict[str, object] | None:
    from pydantic import ValidationError

    from tracetune.replay.trace import Sampling

    fields: dict[str, object] = {}
    for name in SAMPLING_FIELDS:
        value = body.get(name)
        if value is None:
            continue
        if name == "stop" and isinstance(value, str):
            value = [value]
        try:  # one field at a time: a value the trace cannot hold drops only that field
            Sampling.model_validate({name: value})
        except ValidationError:
            continue
        fields[name] = value
    return fields or None


def build_record(kind: str, request_body: bytes, response: ResponseSummary, *,
                 record_response: bool = False) -> TraceRecord | None:
    """The trace record (timestamp 0, set when written) of one successful exchange; None when the
    request cannot be held by the native format."""
    from pydantic import ValidationError

    from tracetune.replay.trace import TraceRecord

    try:
        body = json.loads(request_body)
    except ValueError:
        return None
    if not isinstance(body, dict):
        return None
    fields: dict[str, object] = {"timestamp": 0.0}
    if kind == "chat":
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            return None
        converted = [_message(m) for m in messages]
        if any(m is None for m in converted):
            return None
        fields["messages"] = converted
    else:
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1:
            prompt = prompt[0]
        if not isinstance(prompt, str):  # token ids or several prompts
            return None
        fields["prompt"] = prompt

    n = body.get("n")
    n = n if isinstance(n, int) and n > 0 else 1
    max_tokens = body.get("max_completion_tokens") or body.get("max_tokens")
    if response.completion_tokens:
        output_length = math.ceil(response.completion_tokens / n)  # usage counts every choice
    elif isinstance(max_tokens, int) and max_tokens > 0:
        output_length = max_tokens
    else:
        output_length = response.text_events
    if output_length < 1:
        return None
    fields["output_length"] = output_length
    sampling = _sampling(body)
    if sampling:
        fields["sampling"] = sampling
    if record_response:
        fields["response"] = response.text
    try:
        return TraceRecord.model_validate(fields)
    except ValidationError:
        return None
