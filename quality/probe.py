"""Output quality of a candidate config against the unquantized reference, on the same texts.

The probe is a set of long texts: real prompts from the trace (their last `max_prompt_tokens`
tokens), each followed by a continuation the reference server samples (temperature 1: text the
model itself writes, not a greedy loop; sampled once and stored with the reference). Every token of
every text after the first is scored teacher-forced (`prompt_logprobs`: one prefill per text, no
generation; llama-server, which returns no prompt log-probabilities, scores each position as one
forced token: `engine_adapter.scoring`), on the reference once and on each candidate after its replay, so
the comparison is paired per token:
- the mean per-token negative log-likelihood delta, candidate minus reference (0 = the same
  distribution on these tokens; > 0 = the candidate finds the text less likely);
- where the trace has `expected` labels, accuracy (the label appears in a short greedy answer).
Intervals (95%, bootstrap) are over chunks of about `CHUNK_TOKENS` consecutive scored tokens, not
over tokens: neighbouring tokens' deltas are correlated, chunks of that length much less (measured
on the bundled model: the interval stops widening past ~128 tokens). Lossless techniques
(speculative decoding, prefix caching) must measure as zero loss.

In the units users judge quantization by (llama.cpp's): per token, the KL divergence from the
reference's next-token distribution to the candidate's (from the top-`TOP_K` log-probabilities both
return at every position of the reference continuation; see `kl_top_k`), the change in perplexity
(exp of the NLL delta, minus 1) and top-1 agreement (the most likely next token is the same).

Noise floor: the same numbers of the reference against itself. After its continuations are fixed,
the reference server scores them again with every probe prompt in one batch (a batch composition
other than the one-at-a-time pass that produced them): the difference is numerical noise of the
platform's kernels, which every candidate carries too. A candidate's loss is reported beyond that
floor as a paired difference over the same prompts, with its interval; `within_floor` says the
candidate cannot be told apart from the reference's own noise, or exceeds it by less than matters
(`NEGLIGIBLE_EXCESS`).

Judging these results (the gate, the floor's estimates, verdicts, the self-check): `quality.gate`.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import math
import queue
from collections.abc import Callable, Sequence
from typing import TypedDict, TypeVar

import httpx
import numpy as np

from tracetune.engine_adapter.base import Endpoint
from tracetune.engine_adapter.registry import scorer
from tracetune.engine_adapter.scoring import PROMPT_LOGPROBS, TOP_K, Scored, Scorer, complete
from tracetune.errors import EngineError
from tracetune.quality.identity import (  # noqa: F401 (their home before identity.py)
    LOSSLESS_SETTINGS,
    QUALITY_SETTINGS,
    lossless_by_construction,
    quality_key,
)
from tracetune.replay.metrics import Estimate, StoredEstimate, bootstrap_ci
from tracetune.replay.trace import Trace
from tracetune.stored import Record
from tracetune.types import JsonDict

_Item = TypeVar("_Item")
_Out = TypeVar("_Out")

# Scored tokens per interval unit (see the module docstring).
CHUNK_TOKENS = 128
# The reference's continuations are sampled at this temperature (once: they are stored).
SAMPLE_TEMPERATURE = 1.0
# A labelled prompt's greedy answer, for accuracy: at most this many tokens.
ANSWER_TOKENS = 64


@dataclasses.dataclass
class ProbeItem:
    prompt_ids: list[int]
    reference_ids: list[int]
    reference_logprobs: list[float]
    expected: str | None = None
    # Per scored position: the reference's top-k token ids (as strings) -> logprob.
    reference_top: list[dict[str, float]] | None = None
    # First scored position of prompt + continuation (1: every token after the first). None: a
    # probe stored before long texts, which scored the continuation alone.
    scored_from: int | None = None

    @property
    def ids(self) -> list[int]:
        return self.prompt_ids + self.reference_ids

    @property
    def start(self) -> int:
        return len(self.prompt_ids) if self.scored_from is None else self.scored_from

    @property
    def reference_nll(self) -> float:
        return -sum(self.reference_logprobs)


@dataclasses.dataclass
class Reference(Record[JsonDict]):
    """The reference's probe texts and its noise floor, stored with the study (`as_dict`)."""

    items: list[ProbeItem]
    # The reference against itself in another batch composition: per-prompt values of each unit
    # ("nll", "kld", "top1"), aligned with `items`. None for studies stored before it existed.
    floor: dict[str, list[float]] | None = None

    @classmethod
    def from_json(cls, data: JsonDict | list[JsonDict]) -> Reference:
        """As `as_dict` stored it; a study stored before the noise floor stored the items alone (a list)."""
        return cls.from_dict({"items": data} if isinstance(data, list) else data)


