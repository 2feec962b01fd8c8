"""`tune record`: a transparent proxy that records live OpenAI-API traffic as a native trace.

Clients talk to the proxy instead of the server. Every request (any method and path) is forwarded
to the upstream unchanged, and every response is streamed back chunk by chunk as it arrives, so
SSE streams reach the client byte for byte as the upstream sent them. Each successful (HTTP 200)
`POST /v1/completions` or `POST /v1/chat/completions` also becomes one `TraceRecord` line in the
output file:

- `timestamp`: arrival at the proxy, in seconds after the first recorded request (monotonic clock).
- `prompt` or `messages`, as sent. Chat content given as text parts is joined into one string.
  Requests the native format cannot hold (token-id or several prompts, images, tool-call turns
  without text) are passed through but not recorded; they are counted as "not recordable".
- `output_length`: the server's `usage.completion_tokens` (per choice when `n` > 1). Streams whose
  client did not ask for usage (`stream_options.include_usage`) carry none; the proxy does not add
  it, because that would change the stream the client sees. Those requests fall back to the
  request's `max_tokens` (`max_completion_tokens`), an upper bound of what was generated, or,
  without one, to the number of stream events that carried text, a lower bound.
- `sampling`: `temperature`, `top_p`, `top_k`, `seed` and `stop`, when the request gives them.
- `response`: the first choice's output text, only with `--record-response`.

Headers, Authorization and API keys included, are forwarded to the upstream but never written
anywhere. Upstream errors (a status other than 200 on the recorded paths, 4xx/5xx elsewhere, or an
unreachable upstream) are passed through to the client, counted, and not recorded.

The file stays sorted by timestamp although requests finish out of order: a finished request is
held back until every request that arrived before it has finished too. Lines are appended and
flushed one by one, so a crash loses only the requests still in flight and those waiting behind
them.

Added latency, per request, is the proxy's own share of what the client sees: from having read
the client's request to sending it upstream, plus from receiving the first response chunk from
the upstream to having written it to the client.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from tracetune.errors import InputError
from tracetune.replay.recorded import (
    RECORDED_PATHS,
    ResponseSummary,
    build_record,
    decoded,
    percentile,
    summarize_response,
)

if TYPE_CHECKING:
    import asyncio
    from types import SimpleNamespace

    import aiohttp
    from aiohttp import web
    from multidict import CIMultiDictProxy

    from tracetune.replay.trace import TraceRecord

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8100
# Not forwarded in either direction: hop-by-hop headers (RFC 9110 7.6.1) and those the proxy
# itself must set for its own connection (Host, Content-Length, Expect: the body is already read).
HOP_BY_HOP = frozenset({
    "connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "proxy-connection", "te",
    "trailer", "trailers", "transfer-encoding", "upgrade", "host", "content-length", "expect",
})
MAX_BODY_BYTES = 64 * 2**20  # a long-context prompt easily passes aiohttp's 1 MiB default
SHUTDOWN_GRACE_S = 30.0

def parse_listen(value: str) -> tuple[str, int]:
    """`HOST:PORT`, `:PORT`, `PORT` or `[IPv6]:PORT` as (host, port)."""
    text = value.strip()
    host, sep, port_text = text.rpartition(":")
    if not sep:
        host, port_text = "", text
    host = host.strip("[]") or DEFAULT_HOST
    try:
        port = int(port_text)
    except ValueError:
        raise InputError(f"--listen must be HOST:PORT or PORT, e.g. {DEFAULT_HOST}:{DEFAULT_PORT}; "
                         f"got {value!r}") from None
    if not 0 <= port <= 65535:
        raise InputError(f"--listen port must be 0-65535 (0: any free port), got {port}")
    return host, port


def parse_upstream(url: str) -> str:
    """The upstream's base URL (scheme, host, port, path prefix) to which request paths are appended."""
    from urllib.parse import urlsplit

    parts = urlsplit(url.strip())
    example = "e.g. http://127.0.0.1:8000"
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise InputError(f"--upstream must be an http:// or https:// URL, {example}; got {url!r}")
    try:
        parts.port  # noqa: B018 (deliberate: reading .port validates it, raising ValueError for a bad one)
    except ValueError:
        raise InputError(f"--upstream has a bad port: {url!r}") from None
    if parts.username or parts.password:
        raise InputError("--upstream must not carry credentials; clients' own Authorization headers are forwarded")
    if parts.query or parts.fragment:
        raise InputError(f"--upstream must be a base URL without query or fragment, {example}; got {url!r}")
    path = parts.path.rstrip("/")
    if path.endswith("/v1"):
        # Clients already send /v1/...; an upstream given as its OpenAI base URL must not double it.
        path = path[:-3]
    return f"{parts.scheme}://{parts.netloc}{path}"


