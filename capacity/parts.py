"""A load level made of parts of a long trace (`capacity.segments` picks them): the whole trace's
verdict at that load, judged from the windows replayed."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence

import numpy as np

from tracetune.capacity import segments
from tracetune.capacity.response import slo_ratio
from tracetune.capacity.step import CapacityOptions, DecidedBy, Step, StoredPartOutcome
from tracetune.replay.metrics import SLO, slo_value
from tracetune.replay.types import PreparedRequest, RequestRecord


@dataclasses.dataclass
class PartOutcome:
    """One window of the trace as a level replayed it: its own step, and its requests (lead-in left
    out, times from the window's start)."""

    part: segments.Part
    step: Step
    records: list[RequestRecord]
    requests: list[PreparedRequest]
    stands_for: tuple[int, int] = (0, 0)  # the trace's requests and windows it stands for

    def as_dict(self) -> StoredPartOutcome:
        """The window and its replay's outcome, as the level's `Step.parts` stores it."""
        s = self.step
        return StoredPartOutcome(**self.part.as_dict(), attainment=s.attainment, good=s.good, planned=s.planned,
                                 sent=s.requests, outcome=s.outcome, abandoned=s.abandoned, duration_s=s.duration_s,
                                 lag_p99_s=s.lag_p99_s, stands_for_requests=self.stands_for[0],
                                 stands_for_windows=self.stands_for[1])


def weighted_targets_met(parts: Sequence[tuple[float, Sequence[RequestRecord], int]], slos: Sequence[SLO]) -> bool:
    """Every percentile (or mean) target of the SLO holds over the requests of several parts of a
    trace, each part's requests weighted by the share of the trace it stands for over its planned
    count; a request that failed or never finished counts as infinitely slow."""
    for slo in slos:
        values: list[float] = []
        weights: list[float] = []
        for share, records, planned in parts:
            if planned <= 0 or share <= 0:
                continue
            seen = [slo_value(r, slo) if r.success else math.inf for r in records]
            mine = [math.inf if v is None else v for v in seen] + [math.inf] * max(planned - len(records), 0)
            values += mine
            weights += [share / planned] * len(mine)
        if not values:
            return False
        arr, w = np.asarray(values, dtype=float), np.asarray(weights, dtype=float)
        if slo.stat == "mean":
            value = float(np.average(arr, weights=w)) if np.isfinite(arr).all() else math.inf
        else:
            value = float(np.quantile(arr, float(slo.stat[1:]) / 100, weights=w, method="inverted_cdf"))
        if not value < slo.threshold_s:
            return False
    return True


def miss_budget(windows: segments.Windows, measured: Mapping[int, float], cell: int, planned: int,
                target: float) -> int:
    """How many of window `cell`'s `planned` requests may miss while the whole trace can still reach
    `target` (its attainment bound's high end); -1 when none can."""
    last = windows.last_part if windows.last_part[cell] else None

    def high(misses: int) -> float:
        trial = {**measured, cell: 1 - misses / max(planned, 1)}
        whole = segments.bounds(windows, trial)[1]
        return whole if last is None else min(whole, segments.bounds(windows, trial, last)[1])

    if high(0) < target:
        return -1
    lo, hi = 0, planned
    while lo < hi:  # the most misses with high(misses) >= target
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if high(mid) >= target else (lo, mid - 1)
    return lo


def judge_parts(scale: float, done: Sequence[PartOutcome], windows: segments.Windows, options: CapacityOptions, *,
                base_rates: tuple[float, float], abandoned: bool) -> Step:
    """The level as the whole trace's estimate: its attainment bounded by the parts replayed
    (`capacity.segments.bounds`), passed when the low bounds reach the target (or, still undecided
    after the most parts, the estimate does) and the percentile targets hold over the parts'
    requests weighted by what each stands for; the same of the trace's last third. An abandoned
    level failed."""
    measured = {d.part.cell: d.step.attainment for d in done}
    low, high = segments.bounds(windows, measured)
    share = segments.stands_for(windows, list(measured))
    for d in done:
        d.stands_for = share[d.part.cell]
    attainment = segments.estimate(windows, measured)
    last_third = segments.estimate(windows, measured, windows.last_part)
    undecided = not abandoned and not segments.decision(windows, measured, options.attainment)[0]
    step = Step(scale=scale, rps=base_rates[0] * scale, output_tps=base_rates[1] * scale, attainment=attainment,
                passed=False, abandoned=abandoned, requests=sum(d.step.requests for d in done),
                planned=sum(d.step.planned for d in done), good=sum(d.step.good for d in done),
                duration_s=sum(d.step.duration_s for d in done),
                lag_p99_s=max((d.step.lag_p99_s for d in done), default=0.0),
                client_overloaded=any(d.step.client_overloaded for d in done),
                errors=sum(d.step.errors for d in done), window_s=max((d.step.window_s for d in done), default=0.0),
                parts=[d.as_dict() for d in done], trace_windows=windows.n, attainment_bounds=[low, high],
                undecided=undecided, last_third=last_third)
    weighted = [(d.stands_for[0] / windows.requests, d.records, d.step.planned) for d in done]
    ratio = slo_ratio(weighted, options.slos, options.attainment)
    step.slo_ratio = ratio.as_list() if ratio is not None else None
    if abandoned:
        step.decided_by = DecidedBy.MISSES
    elif attainment < options.attainment or high < options.attainment:
        step.decided_by = DecidedBy.ATTAINMENT
    elif last_third < options.attainment:
        step.decided_by = DecidedBy.LAST_THIRD
    elif not weighted_targets_met(weighted, options.slos):
        step.decided_by = DecidedBy.PERCENTILE_TARGET
    else:
        step.passed, step.decided_by = True, DecidedBy.HELD
    return step
