"""Streaming client for OpenAI-compatible completion endpoints, with per-token timing.

Every engine adapter serves the OpenAI API, so this one client measures all of them, for the
engine check, the replay harness and the quality probes alike. It runs on `http_stream`, a small
HTTP/1.1 client made for this, because at high request rates a general HTTP library's own overhead
shows up as latency (measured: benchmarks/harness_ceiling.py). Per event only what the metrics
need is read: whether it carries output text, and, on the few events that carry them, the finish
reason, the token usage and llama-server's `timings` (its speculative decoding's draft and accepted
tokens); the JSON is parsed in full only for those, or when the caller wants the text. Timing uses
a monotonic clock (`time.perf_counter()` unless a scripted clock is given); a failed request is
returned as data (`success=False, error=...`, and `client_error=True` when this machine, not the
server, failed it), never raised, so a replay of thousands of requests survives a few bad ones.

A request succeeds only on an answer that is what it claims to be: HTTP 200, an event stream
(text/event-stream; a JSON body only where the request asked for no stream) whose events are JSON
objects of a completion's shape, ended by a finish reason or `[DONE]` with no event after it, with
valid token counts in its `usage` (and in llama-server's `timings`) that agree with what arrived,
and, when `ignore_eos` forced `max_tokens` tokens, that many tokens or a finish reason saying why
not (a stop sequence the request gave): `EventReader.verdict` and `counted_tokens` hold the rules.
Anything else is that request's failure, its reason starting with one of STREAM_FAULTS ("not an
OpenAI stream: text/html ...", "truncated stream: 3 of 8 tokens ...") or, for an engine that
stopped at its own length limit short of the forced tokens, "short answer". The events the fast
path reads without parsing are those shaped as an engine's common event (a JSON object `{...}`
whose first choice's text is a string or null, no usage, no timings, no finish reason); every
other event is parsed and checked in full.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TypedDict

from tracetune.engine_adapter.http_stream import (
    BadStream,
    ClientSideError,
    Exchange,
    ProtocolError,
    ServerClosed,
    Session,
    shown,
)

# One chat message as a trace holds it ({"role": ..., "content": ...}; content may be a list of parts).
ChatMessage = Mapping[str, object]

# A token count above this in a `usage` is not one (no model has a context of ten million tokens).
MAX_TOKEN_COUNT = 10_000_000
# How the reason of a request failed by an answer that is not a well-formed OpenAI stream begins.
STREAM_FAULTS = ("not an OpenAI stream", "malformed SSE event", "SSE line too long", "SSE event too long",
                 "bad usage", "bad timings", "truncated stream", "too many tokens", "event after [DONE]",
                 "ProtocolError")


def stream_fault(error: str) -> bool:
    """Whether a request's `error` says its answer was not a well-formed OpenAI stream."""
    return error.startswith(STREAM_FAULTS)


def token_count(usage: Mapping[str, object], key: str, what: str = "usage") -> int | None:
    """`usage[key]` as a token count (None when absent); `BadStream` ("bad {what}: ...") when it is
    not a whole number from 0 to MAX_TOKEN_COUNT (a string, a fraction, a negative, an overflow such
    as 1e400). `what` names the object read: "usage", or "timings" for llama-server's counters."""
    value = usage.get(key)
    if value is None:
        return None
    if type(value) is not int:  # noqa: E721 (bool is an int subclass and no token count)
        raise BadStream(f"bad {what}: {key} {json.dumps(value)[:40]} is not a whole number of tokens")
    if not 0 <= value <= MAX_TOKEN_COUNT:
        raise BadStream(f"bad {what}: {key} {value} is outside 0..{MAX_TOKEN_COUNT:,}")
    return value


