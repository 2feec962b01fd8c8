"""A small HTTP/1.1 client for streamed responses: keep-alive connections, chunked bodies, SSE events.

The replay client must never be the bottleneck of a measurement. A general HTTP library spends
most of a request's CPU time on features a load generator does not use (cookie jars, redirects,
tracing hooks, header multidicts, a task per connection); at a few thousand requests per second on
one core that overhead was the limit, not the engine. This module does only what streaming
completions need, on asyncio protocols: one write per request, and the response parsed where the
bytes arrive, with each server-sent event handed over as the bytes after `data:`.

Connections are kept alive and reused. A reused connection the server closed while it sat idle is
detected before the request is sent, or, when the close crosses the request, the request is sent
once more on a new connection (only when no byte of the answer came back, so the server never saw
it). The number of open connections is capped below the process's file-descriptor limit: past the
cap, requests wait for a connection (which shows as schedule lag) instead of failing.

An answer is read as events only when it is one: HTTP 200 with content-type text/event-stream. Any
other answer's body is kept (its first bytes) for the caller to judge. In an event stream, a line
that is not an SSE field (`data:`, `event:`, `id:`, `retry:`, a `:` comment, a blank line) and a
line longer than MAX_SSE_LINE are `BadStream` errors, as is anything the caller's `on_data`
raises: the exchange fails with it, never the event loop.
"""

from __future__ import annotations

import asyncio
import errno
import functools
import resource
import ssl as ssl_module
import urllib.parse
from collections import deque
from collections.abc import Callable

# Errors of this machine, not of the server: out of file descriptors, ports or buffers.
LOCAL_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM, errno.EADDRNOTAVAIL})
# File descriptors kept free for everything else the process opens (logs, pipes, the database).
FD_RESERVE = 64
# The longest SSE line (and, times four, the longest event) read: an answer past it is not a stream
# of completion events, and is not held in memory to find out where it ends.
MAX_SSE_LINE = 1 << 20
MAX_SSE_EVENT = 4 * MAX_SSE_LINE
# Bytes kept of a body that is not an event stream: an error's first 4 KiB says what it is; a 200
# JSON completion (asked for without streaming) is read whole up to MAX_SSE_LINE.
ERROR_BODY_KEPT = 4096
SSE_FIELDS = frozenset({b"event", b"id", b"retry"})


def sse_payloads(events: bytes, strict: bool = False) -> tuple[list[bytes], bytes]:
    """Server-sent events -> (the `data:` payload of each complete event, the bytes of an event still
    arriving after the last blank line). CRLF line ends are read as LF (a CR at the very end waits
    for its LF); an event's several `data:` lines are joined with a newline. `strict`: a line that
    is no SSE field (not `data:`, `event:`, `id:`, `retry:` or a `:` comment) raises `BadStream`."""
    if b"\r" in events:
        events = events.replace(b"\r\n", b"\n")
    blocks = events.split(b"\n\n")
    rest = blocks.pop()
    payloads = []
    for block in blocks:
        if block.startswith(b"data:") and b"\n" not in block:
            payloads.append(block[5:].strip())
        else:
            data_lines = []
            for line in block.split(b"\n"):
                if line.startswith(b"data:"):
                    data_lines.append(line[5:].strip())
                elif strict and line and not line.startswith(b":") and line.split(b":", 1)[0] not in SSE_FIELDS:
                    raise BadStream(f"not an OpenAI stream: a line without 'data:': {shown(line)}")
            if data_lines:
                payloads.append(b"\n".join(data_lines))
    return payloads, rest


def shown(data: bytes, limit: int = 60) -> str:
    """The first `limit` characters of some bytes of an answer, quoted, for an error message."""
    text = data[:limit * 4].decode("utf-8", errors="replace")
    return repr(text[:limit] + ("…" if len(text) > limit or len(data) > limit * 4 else ""))


def check_sse_sizes(payloads: list[bytes], rest: bytes) -> None:
    """`BadStream` when an event's line (complete, or still arriving in `rest`) is longer than
    MAX_SSE_LINE or an event still arriving is longer than MAX_SSE_EVENT."""
    if len(rest) - rest.rfind(b"\n") - 1 > MAX_SSE_LINE or any(len(p) > MAX_SSE_LINE for p in payloads):
        raise BadStream(f"SSE line too long: over {MAX_SSE_LINE >> 20} MiB; not a stream of completion events")
    if len(rest) > MAX_SSE_EVENT:
        raise BadStream(f"SSE event too long: over {MAX_SSE_EVENT >> 20} MiB without a blank line")