class StoredQuality(TypedDict, total=False):
    """A `QualityResult` as stored (`QualityResult.as_dict`); an older study stored a subset of it."""

    nll_delta_per_token: StoredEstimate
    greedy_agreement: StoredEstimate | None
    exact_match: float | None
    accuracy: StoredEstimate | None
    n_prompts: int
    kld: StoredEstimate | None
    top1_agreement: StoredEstimate | None
    ppl_change: StoredEstimate | None
    beyond_floor: dict[str, StoredEstimate] | None
    within_floor: bool | None
    top_k: int
    n_tokens: int
    reused_from: int | None
    key: str | None
    lossless: bool | None
    probe_noisy: bool
    scorer: str | None


@dataclasses.dataclass
class QualityResult(Record[StoredQuality]):
    """A candidate's quality against the reference; stored as `StoredQuality` (`probe_noisy` derived),
    what an older study did not store read as its default."""

    nll_delta_per_token: Estimate = dataclasses.field(default_factory=Estimate)
    greedy_agreement: Estimate | None = None  # probes stored before long texts: greedy continuations' agreement
    exact_match: float | None = None  # the same probes: share of identical greedy continuations
    accuracy: Estimate | None = None
    n_prompts: int = 0
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
    scorer: str | None = None  # the server's dialect (`engine_adapter.scoring`); None: stored before it was named

    stored_order = tuple(StoredQuality.__annotations__)  # `probe_noisy` before `scorer`, as results were stored

    def __post_init__(self) -> None:
        self.beyond_floor = self.beyond_floor or None  # no unit beyond the floor: stored as none

    @property
    def probe_noisy(self) -> bool:
        """A configuration that cannot change the output measured beyond the floor: the probe is too
        noisy on this platform to tell such differences apart, the configuration is not to blame."""
        return bool(self.lossless) and self.within_floor is False

    def derived(self) -> dict[str, object]:
        return {"probe_noisy": self.probe_noisy}


def probe_prompts(trace: Trace, n: int) -> list[tuple[str, str | None]]:
    """`n` real prompts (text, expected label) from the whole trace, across its length mix: the
    distinct prompts ordered by length, and `n` taken at evenly spaced ranks (the shortest and the
    longest included), so a trace of short chats with a tail of long documents is probed on both.
    Prompts with an `expected` label are preferred at equal rank spacing (they add an accuracy score).
    In trace order; a trace with fewer than `n` distinct prompts has them repeated in that order
    (each repeat gets its own sampled continuation)."""
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
    distinct = [(text, seen[text][1]) for text in chosen]
    return [distinct[i % len(distinct)] for i in range(n)] if distinct else []


def _labelled_near(by_length: list[str], rank: int, seen: dict[str, tuple[int, str | None]], reach: int = 2) -> str:
    """The prompt at `rank`, or a labelled one within `reach` ranks of it."""
    for offset in (0, *[d for k in range(1, reach + 1) for d in (k, -k)]):
        i = rank + offset
        if 0 <= i < len(by_length) and seen[by_length[i]][1] is not None:
            return by_length[i]
    return by_length[rank]