def counted_tokens(reported: int | None, text_events: int, limit: int | None = None) -> tuple[int, str]:
    """The output tokens of one answer, and why that count cannot stand ('' when it can).

    The count is the server's `reported` usage.completion_tokens; without one (a server that
    ignores `stream_options.include_usage`, or sends `usage: null`), the `text_events` received:
    the events whose choices carried output text, before [DONE]. That is exact for an engine that
    sends a token an event (llama-server; vLLM unless it batches its stream) and a lower bound
    otherwise (speculative decoding and stream batching put several tokens in one event; a token
    may decode to no text). So a report below the events received is false (every such event
    carried at least one token), a report above them is not, and a count above `limit` (the
    request's max_tokens times the choices it asked for) is false whichever it is."""
    tokens = text_events if reported is None else reported
    if tokens < text_events:
        return tokens, f"bad usage: completion_tokens {reported}, but {text_events} events carried output text"
    if limit is not None and tokens > limit:
        what = "usage completion_tokens" if reported is not None else "events that carried text, no usage"
        return tokens, f"too many tokens: {tokens} ({what}) for max_tokens {limit}"
    return tokens, ""


@dataclasses.dataclass
class Asked:
    """What one request asked for, as far as judging its answer needs: `max_tokens`, whether
    `ignore_eos` forced them, and its JSON `body`, parsed only where a rule needs more of it (a
    stop sequence, the number of choices), which a correct answer never does."""

    body: bytes
    max_tokens: int
    forced: bool
    _fields: dict[str, object] | None = dataclasses.field(default=None, repr=False)

    def fields(self) -> dict[str, object]:
        if self._fields is None:
            try:
                fields = json.loads(self.body)
            except ValueError:
                fields = None
            self._fields = fields if isinstance(fields, dict) else {}
        return self._fields

    def limit(self) -> int | None:
        """The most output tokens the request allows over all its choices (None: no limit given)."""
        fields = self.fields()
        cap = fields.get("max_completion_tokens") or fields.get("max_tokens")
        n = fields.get("n")
        choices = n if type(n) is int and n > 1 else 1  # noqa: E721 (bool is no count)
        return cap * choices if type(cap) is int else None  # noqa: E721

    def stops(self) -> bool:
        """Whether the request gave stop sequences or stop tokens (a "stop" before the forced
        tokens is then the engine honouring them, not ignoring `ignore_eos`)."""
        fields = self.fields()
        return bool(fields.get("stop") or fields.get("stop_token_ids"))


class StreamRequest(TypedDict, total=False):
    """What a caller asks of one streamed completion: `stream_completion`'s keywords (an engine
    fills in `model` and its headers when they are not given)."""

    model: str
    prompt: str | None
    messages: Sequence[ChatMessage] | None
    max_tokens: int
    ignore_eos: bool
    temperature: float
    extra_body: Mapping[str, object] | None
    timeout_s: float | None
    headers: dict[str, str] | None
    clock: Callable[[], float]
    on_text: Callable[[str], None] | None
    keep_text: bool
    on_first_output: Callable[[], None] | None
    body: bytes | None


