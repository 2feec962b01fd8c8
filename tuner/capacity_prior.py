"""Where a trial's capacity search starts: a prediction from the trials this study has measured.

A configuration's capacity is most like that of the configurations whose knobs are nearest its own.
The distance between two sets of knob values is the sum over the knobs of: 1 where a categorical
knob differs (a knob one set lacks counts as differing), and for a numeric one the difference as a
share of the range the search space gives it (on a log scale where the space's is). The prediction
is the geometric mean of the two nearest trials' capacities, each weighted by 1 / (distance +
1/4) squared; a pruned trial stands for the middle of its bracket (the geometric mean of its highest pass,
or the lowest level searched, and the level it failed). With no trial measured yet, the reference's
capacity is the start (then the trace's own rate); once trials are known, the reference counts as
one more, differing from each in every knob (its knob values are the engine's, not the space's).
The prediction only places the first level of the search: every capacity is still measured and
bracketed (`capacity.search`).

Assumption: the trials this process measured (a worker of a shared study knows its own trials;
another worker's start from the reference, as before).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping

from tracetune.capacity.result import Verdict
from tracetune.search_spaces.space import Param, SearchSpace
from tracetune.types import Scalar

NEAREST = 2
SMOOTHING = 0.25  # added to a distance before weighting: one differing knob weighs 0.64, none 16


@dataclasses.dataclass(frozen=True)
class Known:
    """A measured trial's knob values and the capacity it stands for (x the trace's rate)."""

    number: int
    values: dict[str, Scalar | None]
    scale: float


@dataclasses.dataclass
class CapacityPrior:
    """The study's measured capacities, by knob values, and the start they predict."""

    space: SearchSpace
    fallback: float = 1.0  # the reference's capacity (or the trace's rate)
    known: list[Known] = dataclasses.field(default_factory=list)

    def add(self, number: int, values: Mapping[str, Scalar | None], capacity: Mapping[str, object] | None,
            min_scale: float) -> None:
        """Remember trial `number`'s capacity (a stored `CapacityResult`), if it has one."""
        scale = stands_for(capacity, min_scale)
        if scale is not None:
            self.known.append(Known(number, dict(values), scale))

    def start(self, values: Mapping[str, Scalar | None]) -> tuple[float, str]:
        """The predicted capacity of a configuration with `values`, and where it came from."""
        if not self.known:
            return self.fallback, "the reference's capacity"
        # The reference's knob values are not the space's: it stands as one that differs in every knob.
        reference = [Known(-1, {}, self.fallback)] if self.fallback > 0 else []
        ranked = sorted([*self.known, *reference], key=lambda k: self.distance(values, k.values))[:NEAREST]
        weights = [(self.distance(values, k.values) + SMOOTHING) ** -2 for k in ranked]
        log_scale = sum(w * math.log(k.scale) for w, k in zip(weights, ranked)) / sum(weights)
        names = " and ".join("the reference" if k.number < 0 else f"trial {k.number}" for k in ranked)
        return math.exp(log_scale), f"predicted from the nearest measured: {names}"

    def distance(self, a: Mapping[str, Scalar | None], b: Mapping[str, Scalar | None]) -> float:
        return sum(_knob_distance(self.space.parameters.get(name), a.get(name), b.get(name))
                   for name in set(a) | set(b))


def stands_for(capacity: Mapping[str, object] | None, min_scale: float) -> float | None:
    """The capacity a stored result stands for (x the trace's rate): its highest pass, or for a
    pruned search the middle of its bracket; None without a bracket or a capacity above 0, and for a
    pruned search with no failed level (outside the quality gate: measured at the trace's rate only)."""
    if not capacity:
        return None
    low = _number(capacity.get("capacity_scale"))
    bracket = capacity.get("bracket_scale")
    high = _number(bracket[1]) if isinstance(bracket, list) and len(bracket) > 1 else None
    if capacity.get("verdict") == Verdict.PRUNED:
        return math.sqrt(max(low or 0.0, min_scale) * high) if high else None
    return low if low else None


def _number(value: object) -> float | None:
    return float(value) if isinstance(value, int | float) and math.isfinite(value) else None


def _knob_distance(param: Param | None, a: Scalar | None, b: Scalar | None) -> float:
    """One knob's share of the distance (see the module's text)."""
    if a == b:
        return 0.0
    numeric = isinstance(a, int | float) and isinstance(b, int | float) and not isinstance(a, bool) \
        and not isinstance(b, bool)
    if not numeric or param is None:
        return 1.0
    assert isinstance(a, int | float) and isinstance(b, int | float)
    ends: list[object] = list(param.choices) if param.choices else [param.low, param.high]
    values = [float(v) for v in ends if isinstance(v, int | float)]
    low, high = min(values, default=0.0), max(values, default=0.0)
    if param.log and low > 0 and a > 0 and b > 0 and high > low:
        return min(abs(math.log(a / b)) / math.log(high / low), 1.0)
    return min(abs(a - b) / (high - low), 1.0) if high > low else 1.0
