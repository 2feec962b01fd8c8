"""A configuration's response to load, read from the levels a search has already measured: where
the next level goes (`place`), and whether a level needs a repeat (`repeat_rule`).

**The signal.** A level's *SLO ratio* m is how close its requests came to the SLO: each request's
score is its worst value over its threshold (TTFT / TTFT threshold, TPOT / TPOT threshold, ...;
infinite for a failed or unfinished request), and m is the larger of that score's quantile at the
attainment target and each percentile target's value over its threshold. m < 1 is, to within the
quantile's conventions, the level meeting its attainment and percentile targets; unlike the
attainment, which sits at 100% below the knee, m keeps moving with the load on both sides of it.
An abandoned level's m is over the requests that finished before it was cut off (a lower bound:
the cut-off ones were the slowest); so is that of a level ended on a rising queue
(`sustain.QueueRising`), each request cut in flight scored at the least it can be. Each level
stores m with a 95% interval: the quantile's distribution-free interval (the order statistics
around it, as a binomial count of the requests at or under it gives).

**The model.** The headroom 1/m falls roughly linearly with the offered rate near the knee: a
queue's waiting time grows as 1/(1 - utilisation), which makes 1/m linear in the load in a
single-server queue, and a batch that fills slows each token by a share that grows with it. The
crossing of 1/m = 1 is read off the two measured levels nearest it: interpolated between the
highest level under the SLO and the lowest over it, or extrapolated from the two nearest on one
side; its interval from the same line through the ends of both levels' intervals. The model only
places levels: every outcome is still a measured, sustained level, and the bracket is still
[highest pass, lowest fail].

**Placing a level** (`place`) inside a bracket [lo, hi] wider than the precision p: where the
prediction lies within p of an end, the level goes p from that end (its outcome then closes the
bracket); otherwise at the prediction less half the precision (a pass there leaves a bracket that
the next level, p above it, closes), kept inside the bracket and its interval. With no prediction,
or when the last placed level did not halve the bracket (the model was wrong), the geometric
midpoint, as plain bisection; the same where the prediction lies outside the bracket (the
measured outcomes contradict the model). Bracketing (no fail, or no pass, yet) steps by x2 without a
prediction and by the prediction plus half the precision with one, at least x1.25 and at most x4.

**Repeats** (`repeat_rule`): an end of the final bracket is measured again only when its outcome
is marginal: its SLO-ratio interval spans 1, the last third decided it, or it is a window short
of a decision. A level whose whole interval lies on one side of 1 and whose outcome agrees with
it, or whose fail an interval-based trend test decided (queue or TTFT rising), is clear.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import numpy as np

from tracetune.capacity.result import DecidedBy, Step
from tracetune.capacity.sustain import CUT_QUEUE_ERROR
from tracetune.replay.metrics import SLO, slo_value
from tracetune.replay.types import RequestRecord

Z95 = 1.96  # the normal quantile of a two-sided 95% interval
MIN_UP, MAX_UP = 1.25, 4.0  # the smallest and largest step of a bracketing level guided by a prediction
# Tests whose fail is already decided on a 95% interval (`capacity.sustain`): no repeat needed for them.
TREND_TESTS = (DecidedBy.QUEUE_RISING, DecidedBy.TTFT_RISING)

# A part of a level: (share of the trace it stands for, its records, requests it planned).
Weighted = tuple[float, Sequence[RequestRecord], int]


@dataclasses.dataclass(frozen=True)
class Ratio:
    """A level's SLO ratio m with its 95% interval [low, high] (inf: a failed request decides it)."""

    low: float
    value: float
    high: float

    def as_list(self) -> list[float | None]:
        """As stored: an infinite end is None (JSON has no infinity)."""
        return [v if math.isfinite(v) else None for v in (self.low, self.value, self.high)]

    @classmethod
    def from_list(cls, stored: Sequence[float | None]) -> Ratio:
        low, value, high = (math.inf if v is None else float(v) for v in stored)
        return cls(low, value, high)


def _scores(records: Sequence[RequestRecord], planned: int, slos: Sequence[SLO],
            metric: SLO | None = None) -> list[float]:
    """Each planned request's value over its threshold (`metric`'s, or the worst of every SLO's);
    inf for a failed, unmeasured or never-finished request."""
    def score(r: RequestRecord) -> float:
        if not r.success:
            return _least_score(r, (metric,) if metric is not None else slos)
        worst = 0.0
        for slo in (metric,) if metric is not None else slos:
            value = slo_value(r, slo)
            worst = max(worst, math.inf if value is None else value / slo.threshold_s)
        return worst

    return [score(r) for r in records] + [math.inf] * max(planned - len(records), 0)


