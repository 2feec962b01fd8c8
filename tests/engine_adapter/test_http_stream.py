"""The replay's HTTP/1.1 client: response parsing however the bytes are split, the event reader's
JSON-free path against a full parse, keep-alive reuse, a stale idle connection, the line
between the client's own failures and the server's, and answers that are not event streams (an
HTML page, lines without `data:`, an endless line, an event the reader cannot read) failing
their exchange, never the event loop."""

from __future__ import annotations

import asyncio
import errno
import json

import pytest

from tracetune.engine_adapter.http_stream import (
    MAX_SSE_LINE,
    BadStream,
    ClientSideError,
    Exchange,
    ProtocolError,
    Session,
    sse_payloads,
)
from tracetune.engine_adapter.openai_client import EventReader, StreamedCompletion, new_session, stream_completion

EVENTS = [b'{"id":"c","choices":[{"index":0,"text":"Hel","logprobs":null,"finish_reason":null}]}',
          b'{"id":"c","choices":[{"index":0,"text":"","logprobs":null,"finish_reason":null}]}',
          b'{"id":"c","choices":[{"index":0,"text":"\\"lo","logprobs":null,"finish_reason":"length"}]}',
          b'{"id":"c","choices":[],"usage":{"prompt_tokens":5,"completion_tokens":3}}']


def chunked(*payloads: bytes) -> bytes:
    body = b"".join(b"data: " + p + b"\n\n" for p in payloads) + b"data: [DONE]\n\n"
    out = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
    for i in range(0, len(body), 37):  # chunks that cut events, lines and the CRLFs anywhere
        piece = body[i:i + 37]
        out += f"{len(piece):x}\r\n".encode() + piece + b"\r\n"
    return out + b"0\r\n\r\n"


def parse(raw: bytes, step: int) -> tuple[Exchange, list[bytes]]:
    got: list[bytes] = []
    loop = asyncio.new_event_loop()
    try:
        exchange = Exchange(loop, got.extend)
        for i in range(0, len(raw), step):
            exchange.feed(raw[i:i + step])
        if not exchange.done.done():
            exchange.eof()  # the server closes the connection
        return exchange, got
    finally:
        loop.close()


@pytest.mark.parametrize("step", [1, 2, 7, 64, 100000])
def test_chunked_sse_parses_the_same_however_the_bytes_arrive(step):
    exchange, got = parse(chunked(*EVENTS), step)
    assert exchange.done.done() and exchange.done.exception() is None
    assert got == EVENTS + [b"[DONE]"] and exchange.status == 200 and exchange.keep_alive


