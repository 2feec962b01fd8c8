"""Capacity at an SLO: the highest load at which a configuration still serves its users' traffic
within their latency targets. This module owns the definitions; everything else reads them here.

- A request is *good* when it succeeded and meets every per-request threshold of the SLO
  (`replay.metrics.meets_slos`: its own TTFT, TPOT, E2E, ITL under each threshold). An errored,
  timed-out or never-finished request is not good.
- *Attainment* of a load level = good requests / requests the level planned to send.
- A load level *passes* when it is *sustained*: attainment >= the attainment target (default
  0.95) over its whole window, every percentile target of the SLO holds over all its requests (a
  failed request counts as infinitely slow there), and the engine held the load to the end: the
  window's last third meets the attainment target too, and neither the requests in flight nor the
  TTFT are still rising at the end (a slope with its 95% interval). `capacity.sustain` has these
  tests and the window's length: at least 30 s, 5 request lifetimes and 100 requests by default,
  the trace replayed end to end again where it is shorter. Each step names the test that decided.
- *Load level k*: the trace replayed with its arrival times divided by k (k = 2: twice the
  recorded rate); content, lengths and prefixes unchanged, looped as the window needs; a trace
  longer than a few windows by the windows that decide it (`capacity.segments`, `capacity.parts`).
- *Capacity*: the highest passing k, reported as k, as the offered requests/s and output tokens/s
  at that level, and per GPU. It is a bracket: [highest confirmed pass, lowest fail].

The search over load levels is `capacity.search`.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import numpy as np

from tracetune.capacity import sustain
from tracetune.capacity.response import slo_ratio

# The records of a search (`capacity.result`), read here by the modules that measure and judge levels.
from tracetune.capacity.result import (  # noqa: F401
    VERDICT_NOTES,
    CapacityResult,
    DecidedBy,
    Outcome,
    Step,
    StoredPartOutcome,
    Verdict,
    bracket_rps,
    bracket_text,
    caveats,
)
from tracetune.errors import InputError
from tracetune.replay.metrics import (
    SLO,
    client_overloaded,
    lag_bound_s,
    lag_p99,
    meets_slos,
    seconds_text,
    slo_value,
    statistic,
    threshold,
)
from tracetune.replay.types import InFlight, PreparedRequest, ReplayResult, RequestRecord

# A level's window by default (`capacity.sustain` says why): seconds, request lifetimes, requests.
LEVEL_SECONDS = 30.0
LEVEL_LIFETIMES = 5.0
LEVEL_REQUESTS = 100
SEARCH_RULES = ("guided", "classic")
CUT_ERROR = sustain.CUT_ERROR
CUT_MISS_ERROR = sustain.CUT_MISS_ERROR


@dataclasses.dataclass(frozen=True)
class CapacityOptions:
    slos: tuple[SLO, ...]
    attainment: float = 0.95
    precision: float = 0.05
    start_scale: float = 1.0
    max_scale: float = 256.0
    # Below an eighth of the trace's rate a config is far from competitive, and each halving doubles
    # a level's duration: the search stops there and reports capacity < 0.125x (verdict below_min).
    min_scale: float = 1.0 / 8
    confirm: bool = True
    max_steps: int = 20
    abandon: bool = True
    level_seconds: float = LEVEL_SECONDS
    level_lifetimes: float = LEVEL_LIFETIMES
    level_requests: int = LEVEL_REQUESTS
    # A trace longer than a few windows: a level replays the windows that decide it (`capacity.segments`),
    # or, with whole_trace, the whole trace (costs the trace's length a level).
    whole_trace: bool = False
    # How levels are placed and repeated (`capacity.search`): "guided" by the model of the response
    # to load, repeats only where marginal; "classic": doubling, bisection, both ends repeated.
    rules: str = "guided"
    # Account the machine's cores over each level (`replay.machine`): a level other work took the engine's
    # cores from is marked busy and never counted as the configuration's failure (`capacity.search`).
    machine_check: bool = True

    def __post_init__(self) -> None:
        if not self.slos:
            raise InputError("capacity needs --slo: the latency targets a load level must meet, "
                             "e.g. --slo 'ttft:p99<2s,tpot:p99<100ms'")
        if not 0 < self.attainment <= 1:
            raise InputError(f"--attainment must be in (0, 1], got {self.attainment}")
        if not 0 < self.precision < 1:
            raise InputError(f"--precision must be in (0, 1), e.g. 0.05 for 5%, got {self.precision}")
        if not self.min_scale <= self.start_scale <= self.max_scale:
            raise InputError(f"the start level {self.start_scale:g} must lie in "
                             f"[{self.min_scale:g}, {self.max_scale:g}]")
        if self.rules not in SEARCH_RULES:
            raise InputError(f"--search-rules must be one of {', '.join(SEARCH_RULES)}, got {self.rules!r}")
        if self.level_seconds < 0 or self.level_lifetimes < 0 or self.level_requests < 0:
            raise InputError("--level-seconds, --level-lifetimes and --level-requests must be >= 0 (0: no minimum), "
                             f"got {self.level_seconds:g}, {self.level_lifetimes:g}, {self.level_requests}")

    @property
    def ends_decided(self) -> bool:
        """A passing level ends once its pass is decided (`capacity.levels.DecidedPass`): the guided rules."""
        return self.rules == "guided"

    @property
    def lag_bound_s(self) -> float:
        return lag_bound_s(self.slos)


# -- one load level -------------------------------------------------------------------------------
def offered_rates(requests: Sequence[PreparedRequest]) -> tuple[float, float]:
    """(requests/s, output tokens/s) the schedule offers: its requests over its period (the span of
    its arrivals plus their mean gap, `capacity.sustain.period`), the same whether it is replayed once
    or looped; all at once: their count per second."""
    if not requests:
        return 0.0, 0.0
    n, length = len(requests), sustain.period(requests)
    per_request_tokens = sum(r.max_tokens for r in requests) / n
    rps = n / length if length > 0 else float(n)
    return rps, rps * per_request_tokens


def at_scale(requests: Sequence[PreparedRequest], scale: float) -> list[PreparedRequest]:
    """The same requests with their arrival times (from the first) divided by `scale`. Every level
    replays the same requests: only the pace changes."""
    t0 = requests[0].scheduled_s if requests else 0.0
    return [dataclasses.replace(r, scheduled_s=(r.scheduled_s - t0) / scale) for r in requests]


def percentile_targets_met(records: Sequence[RequestRecord], planned: int, slos: Sequence[SLO]) -> bool:
    """Every percentile (or mean) target of the SLO holds over the planned requests; a request
    that failed or never finished counts as infinitely slow."""
    for slo in slos:
        values = [slo_value(r, slo) if r.success else math.inf for r in records]
        values += [math.inf] * max(planned - len(records), 0)
        values = [math.inf if v is None else v for v in values]
        if not values:
            return False
        arr = np.asarray(values, dtype=float)
        value = float(np.mean(arr)) if slo.stat == "mean" else float(np.percentile(arr, float(slo.stat[1:]),
                                                                                     method="higher"))
        if not value < slo.threshold_s:
            return False
    return True


def allowed_misses(planned: int, attainment: float) -> int:
    """How many requests of a level may miss the SLO while it can still pass."""
    return int(math.floor(planned * (1 - attainment) + 1e-9))


def _late(live: InFlight, now: float, ttft: float, e2e: float) -> bool:
    return (live.first_output is None and now - live.send > ttft) or now - live.send > e2e


def late_in_flight(in_flight: Sequence[InFlight], now: float, slos: Sequence[SLO]) -> int:
    """In-flight requests already known to miss: their first output (TTFT) or whole answer (E2E)
    is later than its threshold allows."""
    ttft, e2e = threshold(slos, "ttft"), threshold(slos, "e2e")
    return sum(1 for live in in_flight if _late(live, now, ttft, e2e))


def certain_misses(finished: Sequence[RequestRecord], in_flight: Sequence[InFlight], now: float,
                   slos: Sequence[SLO]) -> int:
    """Requests already known to miss: finished ones that missed, and late ones in flight."""
    return sum(not meets_slos(r, slos) for r in finished) + late_in_flight(in_flight, now, slos)


class MissCounter:
    """`certain_misses` while a level runs, checked every few milliseconds: each finished request
    is judged once (the finished list only grows), so the check costs the client little however
    long the level. `last_from_s`: also count the misses of requests scheduled from then on (the
    window's last third) in `last`."""

    def __init__(self, slos: Sequence[SLO], last_from_s: float = math.inf) -> None:
        self.slos = slos
        self.last_from_s = last_from_s
        self.ttft, self.e2e = threshold(slos, "ttft"), threshold(slos, "e2e")
        self.judged = 0
        self.finished_misses = self.finished_last = 0
        self.count = self.last = 0

    def __call__(self, finished: Sequence[RequestRecord], in_flight: Sequence[InFlight], now: float) -> int:
        for record in finished[self.judged:]:
            missed = not meets_slos(record, self.slos)
            self.finished_misses += missed
            self.finished_last += missed and record.scheduled_s >= self.last_from_s
        self.judged = len(finished)
        late = [live for live in in_flight if _late(live, now, self.ttft, self.e2e)]
        self.count = self.finished_misses + len(late)
        self.last = self.finished_last + sum(live.scheduled_s >= self.last_from_s for live in late)
        return self.count


class MissedSLO:
    """Whether a level has certainly missed a TTFT or E2E target of the SLO, checked while it runs (the
    trace's rate of a trial, `capacity.levels`): the target's statistic over the `planned` requests
    is past its threshold even if every request in flight ended now and every one not yet sent took
    no time at all (each counted with the least it can be; a request that failed is left out, as the
    summary leaves it). A TPOT target is never certain early: an unfinished request's TPOT is
    unknown. Checked at most every `every_s` of the clock (a pass over the requests so far);
    `said` names the target once certain, e.g. "TTFT p95 at least 4.1 s against 2 s"."""

    def __init__(self, slos: Sequence[SLO], planned: int, every_s: float = 0.25) -> None:
        self.slos = [slo for slo in slos if slo.metric in ("ttft", "e2e")]
        self.planned, self.every_s = planned, every_s
        self.next_at = 0.0
        self.said = ""

    def __call__(self, finished: Sequence[RequestRecord], in_flight: Sequence[InFlight], now: float) -> bool:
        if not self.slos or now < self.next_at:
            return False
        self.next_at = now + self.every_s
        unsent = [0.0] * max(self.planned - len(finished) - len(in_flight), 0)
        for slo in self.slos:
            values = [v for r in finished if (v := r.least(slo.metric)) is not None]
            values += [_life(live, now, slo.metric) for live in in_flight] + unsent
            if values and (least := statistic(values, slo.stat)) > slo.threshold_s:
                self.said = (f"{slo.metric.upper()} {slo.stat} at least {seconds_text(least)} against "
                             f"{seconds_text(slo.threshold_s)}")
                return True
        return False


def _life(live: InFlight, now: float, metric: str) -> float:
    """The least TTFT or E2E of a request in flight: its first token's time, or its life so far."""
    first = live.first_output
    return first - live.send if metric == "ttft" and first is not None else now - live.send


def level_verdict(records: Sequence[RequestRecord], planned: int, slos: Sequence[SLO],
                  attainment: float) -> tuple[int, bool]:
    """A level's good requests under `slos` and whether it passes: their share of the planned requests
    reaches `attainment` and every percentile target is met. A level whose records are fewer than
    planned (stopped early) is judged as if the missing requests missed."""
    good = sum(meets_slos(r, slos) for r in records)
    share = good / planned if planned else 0.0
    return good, share >= attainment and percentile_targets_met(records, planned, slos)


def judge(result: ReplayResult, scale: float, requests: Sequence[PreparedRequest], options: CapacityOptions,
          duration_s: float, *, repeat: bool = False, misses_at_stop: int = 0,
          abandoned_by: DecidedBy = DecidedBy.MISSES, passes: int = 1, ended_by: DecidedBy | None = None) -> Step:
    """A measured level as a `Step`: attainment, pass or fail (sustained: `capacity.sustain.held`),
    the test that decided, and the client's own verdict. An abandoned level's attainment is the most
    it could still have reached (its certain misses counted, everything else assumed good).
    `ended_by`: the held test that failed it before its drain (`capacity.sustain.QueueRising`); its
    attainment is then a lower bound (the requests cut counted as misses)."""
    planned = len(requests)
    good, passed = level_verdict(result.records, planned, options.slos, options.attainment)
    attainment = good / planned if planned else 0.0
    rps, tps = offered_rates(requests)
    window_s = len(requests) / rps if rps > 0 else 0.0
    step = Step(scale=scale, rps=rps, output_tps=tps, attainment=attainment, passed=passed,
                abandoned=result.abandoned, requests=result.sent or len(result.records), planned=planned, good=good,
                duration_s=duration_s, lag_p99_s=lag_p99(result.records),
                client_overloaded=client_overloaded(result.records, options.slos), repeat=repeat,
                errors=sum(not r.success and not r.client_error and not r.cut for r in result.records),
                window_s=window_s, passes=passes, quarters=sustain.quarters(result.records, requests, options.slos))
    # An abandoned level's ratio is over the requests that finished (the rest were cut off): a lower
    # bound of the whole level's, which the model of `capacity.response` uses as such.
    judged = len(result.records) if result.abandoned else planned
    ratio = slo_ratio([(1.0, result.records, judged)], options.slos, options.attainment)
    step.slo_ratio = ratio.as_list() if ratio is not None else None
    if result.abandoned and planned:
        step.attainment, step.passed, step.decided_by = (planned - misses_at_stop) / planned, False, abandoned_by
    elif not passed and ended_by is None:
        step.decided_by = DecidedBy.ATTAINMENT if attainment < options.attainment else DecidedBy.PERCENTILE_TARGET
    else:
        held = sustain.held(result.records, requests, options.slos, options.attainment, window_s, rps)
        step.last_third = held.last_third
        step.in_flight_trend = held.in_flight.as_list() if held.in_flight else None
        step.ttft_trend = held.ttft.as_list() if held.ttft else None
        failed = ended_by or held.failed
        step.passed, step.decided_by = not failed, failed or DecidedBy.HELD
    return step

