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
Answers whose every event is well formed, but whose counts are not what arrived:
  zero_tokens       no text, a finish reason "length" and usage.completion_tokens 0
  early_stop        2 token events, the second with finish_reason "stop" (no stop sequence was asked), usage 2
  short_length      3 token events, the third with finish_reason "length", usage 3 (an engine's context ending
                    it: a failure, not a stream fault)
  empty_choices     N events of `"choices": []` with the token's text beside the list, usage N
  done_first        `data: [DONE]` first, then the events of `ok`
  usage_null        `ok` with `"usage": null` in its last event (no count from the server)
  usage_below       `ok` with usage.completion_tokens 2 for its N text events
  too_many          3N token events and usage 3N
  too_many_no_usage 3N token events and `"usage": null`
"""

from __future__ import annotations

import asyncio
import json
import threading

from aiohttp import web

MODES = ("ok", "html", "truncated", "no_data_prefix", "bad_usage_string", "bad_usage_negative",
         "bad_usage_overflow", "malformed_sse", "huge_line", "slow", "zero_tokens", "early_stop", "short_length",
         "empty_choices", "done_first", "usage_null", "usage_below", "too_many", "too_many_no_usage")
BAD_USAGE = {"bad_usage_string": '"2"', "bad_usage_negative": "-100", "bad_usage_overflow": "1e400"}
HTML = b"<!doctype html><html><head><title>Welcome</title></head><body>It works!</body></html>"


def piece(text: str, chat: bool) -> dict[str, object]:
    """Output text as a choice holds it."""
    return {"delta": {"content": text}} if chat else {"text": text}


def token_events(n: int, chat: bool, finish: str = "length") -> list[str]:
    """The JSON of N one-token completion chunks, the last one with finish_reason `finish`."""
    return [json.dumps({"id": "f", "choices": [{"index": 0, **piece(f"t{i} ", chat),
                                                "finish_reason": finish if i == n - 1 else None}]}) for i in range(n)]


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

    def events(self, n: int, chat: bool) -> list[str]:
        """The JSON events of one answer of the modes whose events are all well formed."""
        no_usage = json.dumps({"id": "f", "choices": [], "usage": None})
        match self.mode:
            case "zero_tokens":
                nothing = {"index": 0, **piece("", chat), "finish_reason": "length"}
                return [json.dumps({"id": "f", "choices": [nothing]}), usage_event(n, "0")]
            case "early_stop" | "short_length":
                tokens = 2 if self.mode == "early_stop" else 3
                return [*token_events(tokens, chat, "stop" if self.mode == "early_stop" else "length"),
                        usage_event(n, str(tokens))]
            case "empty_choices":
                beside = [json.dumps({"id": "f", "choices": [], **piece(f"t{i} ", chat)}) for i in range(n)]
                return [*beside, usage_event(n)]
            case "usage_null":
                return [*token_events(n, chat), no_usage]
            case "too_many" | "too_many_no_usage":
                return [*token_events(3 * n, chat), no_usage if self.mode.endswith("no_usage") else usage_event(3 * n)]
        return [*token_events(n, chat), usage_event(n, "2" if self.mode == "usage_below" else BAD_USAGE.get(self.mode))]

    def lines(self, n: int, chat: bool) -> list[str]:
        """The SSE lines of one answer (each written with its blank line after it)."""
        if self.mode == "truncated":
            return ["data: " + e.replace('"length"', "null") for e in token_events(n, chat)[:3]]
        lines = ["data: " + e for e in self.events(n, chat)] + ["data: [DONE]"]
        if self.mode == "done_first":
            return ["data: [DONE]", *lines]
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
