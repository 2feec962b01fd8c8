"""Sustained load levels: how long a level lasts, and whether the engine held it to the end.

A capacity is what a platform team provisions from, so a load level must show that the engine can
hold its load, not that it survives a few seconds of it. `capacity.step` defines the capacity;
this module owns the two rules that make a level *sustained*.

**The window.** A level lasts at least `level_seconds` (default 30 s), at least `level_lifetimes`
(default 5) request lifetimes and at least `level_requests` (default 100) requests. A request's
lifetime is the longest a request of the trace's median output length may live and still meet the
SLO (TTFT threshold + TPOT threshold x (tokens - 1), or the E2E threshold), or its measured median
E2E latency when that is longer (the SLO bounds no lifetime, or the engine is slower). Why: an
engine admits many sequences at once; its batch, and with it TPOT and the KV cache in use, fills
over a few lifetimes after the load starts, so a shorter window measures a transient (on an H200,
300-request levels passed at 1.15-2x the rates the same engines held for 80 s). 30 s is a floor
for engines whose requests live a second or two; 100 requests let a level at the 95% target miss 5
before it fails, so one unlucky request does not decide it. On a GPU at chat SLOs the lifetimes
rule decides (about 60 s and 1,200-2,100 requests a level on the H200).

A trace shorter than the window is replayed again end to end (pass 2, 3, ...): each pass's
arrivals shifted by the trace's span plus its mean gap between arrival instants (the rate stays the
trace's), its requests and their mix unchanged. Every prompt of a pass after the first starts with a tag naming the pass
("(pass 2) "): requests of one pass share prefixes with each other as the trace's do, never with an
earlier pass, so looping adds no prefix-cache hit the trace did not have (at the price of a few
prompt tokens).

**Held.** A level that meets its attainment over the whole window passes only if the engine also
held it to the end, tested in this order (the step names the test that decided, `decided_by`):
- *last third*: the requests scheduled in the window's last third meet the attainment target too;
- *queue*: the requests in flight, averaged over 8 blocks of the window's last half, are not rising
  by more than 5% of the arrival rate (the 95% interval of the slope lies above it): the engine
  finishes fewer requests than arrive;
- *TTFT*: the blocks' median TTFT is not rising so fast that, at the slope's 95% lower bound, it
  would cross the TTFT threshold within one more window.

**A level that ends when decided** (the guided rules, `capacity.levels.DecidedPass`). A level waits
for its slowest requests: the last arrivals of a window may stream for a lifetime after it. Once
every request was sent and every one in flight has its first token, a level that passes its
attainment, last-third and percentile targets even if every request still in flight misses has its
pass decided: those requests no longer hold it open. They are cut and recorded as misses (error
"cut: ..."), with their first token and the life they had so far. The held tests keep their
meaning: the queue blocks end at the window's last arrival, before the cut, and a cut request
counts in them for its whole time in flight; the TTFT blocks read its first token, which it had.
Its attainment is then a lower bound, and the step says how many were cut.
"""

from __future__ import annotations

import dataclasses
import enum
import math
from collections.abc import Sequence

import numpy as np

from tracetune.replay.metrics import SLO, meets_slos, threshold
from tracetune.replay.profile import arrival_period
from tracetune.replay.types import CUT_PREFIX, InFlight, PreparedRequest, RequestRecord
from tracetune.types import JsonDict

LAST_PART = 1.0 / 3  # the share of the window whose attainment must meet the target on its own
TREND_PART = 0.5  # the share of the window (its end) where the trends are measured
TREND_BLOCKS = 8
QUEUE_GROWTH = 0.05  # in-flight growth, as a share of the arrival rate, that counts as a rising queue
# The errors of a request cut off unfinished (`RequestRecord.cut`): when its level's pass was decided
# (`capacity.levels.DecidedPass`), or when the trace's rate certainly missed the SLOs (`capacity.levels`).
CUT_ERROR = f"{CUT_PREFIX}the level's attainment was certain"
CUT_MISS_ERROR = f"{CUT_PREFIX}the level certainly missed the SLOs"
CUT_QUEUE_ERROR = f"{CUT_PREFIX}the level's queue was certainly rising"


