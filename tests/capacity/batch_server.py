"""A held-out engine for the sustained-capacity test: its streams slow as its batch grows.

python batch_server.py --port PORT [--step-s 0.04] [--per-seq-s 0.0004] [--chunk 8]

It serves like vLLM's decode loop, without a model: every step gives one token to each running
request, and a step lasts step_s + per_seq_s x (running requests); a new request joins at the next
step. At an arrival rate r with L output tokens per request its batch settles at
B = r L TPOT with TPOT = step_s + per_seq_s B, so the highest rate at which TPOT stays under a
threshold T is (T - step_s) / (per_seq_s L T). The batch takes several request lifetimes to fill: a
window of a few hundred requests never sees it full and passes well above that rate.

Serves /v1/models, streaming /v1/completions (the first token alone, then `chunk` tokens an event,
then usage and [DONE]) and /metrics (requests running); a request whose client hangs up leaves the
batch. Stops on SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
from dataclasses import dataclass, field

from aiohttp import web


@dataclass
class Sequence:
    tokens_wanted: int
    tokens: int = 0
    events: asyncio.Queue = field(default_factory=asyncio.Queue)
    gone: bool = False


class BatchEngine:
    def __init__(self, step_s: float, per_seq_s: float, chunk: int) -> None:
        self.step_s, self.per_seq_s, self.chunk = step_s, per_seq_s, chunk
        self.running: list[Sequence] = []
        self.arrived: list[Sequence] = []
        self.wake = asyncio.Event()

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time()
        while True:
            if not self.running and not self.arrived:
                self.wake.clear()
                await self.wake.wait()
                deadline = loop.time()
            self.running += self.arrived
            self.arrived = []
            deadline = max(deadline, loop.time()) + self.step_s + self.per_seq_s * len(self.running)
            await asyncio.sleep(deadline - loop.time())
            for seq in self.running:
                seq.tokens += 1
                if seq.tokens == 1 or seq.tokens % self.chunk == 0 or seq.tokens >= seq.tokens_wanted:
                    seq.events.put_nowait(seq.tokens)
            self.running = [s for s in self.running if s.tokens < s.tokens_wanted and not s.gone]

    def submit(self, tokens: int) -> Sequence:
        seq = Sequence(max(tokens, 1))
        self.arrived.append(seq)
        self.wake.set()
        return seq


def app_for(engine: BatchEngine) -> web.Application:
    async def models(request: web.Request) -> web.Response:
        return web.json_response({"data": [{"id": "batch"}]})

    async def metrics(request: web.Request) -> web.Response:
        text = f"vllm:num_requests_running {len(engine.running) + len(engine.arrived)}\nvllm:num_requests_waiting 0\n"
        return web.Response(text=text, content_type="text/plain")

    async def completions(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        seq = engine.submit(int(body.get("max_tokens", 16)))
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        try:
            await response.prepare(request)
            sent = 0
            while sent < seq.tokens_wanted:
                done = await seq.events.get()
                text = "x " * (done - sent)
                sent = done
                await response.write(f"data: {json.dumps({'choices': [{'index': 0, 'text': text}]})}\n\n".encode())
            usage = {"prompt_tokens": 4, "completion_tokens": sent, "total_tokens": 4 + sent}
            end = {"choices": [{"index": 0, "text": "", "finish_reason": "length"}], "usage": usage}
            await response.write(f"data: {json.dumps(end)}\n\ndata: [DONE]\n\n".encode())
        except (asyncio.CancelledError, ConnectionResetError):  # the client hung up (an abandoned level)
            seq.gone = True
        return response

    app = web.Application()
    app.router.add_get("/v1/models", models)
    app.router.add_get("/metrics", metrics)
    app.router.add_post("/v1/completions", completions)
    return app


async def main(args: argparse.Namespace) -> None:
    engine = BatchEngine(args.step_s, args.per_seq_s, args.chunk)
    runner = web.AppRunner(app_for(engine), access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", args.port, backlog=4096).start()
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    task = asyncio.create_task(engine.run())
    task.add_done_callback(lambda t: t.cancelled() or print(f"engine loop ended: {t.exception()!r}", flush=True))
    print(f"batch server on port {args.port}", flush=True)
    await stop.wait()
    task.cancel()
    await runner.cleanup()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--step-s", type=float, default=0.04)
    parser.add_argument("--per-seq-s", type=float, default=0.0004)
    parser.add_argument("--chunk", type=int, default=8)
    try:
        import uvloop
        uvloop.run(main(parser.parse_args()))
    except ImportError:
        asyncio.run(main(parser.parse_args()))
