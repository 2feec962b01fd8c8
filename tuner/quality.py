"""Output quality of a candidate config against the unquantized reference, on the same prompts.

The reference server generates greedy continuations of a fixed probe set (real prompts from the
trace). Each candidate server then, after its replay:
- scores the reference continuations teacher-forced (`prompt_logprobs`): the mean per-token
  negative log-likelihood delta, candidate minus reference (0 = the same distribution on
  these tokens; > 0 = the candidate finds the reference's text less likely);
- generates its own greedy continuations: agreement with the reference (share of tokens before
  the first divergence) and exact-match rate;
- where the trace has `expected` labels, accuracy (the label appears in the output).
Each comes with a 95% bootstrap interval over probe prompts. Lossless techniques (speculative
decoding, prefix caching) must measure as zero loss.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Sequence

import httpx
import numpy as np

from engine_adapter.base import Endpoint
from engine_adapter.errors import EngineError
from replay.metrics import Estimate, bootstrap_ci
from replay.trace import Trace


@dataclasses.dataclass
class ProbeItem:
    prompt_ids: list[int]
    reference_ids: list[int]
    reference_logprobs: list[float]
    expected: str | None = None

    @property
    def reference_nll(self) -> float:
        return -sum(self.reference_logprobs)


@dataclasses.dataclass
class Reference:
    items: list[ProbeItem]

    def to_json(self) -> list[dict[str, Any]]:
        return [dataclasses.asdict(i) for i in self.items]

    @classmethod
    def from_json(cls, data: list[dict[str, Any]]) -> Reference:
        return cls(items=[ProbeItem(**d) for d in data])


@dataclasses.dataclass
class QualityResult:
    nll_delta_per_token: Estimate
    greedy_agreement: Estimate
    exact_match: float
    accuracy: Estimate | None
    n_prompts: int

    def as_dict(self) -> dict[str, Any]:
        return {
            "nll_delta_per_token": self.nll_delta_per_token.as_dict(),
            "greedy_agreement": self.greedy_agreement.as_dict(),
            "exact_match": self.exact_match,
            "accuracy": self.accuracy.as_dict() if self.accuracy else None,
            "n_prompts": self.n_prompts,
        }


def probe_prompts(trace: Trace, n: int) -> list[tuple[str, str | None]]:
    """Up to `n` distinct real prompts (text, expected label) from the trace, in trace order."""
    seen: set[str] = set()
    out: list[tuple[str, str | None]] = []
    for r in trace.records:
        if r.prompt is not None:
            text = r.prompt
        elif r.messages is not None:
            text = "\n".join(m.content for m in r.messages)
        else:
            continue
        if text in seen or not text.strip():
            continue
        seen.add(text)
        out.append((text, r.expected))
        if len(out) >= n:
            break
    return out


def _complete(client: httpx.Client, endpoint: Endpoint, body: dict[str, Any]) -> dict[str, Any]:
    body = {"model": endpoint.model, "temperature": 0.0, **body}
    try:
        response = client.post(endpoint.base_url + "/v1/completions", json=body, headers=endpoint.headers)
    except httpx.HTTPError as exc:
        raise EngineError(f"quality probe request failed: {exc}") from exc
    if response.status_code != 200:
        raise EngineError(f"quality probe request answered HTTP {response.status_code}: {response.text[:300]}")
    return response.json()["choices"][0]


def _generate(client: httpx.Client, endpoint: Endpoint, prompt: str | list[int], max_tokens: int) -> tuple[list[int], list[int], str]:
    choice = _complete(client, endpoint, {"prompt": prompt, "max_tokens": max_tokens, "return_token_ids": True})
    return choice.get("prompt_token_ids") or [], choice.get("token_ids") or [], choice.get("text", "")


def _score(client: httpx.Client, endpoint: Endpoint, prompt_ids: list[int], continuation: list[int]) -> list[float]:
    """Log-probabilities of `continuation` after `prompt_ids`, teacher-forced."""
    ids = prompt_ids + continuation
    choice = _complete(client, endpoint, {"prompt": ids, "max_tokens": 1, "prompt_logprobs": 0})
    entries = choice.get("prompt_logprobs")
    if not entries or len(entries) != len(ids):
        raise EngineError("the engine did not return prompt_logprobs for every prompt token")
    out = []
    for position, token in zip(range(len(prompt_ids), len(ids)), continuation):
        entry = entries[position] or {}
        info = entry.get(str(token)) or entry.get(token)
        if info is None:
            raise EngineError(f"prompt_logprobs lack the logprob of token {token} at position {position}")
        out.append(float(info["logprob"]))
    return out


def measure_reference(endpoint: Endpoint, prompts: Sequence[tuple[str, str | None]], *, max_tokens: int = 32,
                      max_prompt_tokens: int = 512, timeout_s: float = 300.0) -> Reference:
    """Greedy continuations of the probe prompts on the reference server, with their logprobs."""
    items = []
    with httpx.Client(timeout=timeout_s) as client:
        for text, expected in prompts:
            prompt_ids, _, _ = _generate(client, endpoint, text, 1)
            prompt_ids = prompt_ids[-max_prompt_tokens:]
            _, out_ids, _ = _generate(client, endpoint, prompt_ids, max_tokens)
            if not out_ids:
                continue
            items.append(ProbeItem(prompt_ids=prompt_ids, reference_ids=out_ids,
                                   reference_logprobs=_score(client, endpoint, prompt_ids, out_ids), expected=expected))
    if not items:
        raise EngineError("the reference produced no continuation for any probe prompt")
    return Reference(items=items)


def _agreement(a: Sequence[int], b: Sequence[int]) -> float:
    n = max(len(a), len(b))
    if n == 0:
        return 1.0
    same = 0
    for x, y in zip(a, b):
        if x != y:
            break
        same += 1
    return same / n


def measure_candidate(endpoint: Endpoint, reference: Reference, *, timeout_s: float = 300.0,
                      seed: int = 0) -> QualityResult:
    """Compare the server at `endpoint` with the reference on the reference's probe set."""
    deltas, agreements, exact, correct = [], [], [], []
    with httpx.Client(timeout=timeout_s) as client:
        for item in reference.items:
            logprobs = _score(client, endpoint, item.prompt_ids, item.reference_ids)
            deltas.append((-sum(logprobs) - item.reference_nll) / len(item.reference_ids))
            _, out_ids, text = _generate(client, endpoint, item.prompt_ids, len(item.reference_ids))
            agreements.append(_agreement(out_ids, item.reference_ids))
            exact.append(float(out_ids == item.reference_ids))
            if item.expected is not None:
                correct.append(float(item.expected.strip().lower() in text.lower()))
    return QualityResult(
        nll_delta_per_token=bootstrap_ci(deltas, "mean", seed=seed),
        greedy_agreement=bootstrap_ci(agreements, "mean", seed=seed),
        exact_match=float(np.mean(exact)) if exact else math.nan,
        accuracy=bootstrap_ci(correct, "mean", seed=seed) if correct else None,
        n_prompts=len(deltas),
    )