class DecidedBy(enum.StrEnum):
    """The test that decided a level: held (passed every test), or the one that failed it (a str:
    stored as its value)."""

    NOT_JUDGED = ""  # before the level was judged
    HELD = "held"
    ATTAINMENT = "attainment"
    PERCENTILE_TARGET = "percentile target"
    LAST_THIRD = "last third"
    QUEUE_RISING = "queue rising"
    TTFT_RISING = "TTFT rising"
    MISSES = "misses"  # abandoned: more certain misses than the target allows
    LAST_THIRD_MISSES = "last-third misses"  # abandoned: as many in the window's last third
    SLO_MISSED = "SLO missed"  # ended: a TTFT or E2E target's statistic certainly past it (`step.MissedSLO`)
    WINDOW_SHORT = "window short"  # passed in a window shorter than the lifetimes it measured: measured again


@dataclasses.dataclass(frozen=True)
class Window:
    """How one level is replayed: `passes` of the trace, `seconds` long at its rate, `requests` sent."""

    passes: int
    seconds: float
    requests: int


def period(requests: Sequence[PreparedRequest]) -> float:
    """Trace seconds from one pass's start to the next: the span of its arrivals plus the mean gap
    between its distinct arrival instants (a trace recorded on a coarse grid, its requests arriving
    a few at each instant, keeps its grid when looped). 0 when every request arrives at once."""
    return arrival_period(np.asarray([r.scheduled_s for r in requests], dtype=float))


def lifetime_bound(slos: Sequence[SLO], output_tokens: Sequence[int]) -> float:
    """The longest a request of the median output length may live and still meet `slos` (0 when
    the SLO bounds no lifetime, e.g. a TTFT target alone)."""
    tokens = float(np.median(output_tokens)) if len(output_tokens) else 1.0
    ttft, tpot = threshold(slos, "ttft"), threshold(slos, "tpot")
    bound = threshold(slos, "e2e")
    if math.isfinite(ttft) and math.isfinite(tpot):
        bound = min(bound, ttft + tpot * max(tokens - 1, 0.0))
    return bound if math.isfinite(bound) else 0.0


def needed_seconds(requests: Sequence[PreparedRequest], scale: float, *, seconds: float, lifetimes: float,
                   min_requests: int, lifetime_s: float) -> float:
    """The shortest window level `scale` may last: every minimum met at the trace's mean rate (0 when
    every request arrives at once)."""
    trace_period = period(requests)
    if trace_period <= 0:
        return 0.0
    rate = len(requests) / trace_period * scale
    return max(seconds, lifetimes * lifetime_s, min_requests / rate)


def plan(requests: Sequence[PreparedRequest], scale: float, *, seconds: float, lifetimes: float,
         min_requests: int, lifetime_s: float) -> Window:
    """The window of level `scale` replaying the whole trace: whole passes of it, enough for every minimum."""
    n, trace_period = len(requests), period(requests)
    if trace_period <= 0:
        return Window(1, 0.0, n)
    need_s = needed_seconds(requests, scale, seconds=seconds, lifetimes=lifetimes, min_requests=min_requests,
                            lifetime_s=lifetime_s)
    passes = max(1, math.ceil(need_s * scale / trace_period - 1e-9))
    return Window(passes, passes * trace_period / scale, passes * n)


def looped(requests: Sequence[PreparedRequest], passes: int) -> list[PreparedRequest]:
    """The trace `passes` times end to end; a later pass's requests get new indices and tagged prompts."""
    out = list(requests)
    if passes <= 1 or not requests:
        return out
    shift = period(requests)
    stride = max(r.index for r in requests) + 1
    for p in range(1, passes):
        tag = f"(pass {p + 1}) "
        out += [dataclasses.replace(r, index=r.index + p * stride, id=None if r.id is None else f"{r.id}~{p + 1}",
                                    scheduled_s=r.scheduled_s + p * shift,
                                    prompt=None if r.prompt is None else tag + r.prompt,
                                    messages=_tagged(r.messages, tag)) for r in requests]
    return out


