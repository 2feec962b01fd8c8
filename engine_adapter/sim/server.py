"""The simulated engine's server: an OpenAI-compatible HTTP server whose latency is the queueing
model of `model.py` run on the wall clock, and whose answers come from the deterministic language
model of `lm.py`. For tests and benchmarks: it is not an engine, and nothing measured on it says
anything about one.

    python -m tracetune.engine_adapter.sim.server --port 8000 [--max-num-seqs 8] [--precision bf16]
        [--ttft-ms 50] [--tpot-ms 10] [--alpha 0.05] [--served-model-name NAME]

Serves GET /health, GET /v1/models, GET /metrics (vLLM's names: requests running and waiting,
prompt and generation tokens, finished requests), POST /reset_prefix_cache (it caches nothing),
and POST /v1/completions and /v1/chat/completions. A streamed request joins the model's queue when
it arrives and gets exactly `max_tokens` tokens (16 when not given), as the model releases them
(an event at most every `TICK_S`, its first token and its last on time), then a finish event,
its usage and [DONE]; a client that hangs up frees its slot. A request for no stream (the quality
probe's) is answered at once, outside the queue: its prompt's tokens, its continuation's, and with
`prompt_logprobs` the teacher-forced log-probabilities of its precision. Stops on SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import math
import signal
import sys
from collections.abc import Sequence

from aiohttp import web

from tracetune.engine_adapter.sim import lm
from tracetune.engine_adapter.sim.config import SimConfig, loss_nats, model_of
from tracetune.engine_adapter.sim.model import Core

TICK_S = 0.05  # at most one event a request this often while it decodes (first and last tokens on time)
DEFAULT_MAX_TOKENS = 16
Body = dict[str, object]


def _event(payload: Body | str) -> bytes:
    return f"data: {payload if isinstance(payload, str) else json.dumps(payload)}\n\n".encode()


class SimServer:
    """The HTTP side of one simulated engine: its config, its queueing core on the event loop's
    clock, and its counters."""

    def __init__(self, config: SimConfig) -> None:
        self.config = config
        self.name = config.name()
        self.loss_nats = loss_nats(config)
        self.core = Core(model_of(config))
        self.keys = itertools.count()
        self.t0 = 0.0
        self.counters = {"prompt_tokens": 0, "generation_tokens": 0, "requests": 0}

    def now(self) -> float:
        return asyncio.get_running_loop().time() - self.t0

    def _piece(self, text: str, finish: str | None, chat: bool) -> Body:
        choice = ({"index": 0, "delta": {"content": text}, "finish_reason": finish} if chat
                  else {"index": 0, "text": text, "finish_reason": finish})
        return {"id": "sim", "object": "chat.completion.chunk" if chat else "text_completion", "model": self.name,
                "choices": [choice]}

    async def complete(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        chat = request.path.endswith("chat/completions")
        prompt = _prompt_ids(body, chat)
        tokens = int(body.get("max_tokens") or body.get("max_completion_tokens") or DEFAULT_MAX_TOKENS)
        if not body.get("stream"):
            return web.json_response(self._answer(body, prompt, tokens, chat))
        response = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await response.prepare(request)
        key = next(self.keys)
        self.core.arrive(self.now(), key, tokens)
        try:
            await self._stream(response, key, lm.continuation(prompt, tokens), chat)
        finally:
            self.core.abort(key)  # a client that hung up frees its slot; a finished request is forgotten
        usage = {"prompt_tokens": len(prompt), "completion_tokens": tokens, "total_tokens": len(prompt) + tokens}
        self._count(len(prompt), tokens)
        await response.write(_event({"id": "sim", "model": self.name, "choices": [], "usage": usage}))
        await response.write(_event("[DONE]"))
        await response.write_eof()
        return response

    async def _stream(self, response: web.StreamResponse, key: int, out: list[int], chat: bool) -> None:
        """Write request `key`'s tokens as the core releases them, then its finish event."""
        sent, last = 0, -math.inf
        while True:
            self.core.advance(self.now())
            ready = self.core.emitted(key)
            if ready > sent:
                await response.write(_event(self._piece(lm.detokenize(out[sent:ready]), None, chat)))
                sent, last = ready, self.now()
            if self.core.finished(key):
                break
            await asyncio.sleep(max(self._wake(key, sent, last) - self.now(), 0.0))
        await response.write(_event(self._piece("", "length", chat)))

    def _wake(self, key: int, sent: int, last: float) -> float:
        """When request `key` next has something to send: its first token on time; then its next
        tokens at most every TICK_S; its end on time; while it waits, at the core's next event (an end
        frees a slot), at least every TICK_S."""
        upcoming = self.core.next_token(key)
        if math.isinf(upcoming):
            return min(self.core.next_event(), self.now() + TICK_S)
        if sent == 0:
            return upcoming
        return min(self.core.end(key), max(upcoming, last + TICK_S))

    def _answer(self, body: Body, prompt: list[int], tokens: int, chat: bool) -> Body:
        """A completion for no stream, answered at once (the module's docstring)."""
        out = lm.continuation(prompt, tokens)
        text = lm.detokenize(out)
        choice: Body = {"index": 0, "finish_reason": "length"}
        choice.update({"message": {"role": "assistant", "content": text}} if chat else {"text": text})
        if body.get("return_token_ids"):
            choice.update({"prompt_token_ids": prompt, "token_ids": out})
        top_k = body.get("prompt_logprobs")
        if isinstance(top_k, int) and not isinstance(top_k, bool):
            choice["prompt_logprobs"] = lm.prompt_logprobs(prompt, max(top_k, 1), self.loss_nats)
        self._count(len(prompt), tokens)
        usage = {"prompt_tokens": len(prompt), "completion_tokens": tokens, "total_tokens": len(prompt) + tokens}
        return {"id": "sim", "object": "chat.completion" if chat else "text_completion", "model": self.name,
                "choices": [choice], "usage": usage}

    def _count(self, prompt_tokens: int, generated: int) -> None:
        self.counters["prompt_tokens"] += prompt_tokens
        self.counters["generation_tokens"] += generated
        self.counters["requests"] += 1

    async def metrics(self, _: web.Request) -> web.Response:
        self.core.advance(self.now())
        running, waiting = self.core.busy, len(self.core.waiting)
        label = f'{{model_name="{self.name}"}}'
        lines = [
            "# TYPE vllm:num_requests_running gauge", f"vllm:num_requests_running{label} {running}",
            "# TYPE vllm:num_requests_waiting gauge", f"vllm:num_requests_waiting{label} {waiting}",
            "# TYPE vllm:kv_cache_usage_perc gauge",
            f"vllm:kv_cache_usage_perc{label} {running / self.core.model.slots}",
            "# TYPE vllm:prompt_tokens counter", f"vllm:prompt_tokens_total{label} {self.counters['prompt_tokens']}",
            "# TYPE vllm:generation_tokens counter",
            f"vllm:generation_tokens_total{label} {self.counters['generation_tokens']}",
            "# TYPE vllm:request_success counter", f"vllm:request_success_total{label} {self.counters['requests']}",
        ]
        return web.Response(text="\n".join(lines) + "\n", content_type="text/plain")

    async def models(self, _: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": self.name, "object": "model",
                                                              "owned_by": "tracetune-sim"}]})


