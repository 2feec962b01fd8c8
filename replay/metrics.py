"""Summary statistics of a replay: latency percentiles, throughput, goodput under SLOs, errors,
95% bootstrap confidence intervals, and the engine's own counters.

Definitions (per request, successful requests only unless said otherwise):
- TTFT: send to first output event. E2E: send to last byte.
- TPOT: (E2E - TTFT) / (output tokens - 1), output tokens from the server's usage.
- ITL: every gap between consecutive output events, pooled over requests.
- Throughput: successful requests (or their output tokens) per second of measured replay
  (first send to last completion).
- Goodput: requests per second that met *every* per-request SLO threshold (per-request
  attainment); `slo_met` separately says whether each percentile target held on the aggregate.
- Errors: requests the engine failed (HTTP errors, broken streams, timeouts). Requests this
  machine failed (out of file descriptors or ports) are `client_errors`, counted apart. Of the
  errors, `stream_faults` are answers that were not well-formed OpenAI streams (an HTML page, a
  truncated stream, a malformed event, a bad token count: `openai_client.stream_fault`); when they
  are most of the replay, `endpoint_warning` says the endpoint is not what it seems.
- Client overloaded: the replay measured its client, not the engine, when the schedule lag's
  p99 passes `lag_bound_s` or any request failed on the client's side. Such a replay is a
  verdict, not a datum: the tuner and the capacity search never charge it to the engine.
- Engine counters: the engine's /metrics over the replay; where they count no speculative draft
  tokens but its answers reported some (llama-server's `timings`), the answers' sums
  (`with_reported_drafts`).
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Iterable, Sequence
from typing import Annotated, Protocol, TypedDict

import numpy as np
from pydantic import BeforeValidator, Field, GetPydanticSchema, JsonValue

from tracetune.engine_adapter.metrics import EngineMetrics
from tracetune.engine_adapter.openai_client import stream_fault
from tracetune.errors import InputError
from tracetune.replay.types import ReplayResult, RequestRecord
from tracetune.stored import Record, Stored, number

# Schedule lag beyond which a replay measures the client, not the engine: 10 ms, or 5% of the
# tightest TTFT/E2E threshold when that is larger. A request sent late meets a lighter load than the
# replay claims; its TTFT and E2E count from the actual send, so a lag of 5% of their threshold can
# only move requests that were already within 5% of it. TPOT and ITL do not depend on the send time.
LAG_BOUND_S = 0.010
LAG_SHARE_OF_THRESHOLD = 0.05

# The latency vocabulary, written once: every objective, column and SLO reads these names.
METRICS = ("ttft", "tpot", "itl", "e2e")
STATS = ("mean", "p50", "p90", "p99")
_UNITS = {"ms": 1e-3, "s": 1.0, "us": 1e-6}
_SLO_ITEM = re.compile(r"^\s*(ttft|tpot|itl|e2e)\s*:\s*(mean|p\d{1,2}(?:\.\d+)?)"
                       r"\s*<\s*([0-9]*\.?[0-9]+)\s*(ms|s|us)\s*$")


@dataclasses.dataclass(frozen=True)
class SLO:
    metric: str  # ttft | tpot | itl | e2e
    stat: str  # mean | pNN
    threshold_s: float

    def __str__(self) -> str:
        return f"{self.metric}:{self.stat}<{self.threshold_s * 1000:g}ms"


def threshold(slos: Sequence[SLO], metric: str) -> float:
    """The tightest per-request threshold the SLO sets on `metric` (seconds; inf when it sets none)."""
    return min((s.threshold_s for s in slos if s.metric == metric), default=math.inf)


def lag_bound_s(slos: Sequence[SLO] = ()) -> float:
    """The schedule-lag p99 above which a replay under `slos` measured its client (see above)."""
    timed = [s.threshold_s for s in slos if s.metric in ("ttft", "e2e")]
    return max(LAG_BOUND_S, LAG_SHARE_OF_THRESHOLD * min(timed)) if timed else LAG_BOUND_S


def lag_p99(records: Sequence[RequestRecord]) -> float:
    return float(np.percentile([r.lag_s for r in records], 99)) if records else 0.0


def client_overloaded(records: Sequence[RequestRecord], slos: Sequence[SLO] = ()) -> bool:
    """Whether the replay measured its client: lag p99 past the bound, or client-side failures."""
    return lag_p99(records) > lag_bound_s(slos) or any(r.client_error for r in records)


def parse_slos(spec: str | None, flag: str = "--slo") -> list[SLO]:
    """Parse `ttft:p99<500ms,tpot:p50<50ms` into SLOs; errors name the flag and the item. A threshold
    must be above 0 (no request meets `<0s`) and a metric's statistic bound once (two bounds on it
    would leave one unread)."""
    if not spec:
        return []
    slos: list[SLO] = []
    written: list[str] = []
    for item in spec.split(","):
        m = _SLO_ITEM.match(item)
        if not m:
            raise InputError(
                f"{flag}: cannot read {item.strip()!r}; write METRIC:STAT<VALUE UNIT, e.g. "
                f"'ttft:p99<500ms,tpot:p50<50ms' (METRIC: ttft, tpot, itl, e2e; STAT: mean or pNN; UNIT: ms, s, us)")
        metric, stat, value, unit = m.groups()
        if stat != "mean" and not 0 < float(stat[1:]) < 100:
            raise InputError(f"{flag}: percentile in {item.strip()!r} must be between 0 and 100")
        if float(value) <= 0:
            raise InputError(f"{flag}: the threshold in {item.strip()!r} must be above 0 (no request takes less "
                             f"than no time)")
        if twice := [w for s, w in zip(slos, written, strict=True) if s.metric == metric and _same_stat(s.stat, stat)]:
            raise InputError(f"{flag}: {metric}:{stat} is bound twice ({twice[0]!r} and {item.strip()!r}); keep one")
        slos.append(SLO(metric, stat, float(value) * _UNITS[unit]))
        written.append(item.strip())
    return slos


def _same_stat(a: str, b: str) -> bool:
    """Whether two statistics of an SLO are one (p99 and p99.0 are)."""
    return a == b or ("mean" not in (a, b) and float(a[1:]) == float(b[1:]))


def seconds_text(seconds: float) -> str:
    """A latency in words: "1.55 s", or "37 ms" under a second."""
    return f"{seconds:.3g} s" if seconds >= 1 else f"{seconds * 1000:.0f} ms"


def statistic(values: Sequence[float], stat: str) -> float:
    """`stat` ("mean", "p95", ...) of `values`, as the summary computes it."""
    return float(_stat(np.asarray(values, dtype=float), stat))


def _stat(values: np.ndarray, stat: str, axis: int | None = None) -> np.floating | np.ndarray:
    if stat == "mean":
        return np.mean(values, axis=axis)
    return np.percentile(values, float(stat[1:]), axis=axis)


class StoredEstimate(TypedDict, total=False):
    """An `Estimate` as stored (`Estimate.as_dict`); an interval-less one has the value alone."""

    value: float
    ci_low: float
    ci_high: float


@dataclasses.dataclass
class Estimate(Record[StoredEstimate]):
    """A value with its 95% interval; stored as `StoredEstimate` (NaN where a value is missing or
    not a number)."""

    value: float = math.nan
    low: Annotated[float, Field(alias="ci_low")] = math.nan
    high: Annotated[float, Field(alias="ci_high")] = math.nan


# Above this many values the interval comes from large-sample theory instead of the bootstrap: a
# replay of 8,000 requests pools 250,000 inter-token gaps, and 1,000 bootstrap resamples of those
# took 18 s per summary (measured), where the theory below is exact or as good at that size.
BOOTSTRAP_MAX_VALUES = 5000


def large_sample_ci(data: np.ndarray, stat: str) -> tuple[float, float]:
    """95% interval of `stat` for a large sample: for a percentile, the distribution-free interval
    between two order statistics (their ranks from the binomial distribution of how many values fall
    below the true percentile); for the mean, mean +- 1.96 standard errors."""
    n = data.size
    if stat == "mean":
        half = 1.96 * float(data.std(ddof=1)) / math.sqrt(n)
        mean = float(data.mean())
        return mean - half, mean + half
    from scipy.stats import binom

    q = float(stat[1:]) / 100
    low_rank, high_rank = int(binom.ppf(0.025, n, q)), int(binom.ppf(0.975, n, q)) + 1  # 1-based ranks
    low_i, high_i = min(max(low_rank, 1), n) - 1, min(max(high_rank, 1), n) - 1
    ordered = np.partition(data, (low_i, high_i))
    return float(ordered[low_i]), float(ordered[high_i])


def bootstrap_ci(values: Sequence[float] | np.ndarray, stat: str, *, n_resamples: int = 1000,
                 seed: int = 0) -> Estimate:
    """`stat` of `values` with a 95% percentile-bootstrap interval (scipy); for more than
    BOOTSTRAP_MAX_VALUES values, the large-sample interval. NaN when empty."""
    data = np.asarray(values, dtype=float)
    if data.size == 0:
        return Estimate(math.nan, math.nan, math.nan)
    value = float(_stat(data, stat))
    if data.size < 2 or np.all(data == data[0]):
        return Estimate(value, value, value)
    if data.size > BOOTSTRAP_MAX_VALUES:
        low, high = large_sample_ci(data, stat)
        return Estimate(value, min(low, value), max(high, value))
    from scipy import stats

    res = stats.bootstrap((data,), lambda x, axis: _stat(x, stat, axis=axis), n_resamples=n_resamples,
                          confidence_level=0.95, method="percentile", vectorized=True,
                          random_state=np.random.default_rng(seed))
    return Estimate(value, float(res.confidence_interval.low), float(res.confidence_interval.high))


def per_request_values(records: Iterable[RequestRecord], metric: str) -> list[float]:
    """Each successful request's `metric` (ITL: every gap); a request cut unfinished (`RequestRecord.cut`)
    counts with the least its TTFT or E2E can be, so that statistics of a replay ended early are lower
    bounds, never the faster survivors' alone."""
    records = list(records)
    ok = [r for r in records if r.success]
    if metric in ("ttft", "e2e"):
        return [v for r in records if (r.success or r.cut) and (v := r.least(metric)) is not None]
    if metric == "tpot":
        return [r.tpot_s for r in ok if r.tpot_s is not None]
    if metric == "itl":
        return [gap for r in ok for gap in r.itl_s]
    raise ValueError(metric)