def _generate(client: httpx.Client, endpoint: Endpoint, prompt: str | list[int],
              max_tokens: int) -> tuple[list[int], list[int], str]:
    choice = complete(client, endpoint, {"prompt": prompt, "max_tokens": max_tokens, "return_token_ids": True})
    return choice.get("prompt_token_ids") or [], choice.get("token_ids") or [], choice.get("text", "")


def _score(client: httpx.Client, endpoint: Endpoint, ids: list[int], start: int,
           top_k: int = TOP_K) -> tuple[list[float], list[dict[str, float]]]:
    """The prompt_logprobs dialect's scoring of `ids[start:]` (`engine_adapter.scoring`), kept for the benchmarks."""
    return scorer(PROMPT_LOGPROBS).score(client, endpoint, ids, start, top_k)


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
    return max(top, key=lambda token: top[token])


def chunk_bounds(n: int, size: int = CHUNK_TOKENS) -> list[tuple[int, int]]:
    """`n` scored positions cut into near-equal chunks of about `size` (one chunk when n < 1.5 size)."""
    k = max(1, round(n / size))
    edges = [round(i * n / k) for i in range(k + 1)]
    return list(zip(edges, edges[1:]))


def item_stats(item: ProbeItem, logprobs: Sequence[float],
               tops: Sequence[dict[str, float]]) -> list[dict[str, float]]:
    """One probe text's units against the reference, per chunk of its scored tokens (`chunk_bounds`):
    NLL delta per token, and where both sides have top-k maps, mean KL divergence and top-1 agreement."""
    rows = []
    for a, b in chunk_bounds(len(item.reference_logprobs)):
        row = {"nll": (sum(item.reference_logprobs[a:b]) - sum(logprobs[a:b])) / (b - a)}
        if item.reference_top and tops:
            pairs = list(zip(item.reference_top[a:b], tops[a:b]))
            row["kld"] = sum(kl_top_k(p, q) for p, q in pairs) / len(pairs)
            row["top1"] = sum(_top1(p) == _top1(q) for p, q in pairs) / len(pairs)
        rows.append(row)
    return rows


def _columns(rows: Sequence[dict[str, float]]) -> dict[str, list[float]]:
    keys = set.intersection(*(set(r) for r in rows)) if rows else set()
    return {k: [r[k] for r in rows] for k in sorted(keys)}


def _each(items: Sequence[_Item], work: Callable[[httpx.Client, _Item], _Out], timeout_s: float,
          workers: int = 64) -> list[_Out]:
    """`work(client, item)` for every item, `workers` at once (one client each; the engine batches
    them), results in the items' order."""
    def one(item: _Item) -> _Out:
        with httpx.Client(timeout=timeout_s) as client:
            return work(client, item)

    with concurrent.futures.ThreadPoolExecutor(max_workers=max(min(len(items), workers), 1)) as pool:
        return list(pool.map(one, items))


def _score_all(endpoint: Endpoint, score: Scorer, items: Sequence[ProbeItem], timeout_s: float,
               workers: int | None = None) -> list[Scored]:
    """Every item's scores, `workers` texts at once (default: `Scorer.parallel`), each text on one
    server slot of its own from start to end (a slot shared between two texts would lose each one's
    cached prefix; engines without slots ignore it). In the items' order."""
    if workers is None:
        with httpx.Client(timeout=timeout_s) as client:
            workers = score.parallel(client, endpoint)
    free: queue.Queue[int] = queue.Queue()
    for slot in range(workers):
        free.put(slot)

    def one(client: httpx.Client, item: ProbeItem) -> Scored:
        slot = free.get()
        try:
            return score.score(client, endpoint, item.ids, item.start, slot=slot)
        finally:
            free.put(slot)

    return _each(items, one, timeout_s, workers)