def _prompt_ids(body: Body, chat: bool) -> list[int]:
    """The request's prompt as the simulator's tokens (its own ids where it sent ids)."""
    if chat:
        messages = body.get("messages")
        parts = [m.get("content") for m in messages if isinstance(m, dict)] if isinstance(messages, list) else []
        return lm.tokenize("\n".join(_text(p) for p in parts))
    prompt = body.get("prompt")
    if isinstance(prompt, list) and all(isinstance(t, int) for t in prompt):
        return [int(t) for t in prompt]
    return lm.tokenize(_text(prompt))


def _text(content: object) -> str:
    """A message's content (a string, or a list of parts with text) as text."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return ""


async def _ok(_: web.Request) -> web.Response:
    return web.Response(text="ok")


def application(server: SimServer) -> web.Application:
    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.add_routes([web.get("/health", _ok), web.get("/v1/models", server.models), web.get("/metrics", server.metrics),
                    web.post("/reset_prefix_cache", _ok), web.post("/v1/completions", server.complete),
                    web.post("/v1/chat/completions", server.complete)])
    return app


async def serve(config: SimConfig, host: str, port: int) -> None:
    """Serve until SIGTERM or SIGINT."""
    server = SimServer(config)
    server.t0 = asyncio.get_running_loop().time()
    runner = web.AppRunner(application(server), access_log=None, handler_cancellation=True)
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    model = server.core.model
    print(f"tracetune's simulated engine (a scripted queueing model, not a real engine) on port {port}: "
          f"{model.slots} slots, TTFT {model.ttft_s * 1000:g} ms, TPOT {model.tpot_s * 1000:g} ms x "
          f"(1 + {model.alpha:g} per other request), {config.dtype} (quality loss {server.loss_nats:g} nats a token)",
          flush=True)
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        asyncio.get_running_loop().add_signal_handler(sig, stop.set)
    await stop.wait()
    await runner.cleanup()


def parse_args(argv: Sequence[str] | None = None) -> tuple[SimConfig, str, int]:
    defaults = SimConfig()
    ap = argparse.ArgumentParser(prog="python -m tracetune.engine_adapter.sim.server", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--served-model-name", default=defaults.name())
    ap.add_argument("--max-num-seqs", type=int, default=defaults.max_num_seqs)
    ap.add_argument("--precision", choices=("bf16", "fp8", "int4"), default=defaults.dtype)
    ap.add_argument("--ttft-ms", type=float, default=defaults.ttft_ms)
    ap.add_argument("--tpot-ms", type=float, default=defaults.tpot_ms)
    ap.add_argument("--alpha", type=float, default=defaults.alpha)
    a = ap.parse_args(argv)
    config = SimConfig(served_model_name=a.served_model_name, max_num_seqs=a.max_num_seqs, dtype=a.precision,
                       ttft_ms=a.ttft_ms, tpot_ms=a.tpot_ms, alpha=a.alpha)
    return config, a.host, a.port


def main(argv: Sequence[str] | None = None) -> int:
    config, host, port = parse_args(argv)
    asyncio.run(serve(config, host, port))
    return 0


if __name__ == "__main__":
    sys.exit(main())