def slo_value(record: RequestRecord, slo: SLO) -> float | None:
    """The value of a successful request that `slo`'s threshold applies to (per-request
    attainment): its own TTFT, TPOT (0 for one-token answers), E2E, or its ITL gaps at the SLO's
    statistic."""
    if slo.metric == "ttft":
        return record.ttft_s
    if slo.metric == "tpot":
        return record.tpot_s if record.tpot_s is not None else 0.0
    if slo.metric == "e2e":
        return record.e2e_s
    return float(_stat(np.asarray(record.itl_s), slo.stat)) if record.itl_s else 0.0


def meets_slos(record: RequestRecord, slos: Sequence[SLO]) -> bool:
    """A *good* request: it succeeded and its own value is under every SLO threshold."""
    if not record.success:
        return False
    for slo in slos:
        value = slo_value(record, slo)
        if value is None or not value < slo.threshold_s:
            return False
    return True


# A stored number kept under its key where it is missing or no number (NaN, as `stored.number` reads it).
_Number = Annotated[float, BeforeValidator(number)]
# A record stored inside the summary (a capacity search's, an acceptance probe's): kept as stored, NaN included.
_AsStored = Annotated[Stored | None, GetPydanticSchema(lambda _, handler: handler(dict[str, JsonValue] | None))]