@dataclasses.dataclass
class StreamedCompletion:
    """What one streamed request did, as seen by the client.

    `chunk_times_s` holds the arrival time of every SSE event that carried output text (in a
    choice, before [DONE]), relative to `send_time_s` (a clock reading): the first is the TTFT.
    One event may carry several tokens (speculative decoding): `output_tokens` is the server's
    `usage`, checked against the events received, and the events' count only where the server
    sent no usage (`counted_tokens`). `draft_tokens` and `accepted_tokens` are the speculative
    decoding's draft tokens proposed and accepted for this
    request, as llama-server reports them (`timings.draft_n`, `timings.draft_n_accepted`); None
    where the server did not report them (vLLM never does; llama-server only when it drafted).
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
    draft_tokens: int | None = None
    accepted_tokens: int | None = None

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
    *, model: str, prompt: str | None, messages: Sequence[ChatMessage] | None, max_tokens: int,
    ignore_eos: bool, temperature: float, extra_body: Mapping[str, object] | None,
) -> tuple[str, dict[str, object]]:
    """The URL path and JSON body of one streaming request."""
    if (prompt is None) == (messages is None):
        raise ValueError("give exactly one of prompt or messages")
    body: dict[str, object] = {
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
_DELTA = (b'"delta":{', b'"delta": {')


class EventReader:
    """Reads one streamed completion's SSE payloads into a `StreamedCompletion`.

    The common event (a piece of text, no finish reason, no usage, no timings) is read without
    parsing its JSON: the first bytes of its text say whether it carries output. Events with a
    finish reason, usage or timings, any event in an unexpected shape, and every event when the
    text is wanted are parsed in full. Called with the events of one network read at a time; an
    event after [DONE] is a `BadStream`. `verdict` judges the whole answer once it has ended.
    """

    def __init__(self, out: StreamedCompletion, *, chat: bool, t0: float, clock: Callable[[], float],
                 keep_text: bool, on_text: Callable[[str], None] | None,
                 on_first_output: Callable[[], None] | None) -> None:
        self.out, self.chat, self.t0, self.clock = out, chat, t0, clock
        self.key = b'"content":' if chat else b'"text":'
        self.parse_all = keep_text or on_text is not None
        self.on_text, self.on_first_output = on_text, on_first_output
        self.parts: list[str] = []
        self.ended = False  # [DONE] arrived
        self.server_error = ""  # an error event's message
        self.choice_events = 0  # events that held at least one choice (with text or not)
        self.whole = False  # answered in one JSON body, not streamed

    def __call__(self, payloads: list[bytes]) -> None:
        clock, t0, key = self.clock, self.t0, self.key
        for payload in payloads:
            if self.ended:  # the stream said it was over
                if payload != b"[DONE]":
                    self._parse(payload, 0.0)  # (a malformed event is named as such first)
                raise BadStream(f"event after [DONE]: {shown(payload)}")
            if payload == b"[DONE]":
                self.ended = True
                continue
            now = clock() - t0
            plain = None if self.parse_all or not (payload.startswith(b"{") and payload.endswith(b"}")) \
                else self._plain_text(payload, key, self.chat)
            if plain is None:
                self._parse(payload, now)
                continue
            self.choice_events += 1
            if plain:
                self._output(now)

    @staticmethod
    def _plain_text(payload: bytes, key: bytes, chat: bool) -> bool | None:
        """For an event with no usage, no timings and no finish reason whose first choice's text is
        a string or null: whether it carries output. None for any other event (it is parsed in
        full). llama-server puts its `timings` on the last event, or with `timings_per_token` on
        every one (a text quoting a key cannot match: its quotes are escaped). The text key counts
        only inside the first choice: between the opening of the choices and the key, no object or
        list may close and none may open but a chat choice's `delta` (a text outside the choices,
        as in `{"choices": [], "text": "x"}`, is no output)."""
        # (bytes.find, not `in`: about 0.1 us quicker a test on these payloads, measured)
        if payload.find(b'"usage":{') >= 0 or payload.find(b'"usage": {') >= 0 or payload.find(b'"timings":') >= 0:
            return None
        fin = payload.find(b'"finish_reason":')
        if fin >= 0 and not (payload.startswith(b"null", fin + 16) or payload.startswith(b" null", fin + 16)):
            return None
        start = payload.find(b'"choices":[{')
        if start >= 0:
            start += 12
        elif (start := payload.find(b'"choices": [{')) >= 0:
            start += 13
        else:
            return None
        at = payload.find(key, start)
        if at < 0:
            return None
        if payload.find(b"]", start, at) >= 0:
            return None  # the list of choices closed before the key
        if chat:  # the key must be the delta's: the one object opened since the choice, never closed
            opened = payload.rfind(b"{", start, at) + 1
            if not opened or payload.find(b"}", start, at) >= 0 or not payload.endswith(_DELTA, start, opened) \
                    or payload.find(b"{", start, opened - 1) >= 0:
                return None
        elif payload.find(b"{", start, at) >= 0:
            return None  # the key is in an object inside the choice, not the choice's own
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

    def _parse(self, payload: bytes, now: float, message: str = "delta") -> None:
        """Read one event (or, `message="message"`, a whole completion answered without streaming)
        in full; `BadStream` when it is not a JSON object of a completion chunk's shape."""
        what = "malformed SSE event" if message == "delta" else "not an OpenAI stream: JSON body"
        try:
            event = json.loads(payload)
        except ValueError as exc:  # invalid JSON or UTF-8
            raise BadStream(f"{what} ({getattr(exc, 'msg', exc)}): {shown(payload)}") from None
        if not isinstance(event, dict):
            raise BadStream(f"{what}: not a JSON object: {shown(payload)}")
        if event.get("error"):
            error = event["error"]
            self.server_error = str(error.get("message", error) if isinstance(error, dict) else error)[:300]
        choices, usage = event.get("choices") or [], event.get("usage")
        if not isinstance(choices, list) or not all(isinstance(c, dict) for c in choices):
            raise BadStream(f"{what}: 'choices' is not a list of objects: {shown(payload)}")
        if choices:
            self.choice_events += 1
        if usage is not None and not isinstance(usage, dict):
            raise BadStream(f"{what}: 'usage' is not an object: {shown(payload)}")
        if usage:
            self.out.prompt_tokens = token_count(usage, "prompt_tokens")
            self.out.output_tokens = token_count(usage, "completion_tokens")
        if event.get("timings") is not None:
            self._timings(event["timings"], what, payload)
        for choice in choices:
            part = (choice.get(message) or {}) if self.chat else choice
            piece = part.get("content" if self.chat else "text") if isinstance(part, dict) else part
            reason = choice.get("finish_reason")
            if not isinstance(part, dict) or not isinstance(piece, str | None) or not isinstance(reason, str | None):
                raise BadStream(f"{what}: a choice's text or finish reason is not a string: {shown(payload)}")
            if piece:
                self.parts.append(piece)
                self._output(now)
                if self.on_text:
                    self.on_text(piece)
            if reason:
                self.out.finish_reason = reason

    def _timings(self, timings: object, what: str, payload: bytes) -> None:
        """Read llama-server's speculative counters from an event's `timings`: `draft_n` draft tokens
        proposed, `draft_n_accepted` of them accepted (it writes both only once it has drafted).
        They are the request's running totals (llama.cpp's slot counts them from the request's
        start, `server_slot::get_timings`), so the last event that carries them holds the whole
        request's; a key absent leaves what an earlier event said."""
        if not isinstance(timings, dict):
            raise BadStream(f"{what}: 'timings' is not an object: {shown(payload)}")
        drafted = token_count(timings, "draft_n", "timings")
        accepted = token_count(timings, "draft_n_accepted", "timings")
        if drafted is not None:
            self.out.draft_tokens = drafted
        if accepted is not None:
            self.out.accepted_tokens = accepted

    def read_body(self, body: bytes, now: float) -> None:
        """A completion answered in one JSON body (the request asked for no stream)."""
        self._parse(body, now, message="message")
        self.ended = self.whole = True

    def verdict(self, asked: Asked) -> str:
        """Why the answer read so far is not a complete one to `asked` ('' when it is), with
        `out.output_tokens` set to its count (`counted_tokens`). Not one: a usage that the
        choices received contradict (tokens claimed where no event held a choice, fewer tokens
        than text events), more tokens than max_tokens, no usage on an answer not streamed (its
        one event says nothing of its length); a stream that ended with neither a finish reason
        nor [DONE]; fewer tokens than `ignore_eos` forced, unless a stop sequence the request
        gave stopped it. An engine's own length limit (its context) ending a forced answer early
        is a "short answer", no stream fault."""
        out = self.out
        reported, events = out.output_tokens, len(out.chunk_times_s)
        if reported and not self.choice_events:
            return f"bad usage: completion_tokens {reported}, but no event carried a choice"
        if reported is None and self.whole:
            return "bad usage: a completion answered without streaming has no usage"
        tokens = events if reported is None else reported
        tokens, error = counted_tokens(reported, events, asked.limit() if tokens > asked.max_tokens else None)
        out.output_tokens = tokens
        if error:
            return error
        forced = asked.max_tokens if asked.forced else None
        if not out.finish_reason:
            missing = "no finish reason" + ("" if self.ended else ", no [DONE]")
            if forced is not None and tokens < forced:
                return f"truncated stream: {tokens} of {forced} tokens ({missing})"
            return "" if self.ended else f"truncated stream: {tokens} tokens, then the end ({missing})"
        if forced is None or tokens >= forced or (out.finish_reason == "stop" and asked.stops()):
            return ""
        counted = "" if reported is not None else " (counted from the events: no usage)"
        if out.finish_reason == "length" and tokens:
            return (f'short answer: {tokens} of {forced} tokens forced by ignore_eos, then finish_reason "length" '
                    f"(the engine's context or limit ended it){counted}")
        return (f"truncated stream: {tokens} of {forced} tokens forced by ignore_eos, then finish_reason "
                f"{json.dumps(out.finish_reason)[:40]}{counted}")