def _least_score(r: RequestRecord, slos: Sequence[SLO]) -> float:
    """A request that did not succeed: inf, but for one cut while its level's queue was certainly
    rising (`sustain.QueueRising`), whose score is the least it can be: its TTFT and its E2E so far
    (`RequestRecord.least`), nothing for what it had not streamed yet."""
    if r.error != CUT_QUEUE_ERROR:
        return math.inf
    least = [value / slo.threshold_s for slo in slos if slo.metric in ("ttft", "e2e")
             and (value := r.least(slo.metric)) is not None]
    return max(least, default=0.0)


def _quantile(values: np.ndarray, weights: np.ndarray, q: float) -> float:
    """The weighted quantile `q` (inverted CDF: the value at or under which a share q lies)."""
    if values.size == 0:
        return math.inf
    order = np.argsort(values, kind="stable")
    cum = np.cumsum(weights[order]) / weights.sum()
    i = int(np.searchsorted(cum, min(max(q, 0.0), 1.0) - 1e-12))
    return float(values[order][min(i, values.size - 1)])


def _quantile_interval(values: np.ndarray, weights: np.ndarray, q: float) -> Ratio:
    """The quantile `q` with its distribution-free 95% interval: the quantiles at q -+ 1.96 sd of a
    binomial share among the n values."""
    half = Z95 * math.sqrt(q * (1 - q) / max(values.size, 1))
    return Ratio(_quantile(values, weights, q - half), _quantile(values, weights, q), _quantile(values, weights,
                                                                                                  q + half))


def _mean_interval(values: np.ndarray, weights: np.ndarray) -> Ratio:
    if not np.isfinite(values).all():
        return Ratio(math.inf, math.inf, math.inf)
    mean = float(np.average(values, weights=weights))
    spread = float(np.sqrt(np.average((values - mean) ** 2, weights=weights)))
    half = Z95 * spread / math.sqrt(max(values.size, 1))
    return Ratio(mean - half, mean, mean + half)


def slo_ratio(parts: Sequence[Weighted], slos: Sequence[SLO], attainment: float) -> Ratio | None:
    """The SLO ratio of a level made of `parts` (one part: the whole level), each part's requests
    weighted by its share over its planned count; None when no request was planned or no SLO set."""
    if not slos:
        return None
    criteria: list[tuple[SLO | None, str]] = [(None, f"p{attainment * 100:g}")]
    criteria += [(s, s.stat) for s in slos]
    ratios = []
    for metric, stat in criteria:
        values, weights = [], []
        for share, records, planned in parts:
            if planned > 0 and share > 0:
                mine = _scores(records, planned, slos, metric)
                values += mine
                weights += [share / planned] * len(mine)
        if not values:
            return None
        arr, w = np.asarray(values, dtype=float), np.asarray(weights, dtype=float)
        ratios.append(_mean_interval(arr, w) if stat == "mean" else _quantile_interval(arr, w, float(stat[1:]) / 100))
    return Ratio(max(r.low for r in ratios), max(r.value for r in ratios), max(r.high for r in ratios))


# -- where the next level goes ----------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Prediction:
    """Where the model says the SLO ratio crosses 1: `scale`, with its interval [low, high]."""

    scale: float
    low: float
    high: float


def _points(steps: Sequence[Step]) -> list[tuple[float, float, float, float]]:
    """(scale, headroom, headroom at the interval's high ratio, at its low ratio) per measured scale,
    a scale measured several times averaged; levels without a finite ratio (failed requests deciding
    the quantile, measured the client) are left out. An abandoned level's ratio is over the requests
    that finished before it was cut off: a lower bound, used where it is over 1."""
    by_scale: dict[float, list[Ratio]] = {}
    for s in steps:
        if s.slo_ratio is None or (s.client_overloaded and not s.passed):
            continue
        ratio = Ratio.from_list(s.slo_ratio)
        bound = s.abandoned or bool(s.ended)  # cut short: a lower bound, used over 1
        usable = ratio.value > 1 if bound else ratio.value > 0
        if math.isfinite(ratio.value) and usable:
            by_scale.setdefault(s.scale, []).append(ratio)
    out = []
    for scale, ratios in sorted(by_scale.items()):
        def mean_headroom(values: list[float]) -> float:
            return float(np.mean([1 / v if v > 0 else math.inf for v in values]))
        out.append((scale, mean_headroom([r.value for r in ratios]), mean_headroom([r.high for r in ratios]),
                    mean_headroom([r.low for r in ratios])))
    return out


def _crossing(a: tuple[float, float], b: tuple[float, float]) -> float | None:
    """Where the line through (scale, headroom) points a and b reaches headroom 1 (None: it never
    falls, or runs through an infinite headroom)."""
    (k1, h1), (k2, h2) = a, b
    if not (math.isfinite(h1) and math.isfinite(h2)) or k1 == k2 or h1 == h2:
        return None
    slope = (h2 - h1) / (k2 - k1)
    if slope >= 0:
        return None
    k = k1 + (1 - h1) / slope
    return k if k > 0 else None