class ClientSideError(Exception):
    """A request failed because of this machine (file descriptors, ports), not the server."""


class ServerClosed(ConnectionError):
    """The server closed the connection before the response was complete."""


class ProtocolError(ValueError):
    """The server's answer is not valid HTTP/1.1."""


def protocol_error(exc: Exception) -> ProtocolError:
    """An error met while reading an answer, as the `ProtocolError` it is."""
    return exc if isinstance(exc, ProtocolError) else ProtocolError(f"{type(exc).__name__}: {exc}")


class BadStream(ProtocolError):
    """The answer is HTTP but not a well-formed OpenAI completion stream; the message is the reason,
    as a user reads it (it starts with what went wrong, e.g. "not an OpenAI stream: text/html")."""


def raise_fd_limit() -> int:
    """Raise this process's open-file soft limit to its hard limit; return the limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):
            pass
    return soft if soft != resource.RLIM_INFINITY else 1 << 20


def connection_budget() -> int:
    """Connections this process may hold open at once, after raising its file-descriptor limit."""
    return max(raise_fd_limit() - FD_RESERVE, 16)


@functools.lru_cache(maxsize=64)
def origin_of(base_url: str) -> Origin:
    """The parsed origin of a base URL (parsed once: every request of a replay shares it)."""
    return Origin(base_url)


class Origin:
    """Scheme, host and port of a base URL, with the path prefix requests are sent under."""

    def __init__(self, base_url: str) -> None:
        parts = urllib.parse.urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) URL: {base_url!r}")
        self.tls = parts.scheme == "https"
        self.host = parts.hostname
        self.port = parts.port or (443 if self.tls else 80)
        self.prefix = parts.path.rstrip("/")
        default = (self.tls and self.port == 443) or (not self.tls and self.port == 80)
        host = f"[{self.host}]" if ":" in self.host else self.host
        self.host_header = host if default else f"{host}:{self.port}"
        self.key = (self.tls, self.host, self.port)


class Exchange:
    """Parser of one HTTP response, fed with the bytes as they arrive.

    A 200 answer of content-type text/event-stream (`sse`) goes to `on_data` as lists of server-sent
    events' payloads (the bytes after `data:`), the complete events of each read at once; any other
    answer keeps its body's first bytes in `body` (`body_cut` when there was more). `done` resolves
    when the response is complete (or with the exception that ended it: an exception `on_data`
    raises ends it too, as a `ProtocolError`).
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, on_data: Callable[[list[bytes]], None]) -> None:
        self.on_data = on_data
        self.done: asyncio.Future[None] = loop.create_future()
        self.status = 0
        self.keep_alive = True
        self.received = False
        self.content_type = ""
        self.sse = False
        self.body = bytearray()
        self.body_cut = False
        self._body_limit = ERROR_BODY_KEPT
        self._head = True
        self._pending = b""
        self._chunked = False
        self._length: int | None = None  # bytes of body left (Content-Length), None: chunked or to close
        self._chunk_left = 0
        self._need_crlf = False
        self._trailer = False
        self._events = b""

    def feed(self, data: bytes) -> None:
        self.received = True
        if self.done.done():  # bytes after the answer ended (or failed): the connection is not reused
            self.keep_alive = False
            return
        buf = self._pending + data if self._pending else data
        self._pending = b""
        try:
            if self._head:
                rest = self._parse_head(buf)
                if rest is None:
                    return
                buf = rest
            if self._chunked:
                self._feed_chunked(buf)
            elif self._length is not None:
                take = buf[:self._length]
                self._length -= len(take)
                self._body(take)
                if self._length == 0:
                    self._finish()
            else:
                self._body(buf)
        except Exception as exc:  # noqa: BLE001 (a bad answer fails this exchange, never the event loop)
            self._fail(protocol_error(exc))

    def eof(self, exc: BaseException | None = None) -> None:
        """The connection closed: a body read to the close ends here; anything else was cut short."""
        self.keep_alive = False
        if self.done.done():
            return
        if not self._head and not self._chunked and self._length is None:
            try:
                self._finish()
            except Exception as err:  # noqa: BLE001 (the last event of a body read to the close)
                self._fail(protocol_error(err))
        else:
            self._fail(ServerClosed("the server closed the connection before the response was complete"
                                    + (f" ({exc})" if exc else "")))

    def _parse_head(self, buf: bytes) -> bytes | None:
        end = buf.find(b"\r\n\r\n")
        if end < 0:
            if len(buf) > 65536:
                raise ProtocolError("response headers longer than 64 KiB")
            self._pending = buf
            return None
        lines = buf[:end].decode("latin-1").split("\r\n")
        status = lines[0].split(" ", 2)
        if len(status) < 2 or not status[0].startswith("HTTP/1."):
            raise ProtocolError(f"not an HTTP/1.x status line: {lines[0][:80]!r}")
        self.status = int(status[1])
        if status[0] == "HTTP/1.0":
            self.keep_alive = False
        if 100 <= self.status < 200:  # an interim answer: the real one follows
            return self._parse_head(buf[end + 4:])
        for line in lines[1:]:
            name, _, value = line.partition(":")
            name, value = name.strip().lower(), value.strip().lower()
            if name == "transfer-encoding" and "chunked" in value:
                self._chunked = True
            elif name == "content-length":
                self._length = int(value)
            elif name == "connection" and "close" in value:
                self.keep_alive = False
            elif name == "content-type":
                self.content_type = value
        self._head = False
        if self.status == 200:
            self.sse = self.content_type.split(";", 1)[0].strip() == "text/event-stream"
            self._body_limit = MAX_SSE_LINE
        if self._length is None and not self._chunked:
            self.keep_alive = False  # the body runs to the close
        rest = buf[end + 4:]
        if self._length == 0 and not self._chunked:
            self._finish()
            return None
        return rest

    def _feed_chunked(self, buf: bytes) -> None:
        """Decode chunks by offset (slicing the rest of the buffer per chunk would copy it again
        and again); the payload of every complete chunk goes to `_body` in one piece."""
        pos, n = 0, len(buf)
        pieces: list[bytes] = []
        left, crlf = self._chunk_left, self._need_crlf
        while pos < n:
            if left:  # the rest of a chunk that began in an earlier read
                end = min(n, pos + left)
                pieces.append(buf[pos:end])
                left -= end - pos
                pos = end
                if left:
                    break
                crlf = True
            if crlf:
                if n - pos < 2:
                    break
                pos += 2
                crlf = False
            if self._trailer:  # after the last chunk: trailer lines (ignored), then an empty line
                if n - pos >= 2 and (buf.startswith(b"\r\n", pos) or buf.find(b"\r\n\r\n", pos) >= 0):
                    self._chunk_left, self._need_crlf = 0, False
                    self._body(b"".join(pieces))
                    self._finish()
                    return
                break
            line_end = buf.find(b"\r\n", pos)
            if line_end < 0:
                break
            try:
                size = int(buf[pos:line_end], 16)
            except ValueError:  # chunk extensions after ';'
                size = int(buf[pos:line_end].split(b";", 1)[0], 16)
            pos = line_end + 2
            if size == 0:
                self._trailer = True
                continue
            end = pos + size
            if end + 2 <= n:  # the whole chunk and its CRLF are here: the common case
                pieces.append(buf[pos:end])
                pos = end + 2
            else:
                left = size
        self._chunk_left, self._need_crlf = left, crlf
        self._pending = buf[pos:]
        self._body(b"".join(pieces) if len(pieces) > 1 else pieces[0] if pieces else b"")

    def _body(self, data: bytes) -> None:
        if not data:
            return
        if not self.sse:
            room = self._body_limit - len(self.body)
            self.body += data[:max(room, 0)]
            self.body_cut = self.body_cut or len(data) > room
            return
        events = self._events + data if self._events else data
        payloads, self._events = sse_payloads(events, strict=True)
        if len(events) > MAX_SSE_LINE:
            check_sse_sizes(payloads, self._events)
        if payloads:
            self.on_data(payloads)

    def _finish(self) -> None:
        if self._events.strip():  # a last event without its blank line
            rest, self._events = self._events, b""
            self._body(rest + b"\n\n")
        if not self.done.done():
            self.done.set_result(None)

    def _fail(self, exc: BaseException) -> None:
        self.keep_alive = False
        if not self.done.done():
            self.done.set_exception(exc)


