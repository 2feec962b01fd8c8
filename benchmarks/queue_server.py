"""The queueing model of `benchmarks/queue_model.py` as a real OpenAI-style streaming server, to run
`tune capacity --endpoint` against in real time and hold its answer against the model's truth.

    .venv/bin/python benchmarks/queue_server.py PORT [--slots 8] [--ttft-ms 20] [--tpot-ms 5]

`slots` requests are served at once, first come first served; a request's first token comes
`ttft-ms` after it gets a slot, then one token every `tpot-ms` (sent 8 tokens an event), then a
finish event, usage and [DONE]. Serves GET /v1/models, GET /health and POST /v1/completions and
/v1/chat/completions (streaming); a client that hangs up frees its slot. Stops on SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal

from aiohttp import web

CHUNK = 8  # tokens an event


def event(payload: dict | str) -> bytes:
    return f"data: {payload if isinstance(payload, str) else json.dumps(payload)}\n\n".encode()


def piece(text: str, finish: str | None, chat: bool) -> dict:
    choice = ({"index": 0, "delta": {"content": text}, "finish_reason": finish} if chat
              else {"index": 0, "text": text, "finish_reason": finish})
    return {"id": "q", "object": "chat.completion.chunk" if chat else "text_completion", "model": "queue",
            "choices": [choice]}


class Server:
    def __init__(self, slots: int, ttft_s: float, tpot_s: float) -> None:
        self.slots = asyncio.Semaphore(slots)
        self.ttft_s, self.tpot_s = ttft_s, tpot_s

    async def complete(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        chat = request.path.endswith("chat/completions")
        tokens = int(body.get("max_tokens") or body.get("max_completion_tokens") or 16)
        response = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await response.prepare(request)
        async with self.slots:
            loop = asyncio.get_running_loop()
            start = loop.time()
            await asyncio.sleep(self.ttft_s)
            await response.write(event(piece("x", None, chat)))
            sent = 1
            while sent < tokens:
                n = min(CHUNK, tokens - sent)
                await asyncio.sleep(max(start + self.ttft_s + (sent + n - 1) * self.tpot_s - loop.time(), 0))
                await response.write(event(piece(" x" * n, None, chat)))
                sent += n
        await response.write(event(piece("", "length", chat)))
        usage = {"prompt_tokens": 1, "completion_tokens": tokens, "total_tokens": tokens + 1}
        await response.write(event({"id": "q", "model": "queue", "choices": [], "usage": usage}))
        await response.write(event("[DONE]"))
        await response.write_eof()
        return response


async def models(_: web.Request) -> web.Response:
    return web.json_response({"object": "list", "data": [{"id": "queue", "object": "model"}]})


async def health(_: web.Request) -> web.Response:
    return web.Response(text="ok")


async def main(port: int, slots: int, ttft_s: float, tpot_s: float) -> None:
    server = Server(slots, ttft_s, tpot_s)
    app = web.Application()
    app.add_routes([web.get("/v1/models", models), web.get("/health", health),
                    web.post("/v1/completions", server.complete), web.post("/v1/chat/completions", server.complete)])
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()
    await runner.cleanup()


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("port", type=int)
    ap.add_argument("--slots", type=int, default=8)
    ap.add_argument("--ttft-ms", type=float, default=20.0)
    ap.add_argument("--tpot-ms", type=float, default=5.0)
    a = ap.parse_args()
    asyncio.run(main(a.port, a.slots, a.ttft_ms / 1000, a.tpot_ms / 1000))
