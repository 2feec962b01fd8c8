"""Streaming client for OpenAI-compatible completion endpoints, with per-token timing.

Every engine adapter serves the OpenAI API, so this one client measures all of them, for the
engine check, the replay harness and the quality probes alike. It uses aiohttp (the HTTP client
vLLM's own benchmark uses) with a minimal SSE reader, because at high request rates the client's
own overhead would otherwise show up as latency. Timing uses a monotonic clock
(`time.perf_counter()` unless a scripted clock is given); a failed request is returned as data
(`success=False, error=...`), never raised, so a replay of thousands of requests survives a few
bad ones.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from typing import Any, Callable

import aiohttp


@dataclasses.dataclass
class StreamedCompletion:
    """What one streamed request did, as seen by the client.

    `chunk_times_s` holds the arrival time of every SSE event that carried output text, relative to
    `send_time_s` (a clock reading). One event may carry several tokens (speculative decoding):
    token counts come from the server's `usage`, never from counting events.
    """

    success: bool = False
    error: str = ""
    send_time_s: float = 0.0
    chunk_times_s: list[float] = dataclasses.field(default_factory=list)
    end_time_s: float = 0.0
    text: str = ""
    prompt_tokens: int | None = None
    output_tokens: int | None = None
    finish_reason: str | None = None

    @property
    def ttft_s(self) -> float | None:
        return self.chunk_times_s[0] if self.chunk_times_s else None

    @property
    def e2e_s(self) -> float:
        return self.end_time_s

    @property
    def itl_s(self) -> list[float]:
        """Gaps between consecutive output events (inter-token latency)."""
        t = self.chunk_times_s
        return [b - a for a, b in zip(t, t[1:])]


def new_session(limit: int = 0, timeout_s: float | None = None) -> aiohttp.ClientSession:
    """A client session suited to replay: no connection cap (0), no read timeout by default."""
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=limit, ttl_dns_cache=300),
        timeout=aiohttp.ClientTimeout(total=timeout_s),
    )


def request_body(
    *, model: str, prompt: str | None, messages: list[dict[str, Any]] | None, max_tokens: int,
    ignore_eos: bool, temperature: float, extra_body: dict[str, Any] | None,
) -> tuple[str, dict[str, Any]]:
    """The URL path and JSON body of one streaming request."""
    if (prompt is None) == (messages is None):
        raise ValueError("give exactly one of prompt or messages")
    body: dict[str, Any] = {
        "model": model,
        "max_tokens": max_tokens,
        "temperature": temperature,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if ignore_eos:
        body["ignore_eos"] = True
    if messages is not None:
        body["messages"] = messages
    else:
        body["prompt"] = prompt
    body.update(extra_body or {})
    return ("/v1/chat/completions" if messages is not None else "/v1/completions"), body


async def stream_completion(
    session: aiohttp.ClientSession,
    base_url: str,
    *,
    model: str,
    prompt: str | None = None,
    messages: list[dict[str, Any]] | None = None,
    max_tokens: int = 64,
    ignore_eos: bool = False,
    temperature: float = 0.0,
    extra_body: dict[str, Any] | None = None,
    timeout_s: float | None = None,
    headers: dict[str, str] | None = None,
    clock: Callable[[], float] = time.perf_counter,
    on_text: Callable[[str], None] | None = None,
) -> StreamedCompletion:
    """Send one streaming request to `/v1/completions` (prompt) or `/v1/chat/completions`."""
    path, body = request_body(model=model, prompt=prompt, messages=messages, max_tokens=max_tokens,
                              ignore_eos=ignore_eos, temperature=temperature, extra_body=extra_body)
    chat = messages is not None
    url = base_url.rstrip("/") + path
    out = StreamedCompletion()
    parts: list[str] = []
    t0 = clock()
    out.send_time_s = t0
    try:
        async with asyncio.timeout(timeout_s):
            async with session.post(url, json=body, headers=headers) as response:
                if response.status != 200:
                    detail = (await response.read()).decode("utf-8", errors="replace")
                    out.error = f"HTTP {response.status}: {detail[:500]}"
                    out.end_time_s = clock() - t0
                    return out
                async for raw in response.content:
                    if not raw.startswith(b"data:"):
                        continue
                    data = raw[5:].strip()
                    if data == b"[DONE]":
                        break
                    now = clock() - t0
                    event = json.loads(data)
                    usage = event.get("usage")
                    if usage:
                        out.prompt_tokens = usage.get("prompt_tokens")
                        out.output_tokens = usage.get("completion_tokens")
                    for choice in event.get("choices") or ():
                        piece = (choice.get("delta") or {}).get("content") if chat else choice.get("text")
                        if piece:
                            parts.append(piece)
                            out.chunk_times_s.append(now)
                            if on_text:
                                on_text(piece)
                        if choice.get("finish_reason"):
                            out.finish_reason = choice["finish_reason"]
        out.success = True
    except TimeoutError:
        out.error = f"timed out after {timeout_s}s"
    except (aiohttp.ClientError, json.JSONDecodeError, OSError) as exc:
        out.error = f"{type(exc).__name__}: {exc}"
    out.end_time_s = clock() - t0
    out.text = "".join(parts)
    return out