def predict(steps: Sequence[Step]) -> Prediction | None:
    """The scale where the SLO ratio crosses 1, from the two measured levels nearest it (see the
    module's text); None with fewer than two usable levels or a headroom that does not fall."""
    points = _points(steps)
    if len(points) < 2:
        return None
    under = [p for p in points if p[1] >= 1]
    over = [p for p in points if p[1] < 1]
    if under and over:
        pair = (under[-1], over[0])
    elif under:
        pair = (under[-2], under[-1]) if len(under) >= 2 else (under[-1], under[-1])
    else:
        pair = (over[0], over[1]) if len(over) >= 2 else (over[0], over[0])
    a, b = pair
    mid = _crossing((a[0], a[1]), (b[0], b[1]))
    if mid is None:
        return None
    ends = [k for k in (_crossing((a[0], a[2]), (b[0], b[2])), _crossing((a[0], a[3]), (b[0], b[3])))
            if k is not None]
    return Prediction(mid, min([mid, *ends]), max([mid, *ends]))


def place(lo: float | None, hi: float | None, prediction: Prediction | None, precision: float, *,
          bisect: bool = False) -> tuple[float, str]:
    """The next level's scale in bracket [lo, hi] (None: that end not found yet) and the rule that
    placed it: "model", "bisection", "doubling" or "halving" (see the module's text). `bisect`:
    the last placed level did not halve the bracket; use the midpoint."""
    step = 1 + precision
    if lo is not None and hi is None:
        if prediction is None or prediction.scale <= lo:
            return lo * 2, "doubling"
        return min(max(prediction.scale * math.sqrt(step), lo * MIN_UP), lo * MAX_UP), "model"
    if hi is not None and lo is None:
        if prediction is None or prediction.scale >= hi:
            return hi / 2, "halving"
        return max(min(prediction.scale / math.sqrt(step), hi / MIN_UP), hi / MAX_UP), "model"
    assert lo is not None and hi is not None
    middle = math.sqrt(lo * hi)
    if prediction is None or bisect or hi / lo <= step or not lo < prediction.scale < hi:
        return middle, "bisection"  # no model, a model proven wrong, or one the outcomes contradict
    k = prediction.scale
    if k <= lo * step:
        return lo * step, "model"
    if k >= hi / step:
        return hi / step, "model"
    # Half the precision below the prediction, inside its interval and away from both ends.
    target = max(k / math.sqrt(step), prediction.low)
    return min(max(target, lo * math.sqrt(step)), hi / math.sqrt(step)), "model"


# -- repeats -------------------------------------------------------------------------------------------
def repeat_rule(step: Step, target: float) -> tuple[bool, str]:
    """Whether a bracket end needs a repeat, and the rule that decided (see the module's text);
    `target`: the attainment target."""
    if step.decided_by in TREND_TESTS:
        return False, f"clear: {step.decided_by}, decided on its 95% interval"
    if step.decided_by in (DecidedBy.LAST_THIRD, DecidedBy.LAST_THIRD_MISSES, DecidedBy.WINDOW_SHORT) \
            or step.undecided:
        return True, f"marginal: decided by {step.decided_by or 'an estimate'}"
    if step.abandoned:
        return _abandoned_rule(step, target)
    if step.slo_ratio is None:
        return True, "marginal: no SLO ratio measured"
    ratio = Ratio.from_list(step.slo_ratio)
    shown = f"SLO ratio {_shown(ratio.value)} [{_shown(ratio.low)}, {_shown(ratio.high)}]"
    if step.passed and ratio.high < 1:
        return False, f"clear pass: {shown} below 1"
    if not step.passed and ratio.low >= 1:
        return False, f"clear fail: {shown} above 1"
    return True, f"marginal: {shown} spans 1"


def wilson_top(p: float, n: int) -> float:
    """The top of the 95% (Wilson) interval of a share `p` of `n` requests."""
    n = max(n, 1)
    centre = (p + Z95 ** 2 / (2 * n)) / (1 + Z95 ** 2 / n)
    half = Z95 * math.sqrt(p * (1 - p) / n + Z95 ** 2 / (4 * n * n)) / (1 + Z95 ** 2 / n)
    return centre + half


def _abandoned_rule(step: Step, target: float) -> tuple[bool, str]:
    """An abandoned level's attainment is at most (planned - certain misses) / planned; it is a clear
    fail when even that bound's 95% interval (Wilson) stays under the target."""
    p = step.attainment
    top = wilson_top(p, step.planned)
    if top < target:
        return False, f"clear fail: abandoned, attainment <= {p:.0%} (95% up to {top:.0%}) under {target:.0%}"
    return True, f"marginal: abandoned at <= {p:.0%}, 95% up to {top:.0%} reaches {target:.0%}"


def _shown(value: float) -> str:
    return f"{value:.2f}" if math.isfinite(value) else "inf"