def measure_reference(endpoint: Endpoint, prompts: Sequence[tuple[str, str | None]], *, max_tokens: int = 512,
                      max_prompt_tokens: int = 1024, timeout_s: float = 600.0,
                      scoring: str = PROMPT_LOGPROBS) -> Reference:
    """The probe texts (each prompt's last `max_prompt_tokens` tokens + a continuation of up to
    `max_tokens` the reference samples), scored on the reference (one text at a time; with forced
    tokens one per server slot), then its noise floor. The texts are stored with the reference:
    every candidate scores the same ones. `scoring`: the server's dialect (`engine_adapter.scoring`)."""
    score = scorer(scoring)

    def tokens(client: httpx.Client, text: str) -> list[int]:
        return score.tokens(client, endpoint, text)[-max_prompt_tokens:]

    def sample(client: httpx.Client, ids: list[int]) -> list[int]:
        return score.sample(client, endpoint, ids, max_tokens, SAMPLE_TEMPERATURE)

    prompt_ids = _each([text for text, _ in prompts], tokens, timeout_s)
    continuations = _each(prompt_ids, sample, timeout_s)
    texts, seen = [], set()
    for (prompt, expected), ids, out_ids in zip(prompts, prompt_ids, continuations):
        # A prompt's tokens are scored once: a repeated prompt adds its new continuation only.
        start = 1 if prompt not in seen else len(ids)
        seen.add(prompt)
        if len(ids) + len(out_ids) - start >= 1:
            texts.append(ProbeItem(prompt_ids=ids, reference_ids=out_ids, reference_logprobs=[],
                                   expected=expected if start == 1 else None, scored_from=start))
    if not texts:
        raise EngineError("the reference returned no tokens for any probe prompt")

    reference = Reference(items=[dataclasses.replace(item, reference_logprobs=chosen, reference_top=tops)
                                 for item, (chosen, tops) in zip(texts, _score_all(endpoint, score, texts, timeout_s))])
    reference.floor = measure_floor(endpoint, reference, timeout_s=timeout_s, scoring=scoring)
    return reference


def _rows(items: Sequence[ProbeItem], scored: Sequence[Scored]) -> dict[str, list[float]]:
    """Per-chunk units of scored probe texts against the reference, in the items' order."""
    return _columns([row for item, one in zip(items, scored) for row in item_stats(item, *one)])


def measure_floor(endpoint: Endpoint, reference: Reference, *, timeout_s: float = 600.0,
                  scoring: str = PROMPT_LOGPROBS) -> dict[str, list[float]]:
    """The reference server scores its probe texts again in other batch compositions than the pass
    that scored them first (`Scorer.floor_at_once`): every one at once, or one per slot in the
    reverse order (more texts than slots would evict each other's cached prefixes). Per-chunk units
    of that difference."""
    score = scorer(scoring)
    if score.floor_at_once:
        return _rows(reference.items, _score_all(endpoint, score, reference.items, timeout_s, 64))
    return _rows(reference.items, _score_all(endpoint, score, reference.items[::-1], timeout_s)[::-1])


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


def _answers_correct(endpoint: Endpoint, reference: Reference, timeout_s: float) -> list[float]:
    """Per labelled probe prompt: 1.0 when its label appears in the server's short greedy answer."""
    def one(client: httpx.Client, item: ProbeItem) -> float:
        _, _, text = _generate(client, endpoint, item.prompt_ids, ANSWER_TOKENS)
        return float((item.expected or "").strip().lower() in text.lower())

    return _each([i for i in reference.items if i.expected is not None], one, timeout_s)


def _greedy_agreement(client: httpx.Client, endpoint: Endpoint, items: Sequence[ProbeItem]) -> tuple[list, list]:
    """A probe stored before long texts held greedy continuations: agreement and exact match with them."""
    agreements, exact = [], []
    for item in items:
        _, out_ids, _ = _generate(client, endpoint, item.prompt_ids, len(item.reference_ids))
        agreements.append(_agreement(out_ids, item.reference_ids))
        exact.append(float(out_ids == item.reference_ids))
    return agreements, exact


