"""How a server scores given tokens teacher-forced: what the quality probe (`quality.probe`) asks of
an engine, and the HTTP dialects engines speak for it.

The probe's units need, at every scored position of a text, the log-probability of the text's own
next token and the server's top-`TOP_K` (token id -> log-probability) of the full next-token
distribution. A running engine names its dialect (`Engine.scoring`); each dialect lives with the
engine that speaks it, and `engine_adapter.registry.scorer` finds it by that name:

- `PROMPT_LOGPROBS` (`engine_adapter.vllm.scoring`): the OpenAI completions API with
  `prompt_logprobs`; one prefill per text returns every position at once. The simulated engine
  speaks it too.
- `FORCED_TOKENS` (`engine_adapter.llamacpp.scoring`): one forced token per position on the
  server's native /completion API, for a server that returns probabilities only for the tokens it
  generates.
"""

from __future__ import annotations

from typing import Protocol

import httpx

from tracetune.engine_adapter.base import Endpoint
from tracetune.errors import EngineError
from tracetune.types import JsonDict

# Log-probabilities per position for the KL divergence: an engine may cap them (vLLM returns at most
# --max-logprobs, 20 by default, per position); 20 hold almost all of the mass of a small model's
# next-token distribution.
TOP_K = 20
PROMPT_LOGPROBS = "prompt_logprobs"
FORCED_TOKENS = "forced_tokens"

Scored = tuple[list[float], list[dict[str, float]]]


class Scorer(Protocol):
    """One dialect: how to tokenize, sample and score teacher-forced on a running server."""

    @property
    def name(self) -> str: ...  # the dialect's name, stored with every quality result

    @property
    def about(self) -> str: ...  # the dialect in words

    @property
    def floor_at_once(self) -> bool: ...  # the noise floor's pass scores every text at once (else one per slot)

    def tokens(self, client: httpx.Client, endpoint: Endpoint, text: str) -> list[int]: ...

    def sample(self, client: httpx.Client, endpoint: Endpoint, ids: list[int], max_tokens: int,
               temperature: float) -> list[int]: ...

    def score(self, client: httpx.Client, endpoint: Endpoint, ids: list[int], start: int,
              top_k: int = TOP_K, slot: int | None = None) -> Scored: ...

    def parallel(self, client: httpx.Client, endpoint: Endpoint) -> int: ...


def post(client: httpx.Client, endpoint: Endpoint, path: str, body: JsonDict) -> JsonDict:
    """One JSON request to the server; its failures as EngineError."""
    try:
        response = client.post(endpoint.base_url + path, json=body, headers=endpoint.headers)
    except httpx.HTTPError as exc:
        raise EngineError(f"quality probe request failed: {exc}") from exc
    if response.status_code != 200:
        raise EngineError(f"quality probe request answered HTTP {response.status_code}: {response.text[:300]}")
    data: JsonDict = response.json()
    return data


def complete(client: httpx.Client, endpoint: Endpoint, body: JsonDict) -> JsonDict:
    """One OpenAI completion (greedy unless the body says otherwise): its first choice."""
    choice: JsonDict = post(client, endpoint, "/v1/completions",
                            {"model": endpoint.model, "temperature": 0.0, **body})["choices"][0]
    return choice