async def stream_completion(
    session: Session,
    base_url: str,
    *,
    model: str,
    prompt: str | None = None,
    messages: Sequence[ChatMessage] | None = None,
    max_tokens: int = 64,
    ignore_eos: bool = False,
    temperature: float = 0.0,
    extra_body: Mapping[str, object] | None = None,
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
    request already encoded by `encoded_request` (a replay encodes before its clock starts; pass
    its `max_tokens` and `ignore_eos` too: they are what its answer is judged against,
    `EventReader.verdict`)."""
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
        out.error = answer_error(exchange, reader, Asked(body, max_tokens, ignore_eos), lambda: clock() - t0)
        out.success = not out.error
    except TimeoutError:
        out.error = f"timed out after {timeout_s}s"
    except ClientSideError as exc:
        out.error, out.client_error = str(exc), True
    except BadStream as exc:
        out.error = str(exc)
    except (ServerClosed, ProtocolError, OSError) as exc:
        out.error = f"{type(exc).__name__}: {exc}"
    out.end_time_s = clock() - t0
    out.text = "".join(reader.parts)
    return out


def answer_error(exchange: Exchange, reader: EventReader, asked: Asked, now: Callable[[], float]) -> str:
    """Why a finished exchange is not a complete OpenAI answer to the request `asked` ('' when it
    is one): an HTTP error, a body that is no event stream (a JSON completion only where the
    request asked for no stream, read at time `now()`; `BadStream` when it is not a completion),
    an error event, or an answer `EventReader.verdict` rejects."""
    if exchange.status != 200:
        return f"HTTP {exchange.status}: {bytes(exchange.body).decode('utf-8', errors='replace')[:500]}"
    if not exchange.sse:
        media = exchange.content_type.split(";", 1)[0].strip()
        if media == "application/json" and not exchange.body_cut and _unstreamed(asked.body):
            reader.read_body(bytes(exchange.body), now())
        else:
            return f"not an OpenAI stream: {media or 'no content-type'} (HTTP 200, body {shown(bytes(exchange.body))})"
    if reader.server_error:
        return f"error event in the stream: {reader.server_error}"
    return reader.verdict(asked)


def _unstreamed(body: bytes) -> bool:
    """Whether a request's JSON body asked for no stream (`"stream": false`; a string in a prompt
    cannot match, its quotes are escaped)."""
    return b'"stream": false' in body or b'"stream":false' in body


def encoded_request(*, model: str, prompt: str | None, messages: Sequence[ChatMessage] | None, max_tokens: int,
                    ignore_eos: bool, temperature: float, extra_body: Mapping[str, object] | None) -> bytes:
    """The JSON body `stream_completion` would send, encoded once ahead of time."""
    return json.dumps(request_body(model=model, prompt=prompt, messages=messages, max_tokens=max_tokens,
                                   ignore_eos=ignore_eos, temperature=temperature, extra_body=extra_body)[1]).encode()
