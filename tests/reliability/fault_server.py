"""A misbehaving OpenAI-compatible server on loopback, for the fault-injection tests.

`FaultServer(mode)` runs an aiohttp server in a thread of the test process (so `tune replay` can
run in the same process, or in a subprocess, against it) and answers every completion request
(/v1/completions and /v1/chat/completions) the way `mode` says; GET /v1/models lists one model,
as every OpenAI-compatible server does, so the endpoint looks healthy until a request is sent.
Modes (N: the request's max_tokens):
  ok                a correct stream: N one-token events, the last with finish_reason "length",
                    a usage event, [DONE]
  html              200 with an HTML page (a proxy's or a web server's welcome page)
  truncated         3 token events, then the end: no finish reason, no usage, no [DONE]
  no_data_prefix    the events of `ok` on lines without `data: `
  bad_usage_string  `ok` with usage.completion_tokens "2" (a string)
  bad_usage_negative  ... -100
  bad_usage_overflow  ... 1e400 (Python's json reads it as infinity)
  malformed_sse     `ok` with its second event cut off mid-object (not valid JSON)
  huge_line         one data line of 1.5 MiB that never ends (no newline)
  slow              `ok`, its first event after `delay_s`
"""

from __future__ import annotations

import asyncio
import json
import threading

from aiohttp import web

MODES = ("ok", "html", "truncated", "no_data_prefix", "bad_usage_string", "bad_usage_negative",
         "bad_usage_overflow", "malformed_sse", "huge_line", "slow")
BAD_USAGE = {"bad_usage_string": '"2"', "bad_usage_negative": "-100", "bad_usage_overflow": "1e400"}
HTML = b"<!doctype html><html><head><title>Welcome</title></head><body>It works!</body></html>"


def token_events(n: int, chat: bool) -> list[str]:
    """The JSON of N one-token completion chunks, the last one with finish_reason "length"."""
    out = []
    for i in range(n):
        piece = {"delta": {"content": f"t{i} "}} if chat else {"text": f"t{i} "}
        out.append(json.dumps({"id": "f", "choices": [{"index": 0, **piece,
                                                      "finish_reason": "length" if i == n - 1 else None}]}))
    return out


def usage_event(n: int, completion_tokens: str | None = None) -> str:
    """The usage chunk: 5 prompt tokens and `completion_tokens` (raw JSON text; default N)."""
    count = completion_tokens if completion_tokens is not None else str(n)
    return json.dumps({"id": "f", "choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": "@"}}).replace(
        '"@"', count)


class FaultServer:
    """`with FaultServer("html") as server:` ... `server.base_url`, `server.requests` (answered)."""

    def __init__(self, mode: str, delay_s: float = 0.5) -> None:
        if mode not in MODES:
            raise ValueError(f"unknown mode {mode!r}; one of {', '.join(MODES)}")
        self.mode, self.delay_s = mode, delay_s
        self.requests = 0
        self.base_url = ""
        self._ready = threading.Event()

    def lines(self, n: int, chat: bool) -> list[str]:
        """The SSE lines of one answer (each written with its blank line after it)."""
        events = token_events(n, chat)
        if self.mode == "truncated":
            return ["data: " + e.replace('"length"', "null") for e in events[:3]]
        usage = usage_event(n, BAD_USAGE.get(self.mode))
        lines = ["data: " + e for e in [*events, usage]] + ["data: [DONE]"]
        if self.mode == "no_data_prefix":
            return [line.removeprefix("data: ") for line in lines]
        if self.mode == "malformed_sse":
            lines[1] = lines[1][:len(lines[1]) // 2]
        return lines

    async def handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.requests += 1
        if self.mode == "html":
            return web.Response(body=HTML, content_type="text/html")
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        try:
            if self.mode == "huge_line":
                await response.write(b'data: {"choices": [{"text": "' + b"x" * (3 << 19))
            else:
                if self.mode == "slow":
                    await asyncio.sleep(self.delay_s)
                chat = request.path.endswith("chat/completions")
                for line in self.lines(int(body.get("max_tokens", 8)), chat):
                    await response.write(line.encode() + b"\n\n")
            await response.write_eof()
        except ConnectionError:  # the client gave up on this answer (a timeout, a line too long)
            pass
        return response

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "fault", "object": "model"}]})

    def _serve(self) -> None:
        async def main() -> None:
            app = web.Application()
            app.router.add_get("/v1/models", self.models)
            app.router.add_post("/v1/completions", self.handle)
            app.router.add_post("/v1/chat/completions", self.handle)
            runner = web.AppRunner(app, access_log=None)
            await runner.setup()
            site = web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
            self.base_url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"
            self._stop = asyncio.Event()
            self._ready.set()
            await self._stop.wait()
            await runner.cleanup()

        self._loop = asyncio.new_event_loop()
        self._loop.run_until_complete(main())
        self._loop.close()

    def __enter__(self) -> FaultServer:
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("the fault server did not start within 10 s")
        return self

    def __exit__(self, *exc: object) -> None:
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)
