"""A zero-latency OpenAI-style streaming server for measuring load-generating clients.

python benchmarks/zero_latency_server.py PORT ARRIVALS_FILE TOKENS

Every POST to /v1/completions or /v1/chat/completions is answered at once with TOKENS
single-token SSE events and a usage event. The arrival time of every request
(time.perf_counter(), CLOCK_MONOTONIC, comparable across processes on Linux) is appended to
ARRIVALS_FILE when the server gets SIGTERM. GET /v1/models lists one model "zero".
"""

from __future__ import annotations

import json
import signal
import sys
import time

from aiohttp import web

port, arrivals_path, tokens = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
arrivals: list[float] = []
CHUNKS = [f"data: {json.dumps({'choices': [{'index': 0, 'text': f'x{i}', 'finish_reason': None}]})}\n\n".encode()
          for i in range(tokens)]
TAIL = (f"data: {json.dumps({'choices': [{'index': 0, 'text': '', 'finish_reason': 'length'}]})}\n\n"
        f"data: {json.dumps({'choices': [], 'usage': {'prompt_tokens': 8, 'completion_tokens': tokens}})}\n\n"
        "data: [DONE]\n\n").encode()


async def complete(request: web.Request) -> web.StreamResponse:
    arrivals.append(time.perf_counter())
    await request.read()
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    for chunk in CHUNKS:
        await response.write(chunk)
    await response.write(TAIL)
    await response.write_eof()
    return response


async def models(request: web.Request) -> web.Response:
    return web.json_response({"object": "list", "data": [{"id": "zero", "object": "model"}]})


async def health(request: web.Request) -> web.Response:
    return web.Response(text="ok")


def dump(*_args) -> None:
    with open(arrivals_path, "w") as f:
        f.write("\n".join(repr(t) for t in arrivals))
    sys.exit(0)


signal.signal(signal.SIGTERM, dump)
app = web.Application()
app.router.add_post("/v1/completions", complete)
app.router.add_post("/v1/chat/completions", complete)
app.router.add_get("/v1/models", models)
app.router.add_get("/health", health)
try:
    import uvloop
    uvloop.install()
except ImportError:
    pass
web.run_app(app, host="127.0.0.1", port=port, access_log=None, print=None, handle_signals=False)
