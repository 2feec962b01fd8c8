"""An already running OpenAI-compatible endpoint as an `Engine`.

tracetune cannot change such an engine's configuration: it only measures it. `start()` takes an
`OpenAIEndpointConfig` naming where it is; `stop()` leaves it running. The API key is read from
an environment variable at use time and never stored in a config, a study or an export.
"""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict, Field, field_validator

from tracetune.engine_adapter.base import Endpoint, HTTPEngine, NotAModelList
from tracetune.errors import EngineError, EngineTimeoutError, InputError

if TYPE_CHECKING:
    from tracetune.engine_adapter.base import OnTick
    from tracetune.engine_adapter.config import EngineConfig


class OpenAIEndpointConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    base_url: str = Field(description="Server root, e.g. http://127.0.0.1:8000 (a trailing /v1 is removed).")
    model: str | None = Field(None, description="Model name to request; default: the first one the server lists.")
    api_key_env: str | None = Field(None, description="Name of the environment variable holding the API key.")

    @field_validator("base_url")
    @classmethod
    def _url(cls, value: str) -> str:
        if not value.startswith(("http://", "https://")):
            raise ValueError(f"must start with http:// or https://, got {value!r}")
        value = value.rstrip("/")
        return value[: -len("/v1")] if value.endswith("/v1") else value

    def gpus(self) -> int:
        """An endpoint's accelerators are not tracetune's to know: counted as one."""
        return 1

    def speculation(self) -> str:
        """Whether a running endpoint speculates is not tracetune's to know: "none"."""
        return "none"


class OpenAIEndpoint(HTTPEngine):
    name = "openai"
    health_path = "/v1/models"  # what every OpenAI-compatible server answers

    def __init__(self) -> None:
        super().__init__()
        self.config: OpenAIEndpointConfig | None = None

    def start(self, config: EngineConfig) -> Endpoint:
        if not isinstance(config, OpenAIEndpointConfig):
            raise TypeError(f"an OpenAI endpoint was handed {type(config).__name__}, another engine's settings")
        headers = {}
        if config.api_key_env:
            key = os.environ.get(config.api_key_env)
            if not key:
                raise EngineError(f"environment variable {config.api_key_env} (the API key) is not set")
            headers["Authorization"] = f"Bearer {key}"
        self.config = config
        self.endpoint = Endpoint(base_url=config.base_url, model=config.model or "", headers=headers)
        return self.endpoint

    def wait_healthy(self, timeout_s: float = 60.0, on_tick: OnTick | None = None) -> float:
        """Wait until `/v1/models` answers; pick the model if none was named. An answer that is not an
        OpenAI model list (an HTML page) is an InputError at once."""
        ep = self._require_endpoint()
        t0 = time.perf_counter()
        last_error = ""
        while time.perf_counter() - t0 < timeout_s:
            try:
                models = self.served_models()
                if not ep.model:
                    if not models:
                        raise EngineError(f"{ep.base_url} serves no model")
                    self.endpoint = Endpoint(ep.base_url, models[0], ep.headers)
                return time.perf_counter() - t0
            except NotAModelList as exc:  # a server that answers, as another kind: waiting will not change it
                raise InputError(f"--endpoint {ep.base_url}: {exc}; name an OpenAI-compatible server") from None
            except EngineError as exc:
                last_error = str(exc)
            if on_tick:
                on_tick(time.perf_counter() - t0)
            time.sleep(0.5)
        raise EngineTimeoutError(f"{ep.base_url} did not answer /v1/models within {timeout_s:.0f}s: {last_error}")

    def stop(self) -> None:
        """Nothing to stop: the endpoint is not ours."""