# --- turning one exchange into a trace record -------------------------------------------------


# --- the proxy -----------------------------------------------------------------------------------


def _filtered(headers: CIMultiDictProxy[str]) -> list[tuple[str, str]]:
    """Headers minus hop-by-hop ones, including those the Connection header names."""
    named = {t.strip().lower() for v in headers.getall("Connection", []) for t in v.split(",")}
    return [(k, v) for k, v in headers.items() if k.lower() not in HOP_BY_HOP and k.lower() not in named]


@dataclasses.dataclass
class _Exchange:
    """A finished 200 response on a recorded path, kept to build the record from."""

    request_body: bytes
    chunks: list[bytes]
    content_type: str
    content_encoding: str


class RecordingProxy:
    """A transparent HTTP proxy to one OpenAI-compatible upstream that records completions as a trace.

    `recorded`, `errors`, `not_recordable` and `interrupted` count requests; `added_latency_s` holds
    the proxy's own overhead for every request that got a response from the upstream.
    """

    def __init__(self, upstream: str, out_path: str | Path, record_response: bool = False, *,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        self.upstream = parse_upstream(upstream)
        self.out_path = Path(out_path)
        self.record_response = record_response
        self.clock = clock
        self.host = ""
        self.port: int | None = None
        self.recorded = 0
        self.errors = 0
        self.not_recordable = 0
        self.interrupted = 0
        self.added_latency_s: list[float] = []
        self.in_flight = 0
        self._next_seq = 0  # arrival order of recorded-path requests
        self._next_write = 0
        self._finished: dict[int, tuple[float, TraceRecord | None]] = {}
        self._t0: float | None = None
        self._file: TextIO | None = None
        self._session: aiohttp.ClientSession | None = None
        self._runner: web.AppRunner | None = None
        self._idle: asyncio.Event | None = None
        self._hurry: asyncio.Event | None = None
        self._tasks: set[asyncio.Task[object]] = set()  # handlers running now, to cut off at shutdown

    @property
    def base_url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    async def start(self, host: str = DEFAULT_HOST, port: int = DEFAULT_PORT) -> None:
        """Open the output file and the upstream session, and listen on host:port (0: any free port)."""
        import asyncio

        import aiohttp
        from aiohttp import web

        # Imported now: importing pydantic on the first request would stall every stream for ~0.1 s.
        import tracetune.replay.trace  # noqa: F401

        if self.out_path.is_dir():
            raise InputError(f"--out {self.out_path} is a directory; give a file name, e.g. traffic.jsonl")
        if self.out_path.exists() and self.out_path.stat().st_size > 0:
            raise InputError(f"--out {self.out_path} already holds data; give a new file (every recording's "
                             f"timestamps start at 0, so appending would break the trace's order)")
        self.out_path.parent.mkdir(parents=True, exist_ok=True)
        self._file = open(self.out_path, "a", encoding="utf-8")
        self._idle = asyncio.Event()
        self._idle.set()
        self._hurry = asyncio.Event()

        async def sent(session: aiohttp.ClientSession, ctx: SimpleNamespace, params: object) -> None:
            # Fires for the headers and again for each body chunk, just before it is written.
            if isinstance(ctx.trace_request_ctx, dict):
                ctx.trace_request_ctx["sent"] = self.clock()

        tracing = aiohttp.TraceConfig()
        tracing.on_request_headers_sent.append(sent)
        tracing.on_request_chunk_sent.append(sent)
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0, ttl_dns_cache=300),  # a proxy must not cap concurrency
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=30),  # generations may stream for minutes
            auto_decompress=False,  # pass bodies through exactly as encoded
            skip_auto_headers=("User-Agent", "Accept-Encoding", "Content-Type"),  # send only what the client sent
            trace_configs=[tracing],
        )
        app = web.Application(client_max_size=MAX_BODY_BYTES)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=1.0)
        await self._runner.setup()
        try:
            await web.TCPSite(self._runner, host, port).start()
        except OSError as exc:
            await self._close()
            raise InputError(f"--listen {host}:{port}: cannot listen there ({exc.strerror or exc}); "
                             f"pick another port") from None
        self.host, self.port = host, self._runner.addresses[0][1]

    async def stop(self, grace_s: float = SHUTDOWN_GRACE_S) -> None:
        """Stop accepting connections, let in-flight requests finish (up to grace_s, or until
        `hurry()`), cut off the rest, write every finished record and close the file."""
        import asyncio

        if self._runner is None:
            return
        assert self._idle is not None and self._hurry is not None  # made by start(), with the runner
        for site in list(self._runner.sites):
            await site.stop()
        waits = [asyncio.ensure_future(self._idle.wait()), asyncio.ensure_future(self._hurry.wait())]
        await asyncio.wait(waits, timeout=grace_s, return_when=asyncio.FIRST_COMPLETED)
        for w in waits:
            w.cancel()
        # Cut off what is still running ourselves: aiohttp's own shutdown lets a streaming handler
        # run on for up to twice its timeout.
        running = [t for t in self._tasks if not t.done()]
        for task in running:
            task.cancel()
        if running:
            await asyncio.wait(running, timeout=5)
        await self._close()

    def hurry(self) -> None:
        """Make a running `stop()` cut off in-flight requests now."""
        if self._hurry is not None:
            self._hurry.set()

    async def _close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()  # closes the remaining (idle keep-alive) connections
            self._runner = None
        if self._session is not None:
            await self._session.close()
            self._session = None
        if self._file is not None:
            self._flush(final=True)
            self._file.close()
            self._file = None

    # --- per request ---

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        import asyncio

        kind = RECORDED_PATHS.get(request.path) if request.method == "POST" else None
        seq: int | None = None
        arrival = 0.0
        if kind is not None:
            # Sequence and arrival time are taken together, before any await: arrival order.
            seq, arrival = self._next_seq, self.clock()
            self._next_seq += 1
        self.in_flight += 1
        assert self._idle is not None  # made by start(), before the server listens
        self._idle.clear()
        task = asyncio.current_task()
        assert task is not None  # a handler runs in its own task
        self._tasks.add(task)
        record = None
        try:
            response, exchange = await self._forward(request, capture=kind is not None)
            if exchange is not None and kind is not None:  # an exchange is captured only on a recorded path
                summary = self._summary_of(kind, exchange)
                if summary.error:  # a failure the server could only report inside the stream
                    self.errors += 1
                else:
                    record = build_record(kind, exchange.request_body, summary, record_response=self.record_response)
                    if record is None:
                        self.not_recordable += 1
            return response
        except asyncio.CancelledError:
            self.interrupted += 1
            raise
        finally:
            self._tasks.discard(task)
            self.in_flight -= 1
            if self.in_flight == 0:
                self._idle.set()
            if seq is not None:
                self._finished[seq] = (arrival, record)
                self._flush()

    @staticmethod
    def _summary_of(kind: str, exchange: _Exchange) -> ResponseSummary:
        raw = decoded(b"".join(exchange.chunks), exchange.content_encoding)
        if raw is None:  # a content coding we cannot undo: record with the fallback length
            return ResponseSummary()
        return summarize_response(raw, chat=kind == "chat", sse=exchange.content_type.startswith("text/event-stream"))

    async def _forward(self, request: web.Request, capture: bool) -> tuple[web.StreamResponse, _Exchange | None]:
        import aiohttp
        from aiohttp import web
        from yarl import URL

        body = await request.read()
        received = self.clock()
        marks: dict[str, float] = {}
        assert self._session is not None  # opened by start(), before the server listens
        try:
            upstream = await self._session.request(
                request.method, URL(self.upstream + request.raw_path, encoded=True),
                headers=_filtered(request.headers), data=body or None, allow_redirects=False,
                trace_request_ctx=marks)
        except (aiohttp.ClientError, OSError) as exc:
            self.errors += 1
            message = f"tracetune record: upstream {self.upstream} failed: {type(exc).__name__}: {exc}"
            return web.json_response({"error": {"message": message, "type": "upstream_error", "code": 502}},
                                     status=502), None
        forward_s = marks.get("sent", received) - received
        try:
            ok = upstream.status == 200 if capture else upstream.status < 400
            if not ok:
                self.errors += 1
            out = web.StreamResponse(status=upstream.status, reason=upstream.reason)
            for key, value in _filtered(upstream.headers):
                out.headers.add(key, value)
            if upstream.content_length is not None and "Transfer-Encoding" not in upstream.headers \
                    and request.method != "HEAD":
                out.content_length = upstream.content_length
            chunks: list[bytes] | None = [] if capture and ok else None
            back_s = 0.0
            first = True
            client_gone = False
            body_done = False  # every upstream byte was forwarded
            try:
                await out.prepare(request)
                async for chunk in upstream.content.iter_any():
                    got = self.clock()
                    try:
                        await out.write(chunk)
                    except ConnectionResetError:
                        client_gone = True
                        break
                    if first:
                        back_s, first = self.clock() - got, False
                    if chunks is not None:
                        chunks.append(chunk)
                body_done = not client_gone
                if not client_gone:
                    await out.write_eof()
            except ConnectionResetError:
                # A client that hangs up once it has the whole body (e.g. right after `data: [DONE]`,
                # before the chunked terminator) got a complete response: record it.
                client_gone = not body_done
            except (aiohttp.ClientError, OSError):  # OSError includes TimeoutError
                # The upstream broke mid-response. The client already has the status line, so the
                # only honest signal left is a connection closed before the body's end.
                if ok:
                    self.errors += 1
                upstream.close()
                if request.transport is not None:
                    request.transport.close()
                return out, None
            if client_gone:
                if ok:
                    self.errors += 1
                upstream.close()  # stops the generation upstream
                return out, None
            self.added_latency_s.append(forward_s + back_s)
            if chunks is None:
                return out, None
            return out, _Exchange(body, chunks, upstream.headers.get("Content-Type", ""),
                                  upstream.headers.get("Content-Encoding", ""))
        finally:
            upstream.release()

    def _flush(self, final: bool = False) -> None:
        """Write finished records in arrival order: the contiguous finished prefix, or (final)
        every finished one."""
        if self._file is None:
            return
        order = sorted(self._finished) if final else []
        if not final:
            while self._next_write in self._finished:
                order.append(self._next_write)
                self._next_write += 1
        for seq in order:
            arrival, record = self._finished.pop(seq)
            if record is None:
                continue
            if self._t0 is None:
                self._t0 = arrival
            line = record.model_copy(update={"timestamp": round(arrival - self._t0, 6)})
            self._file.write(line.model_dump_json(exclude_none=True) + "\n")
            self._file.flush()
            self.recorded += 1

    def summary(self) -> str:
        """One line: how many requests were recorded, failed, and what the proxy added."""
        lat = self.added_latency_s
        parts = [f"recorded {self.recorded} requests to {self.out_path}", f"errors {self.errors}"]
        if self.not_recordable:
            parts.append(f"not recordable {self.not_recordable}")
        if self.interrupted:
            parts.append(f"cut off at shutdown {self.interrupted}")
        if lat:
            parts.append(f"added latency p50 {percentile(lat, 50) * 1000:.2f} ms · "
                         f"p99 {percentile(lat, 99) * 1000:.2f} ms (over {len(lat)} requests)")
        else:
            parts.append("added latency - (no requests)")
        return " · ".join(parts)