def _tagged(messages: list[JsonDict] | None, tag: str) -> list[JsonDict] | None:
    """The messages with `tag` at the start of the first one's text."""
    if not messages:
        return messages
    first = dict(messages[0])
    content = first.get("content")
    if isinstance(content, list):
        first["content"] = [{"type": "text", "text": tag}, *content]
    else:
        first["content"] = tag + (content or "")
    return [first, *messages[1:]]


# -- was the level held? ---------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Trend:
    """A least-squares slope over the blocks of the window's end, per second, with its 95% interval,
    and the fitted value at the end."""

    slope: float
    low: float
    high: float
    end: float

    def as_list(self) -> list[float]:
        return [self.slope, self.low, self.high, self.end]

    @classmethod
    def fit(cls, times: Sequence[float], values: Sequence[float]) -> Trend | None:
        x, y = np.asarray(times, dtype=float), np.asarray(values, dtype=float)
        if x.size < 4 or np.ptp(x) <= 0:
            return None
        slope, intercept = np.polyfit(x, y, 1)
        residuals = y - (slope * x + intercept)
        se = math.sqrt(float(residuals @ residuals) / (x.size - 2) / float(((x - x.mean()) ** 2).sum()))
        from scipy import stats  # imported here: it costs a command's start ~0.5 s

        half = float(stats.t.ppf(0.975, x.size - 2)) * se
        return cls(float(slope), float(slope - half), float(slope + half), float(slope * x.max() + intercept))


@dataclasses.dataclass(frozen=True)
class Held:
    """The tests of a level that met its attainment over the whole window; `failed` names the first
    that did not hold (None when every one did)."""

    last_third: float  # attainment of the requests scheduled in the window's last third
    in_flight: Trend | None  # requests in flight (per second)
    ttft: Trend | None  # median TTFT (seconds per second)
    failed: DecidedBy | None = None


def share_good(records: Sequence[RequestRecord], planned: Sequence[PreparedRequest], slos: Sequence[SLO],
               start_s: float, end_s: float = math.inf) -> float:
    """Good requests among those scheduled in [start_s, end_s), over how many were planned there."""
    def inside(t: float) -> bool:
        return start_s <= t < end_s

    n = sum(inside(r.scheduled_s) for r in planned)
    good = sum(meets_slos(r, slos) for r in records if inside(r.scheduled_s))
    return good / n if n else 1.0


def quarters(records: Sequence[RequestRecord], planned: Sequence[PreparedRequest], slos: Sequence[SLO]) -> list[float]:
    """Attainment of each quarter of the window (by schedule), to see a level decay."""
    span = planned[-1].scheduled_s if planned else 0.0
    edges = [span * q / 4 for q in range(4)] + [math.inf]
    return [share_good(records, planned, slos, edges[q], edges[q + 1]) for q in range(4)]


def block_trends(records: Sequence[RequestRecord], window_s: float) -> tuple[Trend | None, Trend | None]:
    """(in-flight, median TTFT) trends over TREND_BLOCKS blocks of the window's last TREND_PART, by
    send time. In flight: the time-average of requests between their send and their end."""
    if not records or window_s <= 0:
        return None, None
    send = np.asarray([r.send_s for r in records], dtype=float)
    end = send + np.asarray([r.e2e_s for r in records], dtype=float)
    edges = _trend_edges(window_s)
    ttft_mids, ttft = [], []
    for a, b in zip(edges[:-1], edges[1:]):
        first = [r.ttft_s for r in records if a <= r.send_s < b and r.ttft_s is not None
                 and (r.success or r.cut)]
        if first:
            ttft_mids.append((a + b) / 2)
            ttft.append(float(np.median(first)))
    return in_flight_trend(send, end, window_s), Trend.fit(ttft_mids, ttft)