@pytest.mark.parametrize("step", [1, 5, 100000])
def test_content_length_and_read_to_close_bodies(step):
    body = b"data: " + EVENTS[0] + b"\r\n\r\ndata: [DONE]\r\n\r\n"  # CRLF event separators too
    sse = b"Content-Type: text/event-stream; charset=utf-8\r\n"
    exchange, got = parse(b"HTTP/1.1 200 OK\r\n%sContent-Length: %d\r\n\r\n" % (sse, len(body)) + body, step)
    assert got == [EVENTS[0], b"[DONE]"] and exchange.keep_alive and exchange.sse
    exchange, got = parse(b"HTTP/1.0 200 OK\r\n" + sse + b"\r\n" + body, step)
    assert got == [EVENTS[0], b"[DONE]"] and not exchange.keep_alive and exchange.done.exception() is None
    exchange, _ = parse(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 11\r\n\r\nbad request", step)
    assert exchange.status == 400 and bytes(exchange.body) == b"bad request" and not exchange.sse


def test_a_body_cut_short_is_an_error():
    raw = chunked(*EVENTS)
    exchange, _ = parse(raw[:len(raw) // 2], 10)
    assert "closed the connection before the response was complete" in str(exchange.done.exception())


def read(payloads, *, chat: bool, parse_all: bool) -> StreamedCompletion:
    out = StreamedCompletion()
    ticks = iter(range(1, 100))
    reader = EventReader(out, chat=chat, t0=0.0, clock=lambda: float(next(ticks)), keep_text=parse_all,
                         on_text=None, on_first_output=None)
    for p in payloads:
        reader([p])
    return out


CHAT = [b'{"choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]}',
        b'{"choices":[{"index":0,"delta":{"reasoning_content":"hm"},"finish_reason":null}]}',
        b'{"choices":[{"index":0,"delta":{"content":"Hi"},"finish_reason":null}]}',
        b'{"choices": [{"index": 0, "delta": {"content": "!"}, "finish_reason": null}]}',  # spaces
        b'{"choices":[{"index":0,"delta":{"content":null},"finish_reason":null}]}',
        b'{"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}',
        b'{"choices":[],"usage":{"prompt_tokens":9,"completion_tokens":2}}']


@pytest.mark.parametrize("payloads,chat", [(EVENTS, False), (CHAT, True)])
def test_the_json_free_path_reads_what_a_full_parse_reads(payloads, chat):
    fast, full = read(payloads, chat=chat, parse_all=False), read(payloads, chat=chat, parse_all=True)
    assert fast.chunk_times_s == full.chunk_times_s and len(full.chunk_times_s) == 2
    assert (fast.finish_reason, fast.prompt_tokens, fast.output_tokens) == \
        (full.finish_reason, full.prompt_tokens, full.output_tokens) != (None, None, None)


class CountingServer:
    """An HTTP/1.1 server that streams a fixed answer, counts connections, and closes each
    connection after `close_after` requests (None: never) without telling the client."""

    def __init__(self, close_after: int | None = None) -> None:
        self.connections = 0
        self.requests = 0
        self.close_after = close_after

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        served = 0
        while True:
            head = await reader.readuntil(b"\r\n\r\n") if not reader.at_eof() else b""
            if not head:
                break
            length = int(next(line.split(b":")[1] for line in head.split(b"\r\n")
                              if line.lower().startswith(b"content-length")))
            await reader.readexactly(length)
            self.requests += 1
            writer.write(chunked(*EVENTS))
            await writer.drain()
            served += 1
            if self.close_after is not None and served >= self.close_after:
                writer.close()
                return

    async def __aenter__(self) -> str:
        self.server = await asyncio.start_server(self._safe, "127.0.0.1", 0)
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def _safe(self, reader, writer):
        try:
            await self.handle(reader, writer)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass

    async def __aexit__(self, *exc) -> None:
        self.server.close()


def test_connections_are_kept_alive_and_a_stale_one_is_replaced():
    async def go(close_after):
        server = CountingServer(close_after)
        async with server as url, new_session() as session:
            outs = []
            for _ in range(4):
                outs.append(await stream_completion(session, url, model="m", prompt="p", max_tokens=3))
                await asyncio.sleep(0.05)  # the server's close reaches the client while idle
            return server, outs

    server, outs = asyncio.run(go(None))
    assert all(o.success and o.output_tokens == 3 for o in outs) and server.connections == 1
    server, outs = asyncio.run(go(1))
    assert all(o.success for o in outs) and server.connections == 4 and server.requests == 4


def test_running_out_of_file_descriptors_is_the_clients_failure(monkeypatch):
    async def go():
        loop = asyncio.get_running_loop()

        async def no_fd(*args, **kwargs):
            raise OSError(errno.EMFILE, "Too many open files")

        monkeypatch.setattr(loop, "create_connection", no_fd)
        async with Session() as session:
            return await stream_completion(session, "http://127.0.0.1:9", model="m", prompt="p")

    out = asyncio.run(go())
    assert not out.success and out.client_error and "this machine's limit" in out.error
    with pytest.raises(ClientSideError):
        raise ClientSideError("x")


def test_request_body_is_sent_once_encoded():
    async def go():
        seen = []

        async def handle(reader, writer):
            head = await reader.readuntil(b"\r\n\r\n")
            length = int(next(line.split(b":")[1] for line in head.split(b"\r\n")
                              if line.lower().startswith(b"content-length")))
            seen.append((head, json.loads(await reader.readexactly(length))))
            writer.write(chunked(*EVENTS))
            await writer.drain()
            writer.close()

        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        async with new_session() as session:
            out = await stream_completion(session, f"http://127.0.0.1:{port}/prefix", model="m", prompt="p",
                                          max_tokens=3, headers={"Authorization": "Bearer k"})
        server.close()
        return out, seen

    out, seen = asyncio.run(go())
    head, body = seen[0]
    assert head.startswith(b"POST /prefix/v1/completions HTTP/1.1\r\n") and b"Authorization: Bearer k" in head
    assert body["prompt"] == "p" and body["stream"] is True and out.text == 'Hel"lo'


def sse_answer(body: bytes, content_type: bytes = b"text/event-stream") -> bytes:
    return b"HTTP/1.1 200 OK\r\nContent-Type: %s\r\nContent-Length: %d\r\n\r\n" % (content_type, len(body)) + body


@pytest.mark.parametrize("step", [1, 100000])
def test_a_200_answer_that_is_not_an_event_stream_is_kept_as_a_body_not_read_as_events(step):
    page = b"<html><body>data: {}\n\n</body></html>"  # even one that looks like an event inside
    exchange, got = parse(sse_answer(page, b"text/html; charset=utf-8"), step)
    assert exchange.done.exception() is None and got == [] and not exchange.sse
    assert bytes(exchange.body) == page and exchange.content_type == "text/html; charset=utf-8"
    exchange, got = parse(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(page) + page, step)
    assert got == [] and not exchange.sse and exchange.content_type == ""  # no content-type: no stream


def test_sse_fields_and_comments_are_read_and_any_other_line_fails_the_exchange():
    fine = b": keep-alive\n\nevent: message\nid: 7\nretry: 100\ndata: {\"a\": 1}\n\nid\ndata: [DONE]\n\n"
    exchange, got = parse(sse_answer(fine), 3)
    assert exchange.done.exception() is None and got == [b'{"a": 1}', b"[DONE]"]
    exchange, got = parse(sse_answer(b'data: {"a": 1}\n\n{"choices": []}\n\ndata: [DONE]\n\n'), 5)
    error = exchange.done.exception()
    assert isinstance(error, BadStream) and not exchange.keep_alive
    assert str(error) == "not an OpenAI stream: a line without 'data:': '{\"choices\": []}'"
    # Recorded traffic (replay.recorded) is read leniently: the same line is skipped there.
    assert sse_payloads(b'{"choices": []}\n\ndata: x\n\n') == ([b"x"], b"")


@pytest.mark.parametrize("extra,fails", [(-100, False), (100, True)])
def test_an_sse_line_longer_than_the_bound_fails_without_waiting_for_its_end(extra, fails):
    line = b"data: " + b"x" * (MAX_SSE_LINE - 6 + extra)
    loop = asyncio.new_event_loop()
    try:
        exchange = Exchange(loop, lambda payloads: None)
        exchange.feed(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
        for i in range(0, len(line), 65536):  # the line arrives as reads do, and never ends
            piece = line[i:i + 65536]
            exchange.feed(b"%x\r\n%s\r\n" % (len(piece), piece))
        assert exchange.done.done() == fails
        if fails:
            assert str(exchange.done.exception()).startswith("SSE line too long: over 1 MiB")
            assert len(exchange._events) <= MAX_SSE_LINE + 65536  # what it held, not more
    finally:
        loop.close()


def test_an_error_in_the_event_reader_fails_the_exchange_not_the_event_loop():
    def broken(payloads):
        raise AttributeError("'list' object has no attribute 'get'")

    to_close = b"HTTP/1.0 200 OK\r\nContent-Type: text/event-stream\r\n\r\ndata: [1, 2]"  # read to the close
    for raw in (sse_answer(b"data: [1, 2]\n\ndata: [DONE]\n\n"), to_close):
        loop = asyncio.new_event_loop()
        try:
            exchange = Exchange(loop, broken)
            exchange.feed(raw)  # raises nothing
            assert exchange.done.done() == (raw != to_close)
            exchange.eof()  # the last event of a body read to the close (no blank line after it) is read here
            exchange.feed(b"more bytes after the failure")
            error = exchange.done.exception()
            assert isinstance(error, ProtocolError) and "AttributeError" in str(error) and not exchange.keep_alive
        finally:
            loop.close()
