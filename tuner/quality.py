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

In the units users judge quantization by (llama.cpp's): per token, the KL divergence from the
reference's next-token distribution to the candidate's (from the top-`TOP_K` log-probabilities both
return at every position of the reference continuation; see `kl_top_k`), the change in perplexity
(exp of the NLL delta, minus 1) and top-1 agreement (the most likely next token is the same).

Noise floor: the same numbers of the reference against itself. After its continuations are fixed,
the reference server scores them again with every probe prompt in one batch (a batch composition
other than the one-at-a-time pass that produced them): the difference is numerical noise of the
platform's kernels, which every candidate carries too. A candidate's loss is reported beyond that
floor as a paired difference over the same prompts, with its interval; `within_floor` says the
candidate cannot be told apart from the reference's own noise.

Judging these results (the gate, the floor's estimates, verdicts, the self-check): `tuner.quality_gate`.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import hashlib
import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from tracetune.engine_adapter.base import Endpoint
from tracetune.errors import EngineError
from tracetune.replay.metrics import Estimate, bootstrap_ci
from tracetune.replay.trace import Trace

# Log-probabilities per position for the KL divergence: vLLM returns at most --max-logprobs (20 by
# default) per position; 20 hold almost all of the mass of a small model's next-token distribution.
TOP_K = 20


@dataclasses.dataclass
class ProbeItem:
    prompt_ids: list[int]
    reference_ids: list[int]
    reference_logprobs: list[float]
    expected: str | None = None
    # Per position of the continuation: the reference's top-k token ids (as strings) -> logprob.
    reference_top: list[dict[str, float]] | None = None

    @property
    def reference_nll(self) -> float:
        return -sum(self.reference_logprobs)


@dataclasses.dataclass
class Reference:
    items: list[ProbeItem]
    # The reference against itself in another batch composition: per-prompt values of each unit
    # ("nll", "kld", "top1"), aligned with `items`. None for studies stored before it existed.
    floor: dict[str, list[float]] | None = None

    def to_json(self) -> dict[str, Any]:
        return {"items": [dataclasses.asdict(i) for i in self.items], "floor": self.floor}

    @classmethod
    def from_json(cls, data: dict[str, Any] | list[dict[str, Any]]) -> Reference:
        if isinstance(data, list):  # stored before the noise floor: the items alone
            return cls(items=[ProbeItem(**d) for d in data])
        return cls(items=[ProbeItem(**d) for d in data["items"]], floor=data.get("floor"))


@dataclasses.dataclass
class QualityResult:
    nll_delta_per_token: Estimate
    greedy_agreement: Estimate
    exact_match: float
    accuracy: Estimate | None
    n_prompts: int
    kld: Estimate | None = None  # nats per token, reference -> candidate, from the top-k
    top1_agreement: Estimate | None = None  # share of positions with the same most likely token
    ppl_change: Estimate | None = None  # perplexity ratio - 1 on the reference continuations
    beyond_floor: dict[str, Estimate] | None = None  # per unit: candidate minus the reference's own noise
    within_floor: bool | None = None  # indistinguishable from the reference's own noise
    top_k: int = 0
    n_tokens: int = 0
    reused_from: int | None = None  # the trial whose measurement this is (same quality key)
    key: str | None = None  # the quality key it was measured under (`quality_key`)
    lossless: bool | None = None  # lossless by construction (`lossless_by_construction`)

    @property
    def probe_noisy(self) -> bool:
        """A configuration that cannot change the output measured beyond the floor: the probe is too
        noisy on this platform to tell such differences apart, the configuration is not to blame."""
        return bool(self.lossless) and self.within_floor is False

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> QualityResult:
        """The inverse of `as_dict` (a stored result, reused by a configuration of the same quality key)."""
        def est(e: dict[str, float] | None) -> Estimate | None:
            return Estimate(e["value"], e["ci_low"], e["ci_high"]) if e else None

        return cls(nll_delta_per_token=est(d["nll_delta_per_token"]), greedy_agreement=est(d["greedy_agreement"]),
                   exact_match=d["exact_match"], accuracy=est(d.get("accuracy")), n_prompts=d["n_prompts"],
                   kld=est(d.get("kld")), top1_agreement=est(d.get("top1_agreement")),
                   ppl_change=est(d.get("ppl_change")),
                   beyond_floor={k: est(v) for k, v in d["beyond_floor"].items()} if d.get("beyond_floor") else None,
                   within_floor=d.get("within_floor"), top_k=d.get("top_k", 0), n_tokens=d.get("n_tokens", 0),
                   reused_from=d.get("reused_from"), key=d.get("key"), lossless=d.get("lossless"))

    def as_dict(self) -> dict[str, Any]:
        optional = {"kld": self.kld, "top1_agreement": self.top1_agreement, "ppl_change": self.ppl_change}
        return {
            "nll_delta_per_token": self.nll_delta_per_token.as_dict(),
            "greedy_agreement": self.greedy_agreement.as_dict(),
            "exact_match": self.exact_match,
            "accuracy": self.accuracy.as_dict() if self.accuracy else None,
            "n_prompts": self.n_prompts,
            **{k: v.as_dict() if v is not None else None for k, v in optional.items()},
            "beyond_floor": {k: v.as_dict() for k, v in self.beyond_floor.items()} if self.beyond_floor else None,
            "within_floor": self.within_floor, "top_k": self.top_k, "n_tokens": self.n_tokens,
            "reused_from": self.reused_from, "key": self.key,
            "lossless": self.lossless, "probe_noisy": self.probe_noisy,
        }


# What a configuration's output quality depends on: the weights and their precision, the KV cache's
# precision, the attention kernels and the decoding path (speculation). Batching, caching and
# scheduling knobs change when a token is computed, not which one: configurations that differ only in
# those share one quality measurement (their differences are the platform's noise, which the floor
# measures); so does tensor parallelism (the same matmuls split across GPUs: another rounding order).
# Unknown engine arguments are counted in, to be safe.
QUALITY_SETTINGS = ("model", "dtype", "quantization", "kv_cache_dtype", "speculative", "attention_backend",
                    "load_format", "extra_args")


# Settings that cannot change the output distribution by construction: speculative decoding verifies
# every draft token against the target model, which keeps the target's distribution.
LOSSLESS_SETTINGS = ("speculative",)


def _quality_settings(config_json: dict[str, Any], settings: Sequence[str] = QUALITY_SETTINGS) -> dict[str, Any]:
    """The settings a configuration's quality depends on, each as it takes effect: the model named by
    its directory (as `config_key`), "auto" the same as unset (vLLM's default), no speculation the
    same whatever its unused draft length."""
    ident = {k: None if config_json.get(k) == "auto" else config_json.get(k) for k in settings}
    ident["model"] = Path(str(ident["model"] or "")).name
    spec = ident.get("speculative")
    if isinstance(spec, dict) and spec.get("method", "none") == "none":
        ident["speculative"] = {"method": "none"}
    return ident


def quality_key(config_json: dict[str, Any]) -> str:
    """Identity of a configuration's quality."""
    ident = _quality_settings(config_json)
    return "quality:" + hashlib.sha256(json.dumps(ident, sort_keys=True, default=str).encode()).hexdigest()[:40]


def lossless_by_construction(config_json: dict[str, Any], reference_json: dict[str, Any]) -> bool:
    """The configuration has the reference's weights, precisions and kernels, and differs from it at
    most in batching, caching, scheduling and speculation: it must measure within the noise floor."""
    settings = [k for k in QUALITY_SETTINGS if k not in LOSSLESS_SETTINGS]
    return _quality_settings(config_json, settings) == _quality_settings(reference_json, settings)


def probe_prompts(trace: Trace, n: int) -> list[tuple[str, str | None]]:
    """`n` distinct real prompts (text, expected label) from the whole trace, across its length mix:
    the distinct prompts ordered by length, and `n` taken at evenly spaced ranks (the shortest and the
    longest included), so a trace of short chats with a tail of long documents is probed on both.
    Prompts with an `expected` label are preferred at equal rank spacing (they add an accuracy score).
    Returned in trace order."""
    seen: dict[str, tuple[int, str | None]] = {}
    for position, r in enumerate(trace.records):
        if r.prompt is not None:
            text = r.prompt
        elif r.messages is not None:
            text = "\n".join(m.content for m in r.messages)
        else:
            continue
        if text.strip() and text not in seen:
            seen[text] = (position, r.expected)
    if len(seen) <= n:
        chosen = list(seen)
    else:
        by_length = sorted(seen, key=lambda t: (len(t), seen[t][0]))
        ranks = sorted({round(i * (len(by_length) - 1) / (n - 1)) for i in range(n)}) if n > 1 else [0]
        chosen = [_labelled_near(by_length, rank, seen) for rank in ranks]
    chosen = sorted(set(chosen), key=lambda t: seen[t][0])
    return [(text, seen[text][1]) for text in chosen]


def _labelled_near(by_length: list[str], rank: int, seen: dict[str, tuple[int, str | None]], reach: int = 2) -> str:
    """The prompt at `rank`, or a labelled one within `reach` ranks of it."""
    for offset in (0, *[d for k in range(1, reach + 1) for d in (k, -k)]):
        i = rank + offset
        if 0 <= i < len(by_length) and seen[by_length[i]][1] is not None:
            return by_length[i]
    return by_length[rank]


def _complete(client: httpx.Client, endpoint: Endpoint, body: dict[str, Any]) -> dict[str, Any]:
    body = {"model": endpoint.model, "temperature": 0.0, **body}
    try:
        response = client.post(endpoint.base_url + "/v1/completions", json=body, headers=endpoint.headers)
    except httpx.HTTPError as exc:
        raise EngineError(f"quality probe request failed: {exc}") from exc
    if response.status_code != 200:
        raise EngineError(f"quality probe request answered HTTP {response.status_code}: {response.text[:300]}")
    return response.json()["choices"][0]


def _generate(client: httpx.Client, endpoint: Endpoint, prompt: str | list[int],
              max_tokens: int) -> tuple[list[int], list[int], str]:
    choice = _complete(client, endpoint, {"prompt": prompt, "max_tokens": max_tokens, "return_token_ids": True})
    return choice.get("prompt_token_ids") or [], choice.get("token_ids") or [], choice.get("text", "")


def _score(client: httpx.Client, endpoint: Endpoint, prompt_ids: list[int], continuation: list[int],
           top_k: int = TOP_K) -> tuple[list[float], list[dict[str, float]]]:
    """Log-probabilities of `continuation` after `prompt_ids`, teacher-forced, and at each of its
    positions the engine's top-`top_k` (token id as a string -> logprob)."""
    ids = prompt_ids + continuation
    choice = _complete(client, endpoint, {"prompt": ids, "max_tokens": 1, "prompt_logprobs": top_k})
    entries = choice.get("prompt_logprobs")
    if not entries or len(entries) != len(ids):
        raise EngineError("the engine did not return prompt_logprobs for every prompt token")
    chosen, tops = [], []
    for position, token in zip(range(len(prompt_ids), len(ids)), continuation):
        entry = entries[position] or {}
        info = entry.get(str(token)) or entry.get(token)
        if info is None:
            raise EngineError(f"prompt_logprobs lack the logprob of token {token} at position {position}")
        chosen.append(float(info["logprob"]))
        tops.append({str(t): float(v["logprob"]) for t, v in entry.items()})
    return chosen, tops


def kl_top_k(p: dict[str, float], q: dict[str, float]) -> float:
    """KL(P || Q) in nats from two top-k log-probability maps of one position. The mass outside P's
    top-k is one more outcome ("the rest"). A token of P's top-k missing from Q's is given Q's
    remaining mass spread over the missing ones, at most Q's smallest listed probability: the usual
    top-k approximation, exact when both lists hold all the mass that matters."""
    pp = {t: math.exp(v) for t, v in p.items()}
    qq = {t: math.exp(v) for t, v in q.items()}
    rest_p = max(1.0 - sum(pp.values()), 0.0)
    rest_q = max(1.0 - sum(qq.values()), 0.0)
    missing = [t for t in pp if t not in qq]
    fill = min(min(qq.values(), default=1.0), rest_q / len(missing)) if missing else 0.0
    fill = max(fill, 1e-10)
    kl = sum(v * (math.log(v) - math.log(qq.get(t, fill))) for t, v in pp.items() if v > 0)
    if rest_p > 1e-9:
        kl += rest_p * (math.log(rest_p) - math.log(max(rest_q - fill * len(missing), 1e-10)))
    return max(kl, 0.0)


def _top1(top: dict[str, float]) -> str:
    return max(top, key=top.get)


def item_stats(item: ProbeItem, logprobs: Sequence[float], tops: Sequence[dict[str, float]]) -> dict[str, float]:
    """One probe prompt's units against the reference: NLL delta per token, and where both sides have
    top-k maps, mean KL divergence and top-1 agreement per position."""
    n = len(item.reference_ids)
    out = {"nll": (-sum(logprobs) - item.reference_nll) / n}
    if item.reference_top and tops:
        pairs = list(zip(item.reference_top, tops))
        out["kld"] = sum(kl_top_k(p, q) for p, q in pairs) / len(pairs)
        out["top1"] = sum(_top1(p) == _top1(q) for p, q in pairs) / len(pairs)
    return out


def _columns(rows: Sequence[dict[str, float]]) -> dict[str, list[float]]:
    keys = set.intersection(*(set(r) for r in rows)) if rows else set()
    return {k: [r[k] for r in rows] for k in sorted(keys)}


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
            chosen, tops = _score(client, endpoint, prompt_ids, out_ids)
            items.append(ProbeItem(prompt_ids=prompt_ids, reference_ids=out_ids, reference_logprobs=chosen,
                                   expected=expected, reference_top=tops))
    if not items:
        raise EngineError("the reference produced no continuation for any probe prompt")
    reference = Reference(items=items)
    reference.floor = measure_floor(endpoint, reference, timeout_s=timeout_s)
    return reference


def measure_floor(endpoint: Endpoint, reference: Reference, *, timeout_s: float = 300.0) -> dict[str, list[float]]:
    """The reference server scores its own continuations again, every probe prompt at once (other
    batch shapes than the one-at-a-time pass that made them): per-prompt units of that difference."""
    def one(item: ProbeItem) -> dict[str, float]:
        with httpx.Client(timeout=timeout_s) as client:
            return item_stats(item, *_score(client, endpoint, item.prompt_ids, item.reference_ids))

    with concurrent.futures.ThreadPoolExecutor(max_workers=max(len(reference.items), 1)) as pool:
        return _columns(list(pool.map(one, reference.items)))


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
    rows, agreements, exact, correct = [], [], [], []
    with httpx.Client(timeout=timeout_s) as client:
        for item in reference.items:
            rows.append(item_stats(item, *_score(client, endpoint, item.prompt_ids, item.reference_ids)))
            _, out_ids, text = _generate(client, endpoint, item.prompt_ids, len(item.reference_ids))
            agreements.append(_agreement(out_ids, item.reference_ids))
            exact.append(float(out_ids == item.reference_ids))
            if item.expected is not None:
                correct.append(float(item.expected.strip().lower() in text.lower()))
    return summarize_quality(reference, _columns(rows), agreements, exact, correct, seed=seed)


def summarize_quality(reference: Reference, units: dict[str, list[float]], agreements: Sequence[float],
                      exact: Sequence[float], correct: Sequence[float], *, seed: int = 0) -> QualityResult:
    """Per-prompt units -> estimates with intervals over prompts, and the verdict against the floor."""
    nll = bootstrap_ci(units["nll"], "mean", seed=seed)
    ppl = Estimate(math.expm1(nll.value), math.expm1(nll.low), math.expm1(nll.high))
    beyond = within = None
    if reference.floor:
        shared = [k for k in ("kld", "nll") if k in units and len(reference.floor.get(k, [])) == len(units[k])]
        beyond = {k: bootstrap_ci([c - f for c, f in zip(units[k], reference.floor[k])], "mean", seed=seed)
                  for k in shared}
        if shared:
            # Within the floor: the paired difference's interval reaches zero (or below) in the first unit
            # measured (KL divergence where the engine returned top-k log-probabilities).
            within = beyond[shared[0]].low <= 0.0
    return QualityResult(
        nll_delta_per_token=nll,
        greedy_agreement=bootstrap_ci(agreements, "mean", seed=seed),
        exact_match=float(np.mean(exact)) if exact else math.nan,
        accuracy=bootstrap_ci(correct, "mean", seed=seed) if correct else None,
        n_prompts=len(units["nll"]),
        kld=bootstrap_ci(units["kld"], "mean", seed=seed) if "kld" in units else None,
        top1_agreement=bootstrap_ci(units["top1"], "mean", seed=seed) if "top1" in units else None,
        ppl_change=ppl, beyond_floor=beyond, within_floor=within, top_k=TOP_K if "kld" in units else 0,
        n_tokens=sum(len(i.reference_ids) for i in reference.items),
    )
