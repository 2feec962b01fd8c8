"""The `Engine` contract every adapter implements, and the HTTP parts they share.

An engine is started from a config, becomes healthy, serves OpenAI-compatible streaming
completions, exposes its counters, and stops. Adapters that cannot change the engine's
configuration (an already running endpoint) accept only an empty config.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, Unpack, runtime_checkable

import httpx

from tracetune.engine_adapter.http_stream import Session
from tracetune.engine_adapter.metrics import EngineMetrics, parse_metrics
from tracetune.engine_adapter.openai_client import StreamedCompletion, StreamRequest, stream_completion
from tracetune.errors import EngineError

if TYPE_CHECKING:
    from tracetune.engine_adapter.config import EngineConfig

# Called while an engine starts, with the seconds waited so far.
OnTick = Callable[[float], None]
# What an engine's start spent its time on: seconds per phase ("weights_s", "compile_s", ...) and
# "compile_cache": "hit", "miss" or None.
StartPhases = dict[str, float | str | None]


class NotAModelList(EngineError):
    """`/v1/models` answered, but not with an OpenAI model list: the server is of another kind."""


@dataclasses.dataclass(frozen=True)
class Endpoint:
    """Where a started engine serves: base URL (no `/v1`) and the model name to request."""

    base_url: str
    model: str
    headers: dict[str, str] = dataclasses.field(default_factory=dict, repr=False)


@runtime_checkable
class Engine(Protocol):
    """What the replay harness and the tuner need from an inference engine. Every engine in
    `tracetune.engine_adapter.registry` implements it; tests/engine_adapter/contract.py checks each one."""

    name: str
    endpoint: Endpoint | None  # where it serves, once started
    quality_probe: bool  # scores given tokens teacher-forced, which the quality probe needs
    # How it scores them (`engine_adapter.scoring`): "prompt_logprobs" (one prefill per text, vLLM) or
    # "forced_tokens" (one forced generated token per position, llama-server).
    scoring: str
    managed: bool  # tracetune runs its process (stop() ends it); False: an endpoint it only measures

    def start(self, config: EngineConfig) -> Endpoint:
        """Launch the engine for `config` (returns before it is healthy)."""

    def wait_healthy(self, timeout_s: float, on_tick: OnTick | None = None) -> float:
        """Block until the engine serves; return seconds waited. Raises EngineError."""

    def launch(self, config: EngineConfig, timeout_s: float, on_tick: OnTick | None = None) -> float:
        """start() + wait_healthy(): seconds until it served. Raises EngineError (with the log tail)."""

    def health(self) -> bool:
        """Whether it answers its health check now."""

    def log_tail(self) -> str:
        """The last lines of its log ("" for an engine tracetune did not start)."""

    @property
    def log_path(self) -> Path | None:
        """Its log file (None for an engine tracetune did not start, or before a start)."""

    def start_phases(self) -> StartPhases:
        """What its last start spent its time on, from its log ({} when it does not say)."""

    def exit_code(self) -> int | None:
        """Its process's exit code; None while it runs (or for an engine tracetune did not start)."""

    async def stream(self, session: Session, **request: Unpack[StreamRequest]) -> StreamedCompletion:
        """One streamed completion (see `openai_client.stream_completion` for arguments)."""

    def metrics(self) -> EngineMetrics:
        """A snapshot of the engine's counters."""

    def reset_prefix_cache(self) -> None:
        """Empty the engine's prefix cache so the next phase starts cold."""

    def process_group(self) -> int | None:
        """The process group of its server and everything the server started (None for an engine
        tracetune did not start, or before a start): whose CPU time is the engine's."""

    def stop(self) -> None:
        """Stop the engine and everything it started. Idempotent."""


class HTTPEngine:
    """Shared implementation of the HTTP side of `Engine` for OpenAI-compatible servers."""

    name = "http"
    quality_probe = False
    scoring = "prompt_logprobs"
    managed = False
    health_path = "/health"

    def __init__(self) -> None:
        self.endpoint: Endpoint | None = None

    def start(self, config: EngineConfig) -> Endpoint:
        raise NotImplementedError

    def wait_healthy(self, timeout_s: float, on_tick: OnTick | None = None) -> float:
        raise NotImplementedError

    def launch(self, config: EngineConfig, timeout_s: float = 600.0, on_tick: OnTick | None = None) -> float:
        self.start(config)
        return self.wait_healthy(timeout_s, on_tick=on_tick)

    def health(self) -> bool:
        try:
            return self.get(self.health_path, timeout_s=10).status_code == 200
        except EngineError:
            return False

    def log_tail(self) -> str:
        return ""

    @property
    def log_path(self) -> Path | None:
        return None

    def start_phases(self) -> StartPhases:
        return {}

    def exit_code(self) -> int | None:
        return None

    def process_group(self) -> int | None:
        """Its managed server's process group (`ServerProcess` starts each in a session of its own)."""
        process = getattr(self, "process", None)
        return None if process is None else process.pid

    def _require_endpoint(self) -> Endpoint:
        if self.endpoint is None:
            raise EngineError(f"{self.name} engine is not started; call start() first")
        return self.endpoint

    async def stream(self, session: Session, **request: Unpack[StreamRequest]) -> StreamedCompletion:
        ep = self._require_endpoint()
        headers = {**ep.headers, **(request.get("headers") or {})}
        ask: StreamRequest = {**request, "model": request.get("model", ep.model), "headers": headers or None}
        return await stream_completion(session, ep.base_url, **ask)

    def get(self, path: str, timeout_s: float = 10.0) -> httpx.Response:
        ep = self._require_endpoint()
        try:
            return httpx.get(ep.base_url + path, headers=ep.headers, timeout=timeout_s)
        except httpx.HTTPError as exc:
            raise EngineError(f"GET {ep.base_url}{path} failed: {exc}") from exc

    def metrics(self) -> EngineMetrics:
        response = self.get("/metrics")
        if response.status_code != 200:
            raise EngineError(f"GET /metrics answered HTTP {response.status_code}: {response.text[:300]}")
        return parse_metrics(response.text)

    def reset_prefix_cache(self) -> None:
        ep = self._require_endpoint()
        try:
            response = httpx.post(ep.base_url + "/reset_prefix_cache", headers=ep.headers, timeout=30)
        except httpx.HTTPError as exc:
            raise EngineError(f"POST /reset_prefix_cache failed: {exc}") from exc
        if response.status_code != 200:
            raise EngineError(
                f"POST /reset_prefix_cache answered HTTP {response.status_code}; vLLM serves it only "
                f"with VLLM_SERVER_DEV_MODE=1 in the server's environment"
            )

    def served_models(self) -> list[str]:
        """The models `/v1/models` lists; an EngineError when it fails, `NotAModelList` when it answers
        what is not an OpenAI model list (an HTML page: another kind of server)."""
        response = self.get("/v1/models")
        if response.status_code != 200:
            raise EngineError(f"GET /v1/models answered HTTP {response.status_code}: {response.text[:300]}")
        try:
            listed = response.json().get("data", [])
            return [str(m["id"]) for m in listed]
        except (ValueError, AttributeError, KeyError, TypeError):  # not JSON, or JSON of another shape
            kind = response.headers.get("content-type", "no content type").split(";")[0]
            start = " ".join(response.text[:80].split())
            raise NotAModelList(f"GET /v1/models answered {kind} ({start!r}), not an OpenAI model list "
                                f"({{\"data\": [{{\"id\": ...}}]}})") from None
