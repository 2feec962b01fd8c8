"""An in-process OpenAI-style streaming server for unit tests of the replay machinery.

It answers every request at once with `tokens` single-token SSE events (optionally `gap_s`
apart) and records arrival times and the peak number of concurrent requests. With `timings`, its
last event (the usage) carries them, as llama-server's does (`"timings": {..., "draft_n": ...}`).
"""

from __future__ import annotations

import asyncio
import json
import time

from aiohttp import web


class SSEServer:
    def __init__(self, tokens: int = 3, gap_s: float = 0.0, timings: dict | None = None):
        self.tokens = tokens
        self.gap_s = gap_s
        self.timings = timings
        self.arrivals: list[float] = []
        self.bodies: list[dict] = []
        self.in_flight = 0
        self.peak = 0
        self.base_url = ""

    async def handle(self, request: web.Request) -> web.StreamResponse:
        self.arrivals.append(time.perf_counter())
        body = await request.json()
        self.bodies.append(body)
        self.in_flight += 1
        self.peak = max(self.peak, self.in_flight)
        try:
            response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await response.prepare(request)
            n = min(self.tokens, body.get("max_tokens", self.tokens))
            chat = request.path.endswith("chat/completions")
            for i in range(n):
                choice = {"delta": {"content": f"t{i} "}} if chat else {"text": f"t{i} "}
                choice["finish_reason"] = "length" if i == n - 1 else None  # a stream ends with its reason
                await response.write(f"data: {json.dumps({'choices': [choice]})}\n\n".encode())
                if self.gap_s:
                    await asyncio.sleep(self.gap_s)
            last = {"choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": n}}
            if self.timings is not None:
                last["timings"] = self.timings
            await response.write(f"data: {json.dumps(last)}\n\ndata: [DONE]\n\n".encode())
            await response.write_eof()
            return response
        finally:
            self.in_flight -= 1

    async def start(self) -> None:
        app = web.Application()
        app.router.add_post("/v1/completions", self.handle)
        app.router.add_post("/v1/chat/completions", self.handle)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.base_url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"

    async def stop(self) -> None:
        await self._runner.cleanup()
