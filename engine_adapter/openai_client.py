"""Streaming client for OpenAI-compatible completion endpoints, with per-token timing.

Every engine adapter serves the OpenAI API, so one client measures all of them. Timing uses
`time.perf_counter()`; a failed request is returned as data (`success=False, error=...`), never
raised, so a replay of thousands of requests survives a few bad ones.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from typing import Any, Callable

import httpx


@dataclasses.dataclass
class StreamedCompletion:
    """What one streamed request did, as seen by the client.

    `chunk_times_s` holds the arrival time of every SSE event that carried output text, relative to
    `send_time_s` (a perf_counter reading). One event may carry several tokens (speculative
    decoding): token counts come from the server's `usage`, never from counting events.
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


def _clock() -> float:
    return time.perf_counter()


async def stream_completion(
    client: httpx.AsyncClient,
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
    clock: Callable[[], float] = _clock,
    on_text: Callable[[str], None] | None = None,
) -> StreamedCompletion:
    """Send one streaming request to `/v1/completions` (prompt) or `/v1/chat/completions`."""
    if (prompt is None) == (messages is None):
        raise ValueError("give exactly one of prompt or messages")
    chat = messages is not None
    body: dict[str, Any] = {
        "model": model,
        "max_tokens": max_tokens,
        "temperature": temperature,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if ignore_eos:
        body["ignore_eos"] = True
    if chat:
        body["messages"] = messages
    else:
        body["prompt"] = prompt
    body.update(extra_body or {})
    url = base_url.rstrip("/") + ("/v1/chat/completions" if chat else "/v1/completions")

    out = StreamedCompletion()
    parts: list[str] = []
    t0 = clock()
    out.send_time_s = t0
    try:
        async with asyncio.timeout(timeout_s):
            async with client.stream("POST", url, json=body, headers=headers) as response:
                if response.status_code != 200:
                    detail = (await response.aread()).decode("utf-8", errors="replace")
                    out.error = f"HTTP {response.status_code}: {detail[:500]}"
                    out.end_time_s = clock() - t0
                    return out
                async for line in response.aiter_lines():
                    if not line.startswith("data:"):
                        continue
                    data = line[5:].strip()
                    if data == "[DONE]":
                        break
                    now = clock() - t0
                    event = json.loads(data)
                    usage = event.get("usage")
                    if usage:
                        out.prompt_tokens = usage.get("prompt_tokens")
                        out.output_tokens = usage.get("completion_tokens")
                    for choice in event.get("choices") or []:
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
    except (httpx.HTTPError, json.JSONDecodeError, OSError) as exc:
        out.error = f"{type(exc).__name__}: {exc}"
    out.end_time_s = clock() - t0
    out.text = "".join(parts)
    return out
