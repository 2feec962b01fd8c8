"""Streaming client for OpenAI-compatible completion endpoints, with per-token timing.

Every engine adapter serves the OpenAI API, so this one client measures all of them, for the
engine check, the replay harness and the quality probes alike. It runs on `http_stream`, a small
HTTP/1.1 client made for this, because at high request rates a general HTTP library's own overhead
shows up as latency (measured: benchmarks/harness_ceiling.py). Per event only what the metrics
need is read: whether it carries output text, and, on the few events that carry them, the finish
reason and the token usage; the JSON is parsed in full only for those, or when the caller wants the
text. Timing uses a monotonic clock (`time.perf_counter()` unless a scripted clock is given); a
failed request is returned as data (`success=False, error=...`, and `client_error=True` when this
machine, not the server, failed it), never raised, so a replay of thousands of requests survives a
few bad ones.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from collections.abc import Callable
from typing import Any

from tracetune.engine_adapter.http_stream import ClientSideError, ProtocolError, ServerClosed, Session


@dataclasses.dataclass
class StreamedCompletion:
    """What one streamed request did, as seen by the client.

    `chunk_times_s` holds the arrival time of every SSE event that carried output text, relative to
    `send_time_s` (a clock reading). One event may carry several tokens (speculative decoding):
    token counts come from the server's `usage`, never from counting events.
    """

    success: bool = False
    error: str = ""
    send_time_s: float = 0.0
    chunk_times_s: list[float] = dataclasses.field(default_factory=list)
    end_time_s: float = 0.0
    text: str = ""
    prompt_tokens: int | None = None
    output_tokens: int | None = None
    finish_reason: str | None = None
    client_error: bool = False  # failed by this machine (file descriptors, ports), not by the server

    @property
    def ttft_s(self) -> float | None:
        return self.chunk_times_s[0] if self.chunk_times_s else None

    @property
    def e2e_s(self) -> float:
        return self.end_time_s

    @property
    def itl_s(self) -> list[float]:
        """Gaps between consecutive output events (inter-token latency)."""
        t = self.chunk_times_s
        return [b - a for a, b in zip(t, t[1:])]


_COMPLETION_PATH, _CHAT_PATH = "/v1/completions", "/v1/chat/completions"


def new_session(limit: int = 0, timeout_s: float | None = None) -> Session:
    """Keep-alive connections for a replay: `limit` connections at most (0: as many as this
    process's file-descriptor limit allows, raised to its hard limit); `timeout_s` is kept for
    callers that give every request the same timeout."""
    return Session(limit=limit, timeout_s=timeout_s)


def request_body(
    *, model: str, prompt: str | None, messages: list[dict[str, Any]] | None, max_tokens: int,
    ignore_eos: bool, temperature: float, extra_body: dict[str, Any] | None,
) -> tuple[str, dict[str, Any]]:
    """The URL path and JSON body of one streaming request."""
    if (prompt is None) == (messages is None):
        raise ValueError("give exactly one of prompt or messages")
    body: dict[str, Any] = {
        "model": model,
        "max_tokens": max_tokens,
        "temperature": temperature,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if ignore_eos:
        body["ignore_eos"] = True
    if messages is not None:
        body["messages"] = messages
    else:
        body["prompt"] = prompt
    body.update(extra_body or {})
    return (_CHAT_PATH if messages is not None else _COMPLETION_PATH), body


_QUOTE, _SPACE = ord('"'), ord(" ")


class EventReader:
    """Reads one streamed completion's SSE payloads into a `StreamedCompletion`.

    The common event (a piece of text, no finish reason, no usage) is read without parsing its
    JSON: the first bytes of its text say whether it carries output. Events with a finish reason or
    usage, any event in an unexpected shape, and every event when the text is wanted are parsed in
    full. Called with the events of one network read at a time.
    """

    def __init__(self, out: StreamedCompletion, *, chat: bool, t0: float, clock: Callable[[], float],
                 keep_text: bool, on_text: Callable[[str], None] | None,
                 on_first_output: Callable[[], None] | None) -> None:
        self.out, self.chat, self.t0, self.clock = out, chat, t0, clock
        self.key = b'"content":' if chat else b'"text":'
        self.parse_all = keep_text or on_text is not None
        self.on_text, self.on_first_output = on_text, on_first_output
        self.parts: list[str] = []

    def __call__(self, payloads: list[bytes]) -> None:
        clock, t0, key = self.clock, self.t0, self.key
        for payload in payloads:
            if payload == b"[DONE]":
                continue
            now = clock() - t0
            plain = None if self.parse_all else self._plain_text(payload, key)
            if plain is None:
                self._parse(payload, now)
            elif plain:
                self._output(now)

    @staticmethod
    def _plain_text(payload: bytes, key: bytes) -> bool | None:
        """For an event with no usage and no finish reason whose text is a string or null: whether
        it carries output. None for any other event (it is parsed in full)."""
        if b'"usage":{' in payload or b'"usage": {' in payload:
            return None
        fin = payload.find(b'"finish_reason":')
        if fin >= 0 and not (payload.startswith(b"null", fin + 16) or payload.startswith(b" null", fin + 16)):
            return None
        at = payload.find(key)
        if at < 0:
            return None
        at += len(key)
        if payload[at] == _SPACE:
            at += 1
        if payload[at] == _QUOTE:
            return payload[at + 1] != _QUOTE
        return False if payload.startswith(b"null", at) else None

    def _output(self, now: float) -> None:
        if not self.out.chunk_times_s and self.on_first_output:
            self.on_first_output()
        self.out.chunk_times_s.append(now)

    def _parse(self, payload: bytes, now: float) -> None:
        event = json.loads(payload)
        usage = event.get("usage")
        if usage:
            self.out.prompt_tokens = usage.get("prompt_tokens")
            self.out.output_tokens = usage.get("completion_tokens")
        for choice in event.get("choices") or ():
            piece = (choice.get("delta") or {}).get("content") if self.chat else choice.get("text")
            if piece:
                self.parts.append(piece)
                self._output(now)
                if self.on_text:
                    self.on_text(piece)
            if choice.get("finish_reason"):
                self.out.finish_reason = choice["finish_reason"]


async def stream_completion(
    session: Session,
    base_url: str,
    *,
    model: str,
    prompt: str | None = None,
    messages: list[dict[str, Any]] | None = None,
    max_tokens: int = 64,
    ignore_eos: bool = False,
    temperature: float = 0.0,
    extra_body: dict[str, Any] | None = None,
    timeout_s: float | None = None,
    headers: dict[str, str] | None = None,
    clock: Callable[[], float] = time.perf_counter,
    on_text: Callable[[str], None] | None = None,
    keep_text: bool = True,
    on_first_output: Callable[[], None] | None = None,
    body: bytes | None = None,
) -> StreamedCompletion:
    """Send one streaming request to `/v1/completions` (prompt) or `/v1/chat/completions`.

    `keep_text=False` skips collecting the text (a replay needs only timings and counts);
    `on_first_output` is called when the first output text arrives; `body`, if given, is the
    request already encoded by `encoded_request` (a replay encodes before its clock starts)."""
    path = _CHAT_PATH if messages is not None else _COMPLETION_PATH
    if body is None:
        body = encoded_request(model=model, prompt=prompt, messages=messages, max_tokens=max_tokens,
                               ignore_eos=ignore_eos, temperature=temperature, extra_body=extra_body)
    out = StreamedCompletion()
    t0 = clock()
    out.send_time_s = t0
    reader = EventReader(out, chat=messages is not None, t0=t0, clock=clock, keep_text=keep_text,
                         on_text=on_text, on_first_output=on_first_output)
    timeout_s = timeout_s if timeout_s is not None else session.timeout_s
    try:
        async with asyncio.timeout(timeout_s):
            exchange = await session.stream(base_url, path, body, reader, headers)
        if exchange.status != 200:
            out.error = f"HTTP {exchange.status}: {bytes(exchange.error_body).decode('utf-8', errors='replace')[:500]}"
        else:
            out.success = True
    except TimeoutError:
        out.error = f"timed out after {timeout_s}s"
    except ClientSideError as exc:
        out.error, out.client_error = str(exc), True
    except (ServerClosed, ProtocolError, json.JSONDecodeError, OSError) as exc:
        out.error = f"{type(exc).__name__}: {exc}"
    out.end_time_s = clock() - t0
    out.text = "".join(reader.parts)
    return out


def encoded_request(*, model: str, prompt: str | None, messages: list[dict[str, Any]] | None, max_tokens: int,
                    ignore_eos: bool, temperature: float, extra_body: dict[str, Any] | None) -> bytes:
    """The JSON body `stream_completion` would send, encoded once ahead of time."""
    return json.dumps(request_body(model=model, prompt=prompt, messages=messages, max_tokens=max_tokens,
                                   ignore_eos=ignore_eos, temperature=temperature, extra_body=extra_body)[1]).encode()