@dataclasses.dataclass
class Summary(Record[dict[str, object]]):
    """A replay's statistics (see above). Stored in this order, `latency` as "latency_s" and
    `schedule_lag` as "schedule_lag_s"; goodput, capacity, acceptance, cost and `ended` only while
    set. A field an older tracetune did not store, or stored as something else, takes its default
    (a statistic it did not measure is absent from `latency`)."""

    requests: int = 0
    succeeded: int = 0
    errors: int = 0  # failed by the engine
    client_errors: int = 0  # failed by this machine (file descriptors, ports), not by the engine
    client_overloaded: bool = False
    lag_bound_s: float = LAG_BOUND_S
    connection_waits: int = 0  # requests that waited for one of `connection_limit` connections
    connection_limit: int = 0
    error_rate: float = 0.0
    duration_s: float = math.nan
    stream_faults: int = 0  # errors whose answer was not a well-formed OpenAI stream
    first_stream_fault: str = ""  # the reason of the first of them (in trace order)
    request_throughput_rps: Estimate = dataclasses.field(default_factory=Estimate)
    output_throughput_tps: Estimate = dataclasses.field(default_factory=Estimate)
    latency: Annotated[dict[str, dict[str, Estimate]], Field(alias="latency_s")] = dataclasses.field(
        default_factory=dict)
    schedule_lag: Annotated[dict[str, _Number], Field(alias="schedule_lag_s")] = dataclasses.field(
        default_factory=dict)
    slo_met: dict[str, bool] = dataclasses.field(default_factory=dict)
    engine: dict[str, _Number] | None = None
    error_examples: list[str] = dataclasses.field(default_factory=list)
    goodput_rps: Estimate | None = None
    slo_attainment: float | None = None
    capacity: _AsStored = None  # capacity.step.CapacityResult.as_dict(), when searched
    acceptance: _AsStored = None  # replay.acceptance.Acceptance.as_dict(), for a speculative trial
    cost: dict[str, _Number] | None = None  # wall seconds of the run that measured it, by part (`tuner.measure`)
    ended: str = ""  # how a replay cut short once its outcome was certain ended ("": it ran to its end)

    unset_omitted = ("goodput_rps", "slo_attainment", "capacity", "acceptance", "cost", "ended")

    def estimate(self, metric: str, stat: str) -> Estimate | None:
        """The latency estimate of `metric` at `stat` (None where the summary does not hold it)."""
        return self.latency.get(metric, {}).get(stat)