def _trend_edges(window_s: float) -> np.ndarray:
    return np.linspace(window_s * (1 - TREND_PART), window_s, TREND_BLOCKS + 1)


def in_flight_trend(send: np.ndarray, end: np.ndarray, window_s: float) -> Trend | None:
    """The trend of requests in flight (the time-average of requests between their send and their
    end) over TREND_BLOCKS blocks of the window's last TREND_PART."""
    edges = _trend_edges(window_s)
    mids = (edges[:-1] + edges[1:]) / 2
    flight = [float(np.clip(np.minimum(end, b) - np.maximum(send, a), 0, None).sum()) / (b - a)
              for a, b in zip(edges[:-1], edges[1:])]
    return Trend.fit(mids, flight)


class QueueRising:
    """A level's fail on a rising queue, decided once every request was sent (`StopWhen`). The
    queue test reads the requests in flight up to the window's last arrival: once that one is sent,
    each request still in flight stays in flight to the window's end, so the test reads then what
    it would read after the level's drain. Checked once, when the last request is seen sent."""

    def __init__(self, planned: int, span_s: float, rate: float) -> None:
        self.planned, self.span_s, self.rate = planned, span_s, rate
        self.checked = False

    def __call__(self, finished: Sequence[RequestRecord], in_flight: Sequence[InFlight], now: float) -> bool:
        if self.checked or len(finished) + len(in_flight) < self.planned or self.span_s <= 0:
            return False
        self.checked = True
        # As `capacity.levels.with_cut` records them: in flight from their send until now.
        send = [r.send_s for r in finished] + [f.sent_s for f in in_flight]
        end = [r.send_s + r.e2e_s for r in finished] + [f.sent_s + now - f.send for f in in_flight]
        trend = in_flight_trend(np.asarray(send, dtype=float), np.asarray(end, dtype=float), self.span_s)
        return trend is not None and trend.low > QUEUE_GROWTH * self.rate


def held(records: Sequence[RequestRecord], planned: Sequence[PreparedRequest], slos: Sequence[SLO],
         attainment: float, window_s: float, rate: float) -> Held:
    """The held-to-the-end tests of a level (see the module's text), in order."""
    span = planned[-1].scheduled_s if planned else 0.0
    last = share_good(records, planned, slos, span * (1 - LAST_PART))
    in_flight, ttft = block_trends(records, span)
    failed = None
    ttft_threshold = threshold(slos, "ttft")
    if last < attainment:
        failed = DecidedBy.LAST_THIRD
    elif in_flight is not None and in_flight.low > QUEUE_GROWTH * rate:
        failed = DecidedBy.QUEUE_RISING
    elif ttft is not None and ttft.low > 0 and ttft.end + ttft.low * window_s >= ttft_threshold:
        failed = DecidedBy.TTFT_RISING
    return Held(last, in_flight, ttft, failed)


def describe(requests: Sequence[PreparedRequest], *, seconds: float, lifetimes: float, min_requests: int,
             lifetime_s: float, looped: bool = True) -> str:
    """The window rule in one sentence, for the start of a search (`looped`: the trace is replayed
    whole, end to end as often as a level needs)."""
    lifetime = (f"{lifetimes:g} request lifetimes ({lifetime_s:.3g} s within the SLO)" if lifetime_s
                else f"{lifetimes:g} measured request lifetimes")
    text = f"each load level lasts >= {seconds:g} s, >= {lifetime} and >= {min_requests} requests"
    if not looped:
        return text
    trace = f"the trace's {len(requests)} measured requests ({period(requests):.3g} s)"
    return (f"{text}; {trace} are replayed end to end as often as a level needs, each later pass's prompts "
            f"starting with '(pass N) ' so that it hits no prefix cached by an earlier pass")