def measure_candidate(endpoint: Endpoint, reference: Reference, *, timeout_s: float = 600.0,
                      seed: int = 0, scoring: str = PROMPT_LOGPROBS) -> QualityResult:
    """Compare the server at `endpoint` with the reference on the reference's probe texts, scored
    as the reference's were (one at a time; with forced tokens one per server slot). `scoring`: the
    server's dialect (`engine_adapter.scoring`), named in the result."""
    score = scorer(scoring)
    agreements: list[float] = []
    exact: list[float] = []

    units = _rows(reference.items, _score_all(endpoint, score, reference.items, timeout_s))
    old = [i for i in reference.items if i.scored_from is None]
    if old:
        with httpx.Client(timeout=timeout_s) as client:
            agreements, exact = _greedy_agreement(client, endpoint, old)
    correct = _answers_correct(endpoint, reference, timeout_s)
    result = summarize_quality(reference, units, agreements, exact, correct, seed=seed)
    return dataclasses.replace(result, scorer=score.name)


# An excess over the floor too small to matter, per unit: a KL divergence of 0.001 per token is a
# quarter of what llama.cpp's 8-bit Q8_0 weights cost (0.0044), and 0.001 nats per token is 0.1%
# perplexity, under what the default probe resolves (+-0.3 points). One floor pass is one draw of a
# server whose batch compositions vary with timing (llama-server's slots): a lossless candidate
# can draw more of that noise than the floor did, by amounts of this size.
NEGLIGIBLE_EXCESS = {"kld": 1e-3, "nll": 1e-3}


def _within_floor(unit: str, excess: Estimate) -> bool:
    """Within the floor in `unit` (the first measured: KL divergence where the engine returned
    top-k log-probabilities): the paired excess's interval reaches zero (or below), or all of it
    lies under the negligible excess (`NEGLIGIBLE_EXCESS`)."""
    return excess.low <= 0.0 or excess.high < NEGLIGIBLE_EXCESS[unit]


def summarize_quality(reference: Reference, units: dict[str, list[float]], agreements: Sequence[float],
                      exact: Sequence[float], correct: Sequence[float], *, seed: int = 0) -> QualityResult:
    """Per-chunk units -> estimates with intervals over chunks (a probe stored before long texts: one
    chunk per prompt), and the verdict against the floor."""
    nll = bootstrap_ci(units["nll"], "mean", seed=seed)
    ppl = Estimate(math.expm1(nll.value), math.expm1(nll.low), math.expm1(nll.high))
    beyond: dict[str, Estimate] | None = None
    within: bool | None = None
    if reference.floor:
        shared = [k for k in ("kld", "nll") if k in units and len(reference.floor.get(k, [])) == len(units[k])]
        beyond = {k: bootstrap_ci([c - f for c, f in zip(units[k], reference.floor[k])], "mean", seed=seed)
                  for k in shared}
        if shared:
            within = _within_floor(shared[0], beyond[shared[0]])
    return QualityResult(
        nll_delta_per_token=nll,
        greedy_agreement=bootstrap_ci(agreements, "mean", seed=seed) if agreements else None,
        exact_match=float(np.mean(exact)) if exact else None,
        accuracy=bootstrap_ci(correct, "mean", seed=seed) if correct else None,
        n_prompts=len(reference.items),
        kld=bootstrap_ci(units["kld"], "mean", seed=seed) if "kld" in units else None,
        top1_agreement=bootstrap_ci(units["top1"], "mean", seed=seed) if "top1" in units else None,
        ppl_change=ppl, beyond_floor=beyond, within_floor=within, top_k=TOP_K if "kld" in units else 0,
        n_tokens=sum(len(i.reference_logprobs) for i in reference.items),
    )