def _rate_ci(per_request: np.ndarray, duration_s: float, seed: int) -> Estimate:
    """Sum(per_request)/duration with a bootstrap interval over requests (duration held fixed)."""
    if per_request.size == 0 or duration_s <= 0:
        return Estimate(0.0, 0.0, 0.0)
    est = bootstrap_ci(per_request, "mean", seed=seed)
    n = per_request.size / duration_s
    return Estimate(est.value * n, est.low * n, est.high * n)


def stats_of(metric: str, slos: Sequence[SLO] = ()) -> tuple[str, ...]:
    """The statistics a summary holds for `metric`: STATS, and any other one an SLO names (e.g. p95),
    so every SLO can be read back as a constraint."""
    return tuple(dict.fromkeys([*STATS, *(s.stat for s in slos if s.metric == metric)]))


def endpoint_warning(summary: Summary) -> str | None:
    """The line a replay prints when most of its requests were answered with something other than
    an OpenAI stream (None otherwise): its numbers would describe that something, not an engine."""
    if not summary.requests or 2 * summary.stream_faults <= summary.requests:
        return None
    return (f"the endpoint is not what it seems: {summary.stream_faults} of {summary.requests} responses were "
            f"not OpenAI streams (first reason: {summary.first_stream_fault}); check that --endpoint is the "
            f"root URL of an OpenAI-compatible server (e.g. http://HOST:8000)")


