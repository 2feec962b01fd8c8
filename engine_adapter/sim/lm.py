"""The simulated engine's language model: deterministic, so that its quality loss is a known number.

Tokens are a text's UTF-8 bytes (ids 0-255). Its continuations are pseudo-random printable text
seeded by the prompt's tokens (the same prompt, the same continuation, whatever the temperature).
Teacher-forced, position i's next-token distribution in bf16 (the reference) gives the text's own
token a probability p between 0.2 and 0.8 and spreads the rest over 19 other tokens (the top-20
vLLM returns) but for a tail of `REST`, all drawn from a hash of the previous token and i. A
precision that loses `loss_nats` a token multiplies every listed token's probability by
exp(-loss_nats) and gives the tail what they lose (the ranking is kept): every scored token's
log-probability is lower by exactly `loss_nats`, so the quality probe's NLL increase is
`loss_nats`, its perplexity change exp(loss_nats) - 1, its KL divergence a little under
`loss_nats` (as a real model's is near its NLL increase on text it samples), and the reference
scored twice differs by nothing (a zero noise floor)."""

from __future__ import annotations

import math
from collections.abc import Sequence

VOCABULARY = 256
TOP = 20  # tokens listed at each position (the text's own and 19 others)
REST = 1e-4  # the probability outside the listed tokens, in bf16
_MASK = (1 << 64) - 1
_PRINTABLE = bytes(range(32, 127)) + b"\n"

# One position's listed tokens: token id -> log-probability.
Distribution = dict[int, float]


def _mix(*parts: int) -> int:
    """A 64-bit hash of whole numbers (splitmix64 over each)."""
    h = 0x9E3779B97F4A7C15
    for part in parts:
        h = (h ^ (part & _MASK)) * 0xBF58476D1CE4E5B9 & _MASK
        h = (h ^ (h >> 31)) * 0x94D049BB133111EB & _MASK
        h ^= h >> 29
    return h


def _unit(*parts: int) -> float:
    """A number in [0, 1) drawn from `parts`."""
    return _mix(*parts) / float(1 << 64)


def tokenize(text: str) -> list[int]:
    return list(text.encode("utf-8"))


def detokenize(ids: Sequence[int]) -> str:
    return bytes(i % VOCABULARY for i in ids).decode("utf-8", "replace")


def continuation(prompt: Sequence[int], n: int) -> list[int]:
    """The `n` tokens the engine answers `prompt` with: printable text seeded by the prompt."""
    seed = _mix(len(prompt), *prompt[-64:])
    return [_PRINTABLE[_mix(seed, i) % len(_PRINTABLE)] for i in range(n)]


def distribution(previous: int, position: int, token: int, loss_nats: float) -> Distribution:
    """The listed tokens' log-probabilities at `position` of a text whose token there is `token`
    (the module's docstring)."""
    p = 0.2 + 0.6 * _unit(previous, position, token)
    others: list[int] = []
    draw = 0
    while len(others) < TOP - 1:
        other = _mix(previous, position, draw) % VOCABULARY
        draw += 1
        if other != token and other not in others:
            others.append(other)
    weights = [0.6 ** j for j in range(len(others))]
    share = (1.0 - REST - p) / sum(weights)
    out = {token: math.log(p) - loss_nats}
    out.update({other: math.log(w * share) - loss_nats for other, w in zip(others, weights)})
    return out


def prompt_logprobs(ids: Sequence[int], top_k: int, loss_nats: float) -> list[dict[str, dict[str, object]] | None]:
    """vLLM's `prompt_logprobs` of `ids` teacher-forced: None at the first position, then at each the
    text's own token and the `top_k` most likely (token id as text -> logprob, rank, decoded token)."""
    out: list[dict[str, dict[str, object]] | None] = [None]
    for i in range(1, len(ids)):
        dist = distribution(ids[i - 1], i, ids[i], loss_nats)
        ranked = sorted(dist, key=lambda t: -dist[t])
        listed = {t: rank for rank, t in enumerate(ranked, 1) if rank <= top_k or t == ids[i]}
        out.append({str(t): {"logprob": dist[t], "rank": rank, "decoded_token": detokenize([t])}
                    for t, rank in listed.items()})
    return out
