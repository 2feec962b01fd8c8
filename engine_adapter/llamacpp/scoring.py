"""llama-server's scoring dialect (`engine_adapter.scoring`, `FORCED_TOKENS`).

llama-server returns probabilities only for tokens it generates (`echo` is refused), so each scored
position is one request on its native /completion API: the prompt is the text up to that position,
one token is generated, forced to the text's own token by `logit_bias`, and `n_probs` with
`post_sampling_probs: false` returns the top-k of the full distribution before sampling and the
forced token's own probability in it (the bias is a sampler: it never touches the logits those come
from). The server's prompt cache keeps the text's prefix in the slot, so a position costs about one
decode step; texts are scored one per server slot at once. Token ids are sent as ids, never as
text: the GGUF tokenizer splits some texts differently from the Hugging Face one (1 of 84 example
prompts, measured).
"""

from __future__ import annotations

import dataclasses

import httpx

from tracetune.engine_adapter.base import Endpoint
from tracetune.engine_adapter.scoring import FORCED_TOKENS, TOP_K, Scored, post
from tracetune.errors import EngineError
from tracetune.types import JsonDict

# logit_bias that makes a token the only one greedy decoding can pick (llama-server adds it to the logit).
_FORCE_BIAS = 1.0e4
# n_probs asking for every token's probability (llama-server caps it at the vocabulary's size).
_WHOLE_VOCABULARY = 1 << 20


@dataclasses.dataclass(frozen=True)
class ForcedTokens:
    """llama-server's dialect (native /tokenize and /completion): each position one forced token (the module's text)."""

    name: str = FORCED_TOKENS
    about: str = "llama-server, one forced token per position (logit_bias, n_probs of the full distribution)"
    floor_at_once: bool = False  # more texts than slots would evict each other's cached prefixes

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