class ReportsDrafts(Protocol):
    """An answer that may say what speculation drafted for it (`RequestRecord`, `StreamedCompletion`)."""

    @property
    def draft_tokens(self) -> int | None: ...

    @property
    def accepted_tokens(self) -> int | None: ...


def with_reported_drafts(engine: EngineMetrics, answers: Sequence[ReportsDrafts]) -> EngineMetrics:
    """The engine's counters, with the speculative draft and accepted tokens that its answers
    reported (llama-server's `timings`) where its counters hold no draft token. Where the counters
    hold some they are kept, never added to (the same tokens twice). Answers do not say how many
    drafts there were, so `spec_decode_drafts` stays as counted and the mean accepted length NaN,
    where the acceptance rate is known."""
    if engine.spec_decode_draft_tokens > 0:
        return engine
    reported = [r for r in answers if r.draft_tokens is not None]
    drafted = sum(r.draft_tokens or 0 for r in reported)
    if not drafted:
        return engine
    accepted = sum(r.accepted_tokens or 0 for r in reported)
    return dataclasses.replace(engine, spec_decode_draft_tokens=float(drafted),
                               spec_decode_accepted_tokens=float(accepted))


def summarize(result: ReplayResult, slos: Sequence[SLO] = (), *, seed: int = 0) -> Summary:
    records = result.records
    n = len(records)
    ok = [r for r in records if r.success]
    duration = result.duration_s
    latency = {m: {s: bootstrap_ci(per_request_values(records, m), s, seed=seed) for s in stats_of(m, slos)}
               for m in METRICS}
    lags = np.asarray([r.lag_s for r in records], dtype=float)
    lag = {"p50": float(np.percentile(lags, 50)), "p99": float(np.percentile(lags, 99)), "max": float(lags.max())} \
        if lags.size else {}
    ones = np.ones(len(ok))
    tokens = np.asarray([r.output_tokens or 0 for r in ok], dtype=float)
    # Requests that failed count as zero toward throughput but are part of the sample.
    pad = np.zeros(n - len(ok))
    client_errors = sum(r.client_error for r in records)
    cut = sum(r.cut for r in records)
    engine_errors = n - len(ok) - client_errors - cut
    faults = [r.error for r in records if not r.success and stream_fault(r.error)]
    summary = Summary(
        requests=n, succeeded=len(ok), errors=engine_errors, error_rate=engine_errors / n if n else 0.0,
        client_errors=client_errors, client_overloaded=client_overloaded(records, slos),
        lag_bound_s=lag_bound_s(slos), connection_waits=result.connection_waits,
        connection_limit=result.connection_limit, duration_s=duration,
        request_throughput_rps=_rate_ci(np.concatenate([ones, pad]), duration, seed),
        output_throughput_tps=_rate_ci(np.concatenate([tokens, pad]), duration, seed),
        latency=latency, schedule_lag=lag,
        error_examples=sorted({r.error for r in records if not r.success and not r.cut})[:5],
        stream_faults=len(faults), first_stream_fault=faults[0] if faults else "",
    )
    if slos:
        good = np.asarray([meets_slos(r, slos) for r in records], dtype=float)
        summary.goodput_rps = _rate_ci(good, duration, seed)
        summary.slo_attainment = float(good.mean()) if n else 0.0
        for s in slos:
            values = per_request_values(records, s.metric)
            value = float(_stat(np.asarray(values), s.stat)) if values else math.nan
            summary.slo_met[str(s)] = bool(value < s.threshold_s)
    if result.abandoned and (cut or result.planned > n):
        summary.ended = (f"ended once its outcome was certain: {n} of {result.planned} requests sent, {cut} of them "
                         f"cut unfinished (counted at their life so far)")
    if result.engine_delta is not None:
        summary.engine = with_reported_drafts(result.engine_delta, records).as_dict()
    return summary