class Connection(asyncio.Protocol):
    """One TCP (or TLS) connection; carries one exchange at a time."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.exchange: Exchange | None = None
        self.lost = False
        self.used = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        if self.exchange is None:  # bytes nobody asked for: the connection can no longer be trusted
            self.close()
            return
        self.exchange.feed(data)

    def eof_received(self) -> bool:
        if self.exchange is not None:
            self.exchange.eof()
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        if self.exchange is not None:
            self.exchange.eof(exc)

    def usable(self) -> bool:
        return not self.lost and self.transport is not None and not self.transport.is_closing()

    def close(self) -> None:
        self.lost = True
        if self.transport is not None:
            self.transport.close()


class Session:
    """Keep-alive connections shared by the requests of one replay (or one probe)."""

    def __init__(self, limit: int = 0, timeout_s: float | None = None) -> None:
        self.limit = limit or connection_budget()
        self.timeout_s = timeout_s
        self._idle: dict[tuple, deque[Connection]] = {}
        self._all: set[Connection] = set()
        self._slots: asyncio.Semaphore | None = None
        self._tls: ssl_module.SSLContext | None = None
        self.waits = 0  # requests that found every allowed connection busy and waited for one

    async def __aenter__(self) -> Session:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        for conn in list(self._all):
            conn.close()
        self._all.clear()
        self._idle.clear()
        await asyncio.sleep(0)

    async def stream(self, base_url: str, path: str, body: bytes, on_data: Callable[[list[bytes]], None],
                     headers: dict[str, str] | None = None) -> Exchange:
        """POST `body` (JSON) to base_url + path; feed each SSE payload of a 200 answer to `on_data`.
        Returns the finished exchange (its `status`, `sse`, `body`); raises on transport errors and
        on a `ProtocolError` (the answer is not HTTP, or not the event stream it claims to be)."""
        origin = origin_of(base_url)
        if self._slots is None:
            self._slots = asyncio.Semaphore(self.limit)
        head = self._head(origin, path, len(body), headers)
        if self._slots.locked():
            self.waits += 1
        async with self._slots:
            for attempt in range(2):
                conn = await self._connection(origin)
                reused = conn.used
                exchange = Exchange(asyncio.get_running_loop(), on_data)
                conn.exchange, conn.used = exchange, True
                assert conn.transport is not None  # `_connection` hands out open connections only
                conn.transport.write(head + body)
                try:
                    await exchange.done
                except ServerClosed:
                    self._drop(conn)
                    if reused and not exchange.received and attempt == 0:
                        continue  # the server had closed this idle connection: send it once more
                    raise
                except BaseException:
                    self._drop(conn)
                    raise
                finally:
                    conn.exchange = None
                self._put_back(origin, conn, exchange.keep_alive)
                return exchange
        raise AssertionError("unreachable")

    @staticmethod
    def _head(origin: Origin, path: str, length: int, headers: dict[str, str] | None) -> bytes:
        lines = [f"POST {origin.prefix}{path} HTTP/1.1", f"Host: {origin.host_header}",
                 "Content-Type: application/json", "Accept: text/event-stream", f"Content-Length: {length}"]
        lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")

    async def _connection(self, origin: Origin) -> Connection:
        idle = self._idle.get(origin.key)
        while idle:
            conn = idle.pop()
            if conn.usable():
                return conn
            self._drop(conn)
        loop = asyncio.get_running_loop()
        if origin.tls and self._tls is None:
            self._tls = ssl_module.create_default_context()
        try:
            _, conn = await loop.create_connection(Connection, origin.host, origin.port,
                                                   ssl=self._tls if origin.tls else None)
        except OSError as exc:
            if exc.errno in LOCAL_ERRNOS:
                raise ClientSideError(f"{type(exc).__name__}: {exc} (this machine's limit, not the server's; "
                                      f"open files allowed: {raise_fd_limit()})") from exc
            raise
        self._all.add(conn)
        return conn

    def _put_back(self, origin: Origin, conn: Connection, keep_alive: bool) -> None:
        if keep_alive and conn.usable():
            self._idle.setdefault(origin.key, deque()).append(conn)
        else:
            self._drop(conn)

    def _drop(self, conn: Connection) -> None:
        """Close a connection and forget it."""
        conn.close()
        self._all.discard(conn)

