"""A zero-latency OpenAI-style streaming server for measuring load-generating clients.

python benchmarks/zero_latency_server.py PORT ARRIVALS_FILE TOKENS [PROCESSES]

Every POST is answered at once, as vLLM's server answers (HTTP/1.1, chunked, one chunk per event):
TOKENS single-token SSE events shaped like vLLM's, a finish event, a usage event and [DONE]. It is
written on raw asyncio protocols (uvloop when installed) so that one core serves far more requests
than any client under test sends: the server must never be what a client benchmark measures. The
arrival time of every request (time.perf_counter(), CLOCK_MONOTONIC, comparable across processes on
Linux) is written to ARRIVALS_FILE when the server gets SIGTERM. GET /v1/models lists one model
"zero"; GET /health answers ok. With PROCESSES > 1 that many processes share the port
(SO_REUSEPORT), each writing ARRIVALS_FILE.N, for clients that outrun one core.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time


def chunk(payload: dict | str) -> bytes:
    data = f"data: {payload if isinstance(payload, str) else json.dumps(payload, separators=(',', ':'))}\n\n"
    return f"{len(data.encode()):x}\r\n{data}\r\n".encode()


def answer(tokens: int) -> list[bytes]:
    """The writes of one streamed completion: headers, one chunk per event, the last chunk."""
    base = {"id": "cmpl-0", "object": "text_completion", "created": 0, "model": "zero"}
    events = [chunk({**base, "choices": [{"index": 0, "text": f"x{i}", "logprobs": None, "finish_reason": None,
                                          "stop_reason": None}], "usage": None}) for i in range(tokens)]
    events.append(chunk({**base, "choices": [{"index": 0, "text": "", "logprobs": None, "finish_reason": "length",
                                              "stop_reason": None}], "usage": None}))
    events.append(chunk({**base, "choices": [], "usage": {"prompt_tokens": 8, "total_tokens": 8 + tokens,
                                                          "completion_tokens": tokens}}))
    events.append(chunk("[DONE]") + b"0\r\n\r\n")
    head = (b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream; charset=utf-8\r\n"
            b"transfer-encoding: chunked\r\n\r\n")
    return [head] + events


def small(status: str, body: bytes) -> bytes:
    return (f"HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {len(body)}\r\n\r\n".encode()
            + body)


class Server(asyncio.Protocol):
    arrivals: list[float] = []
    writes: list[bytes] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport
        self.buf = b""

    def data_received(self, data: bytes) -> None:
        buf = self.buf + data
        while True:
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                break
            head = buf[:end]
            length = 0
            for line in head.split(b"\r\n")[1:]:
                if line[:15].lower() == b"content-length:":
                    length = int(line[15:])
            if len(buf) < end + 4 + length:
                break
            buf = buf[end + 4 + length:]
            self.respond(head)
        self.buf = buf

    def respond(self, head: bytes) -> None:
        if head.startswith(b"POST"):
            Server.arrivals.append(time.perf_counter())
            for piece in Server.writes:
                self.transport.write(piece)
        elif b"/v1/models" in head[:40]:
            self.transport.write(small("200 OK", b'{"object":"list","data":[{"id":"zero","object":"model"}]}'))
        else:
            self.transport.write(small("200 OK", b"ok"))


def main() -> None:
    port, arrivals_path, tokens = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    processes = int(sys.argv[4]) if len(sys.argv) > 4 else 1
    Server.writes = answer(tokens)
    children = []
    for n in range(1, processes):
        pid = os.fork()
        if pid == 0:
            serve(port, f"{arrivals_path}.{n}")
            os._exit(0)
        children.append(pid)
    serve(port, arrivals_path if processes == 1 else f"{arrivals_path}.0")
    for pid in children:
        os.kill(pid, signal.SIGTERM)
        os.waitpid(pid, 0)


def serve(port: int, arrivals_path: str) -> None:
    try:
        import uvloop
        uvloop.install()
    except ImportError:
        pass
    loop = asyncio.new_event_loop()
    stop = loop.create_future()
    loop.add_signal_handler(signal.SIGTERM, lambda: stop.done() or stop.set_result(None))
    server = loop.run_until_complete(loop.create_server(Server, "127.0.0.1", port, backlog=4096, reuse_port=True))
    loop.run_until_complete(stop)
    server.close()
    with open(arrivals_path, "w") as f:
        f.write("\n".join(repr(t) for t in Server.arrivals))


if __name__ == "__main__":
    main()
