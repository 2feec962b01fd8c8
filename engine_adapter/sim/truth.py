"""The truth a study on the simulated engine is held against: each configuration's true capacity and
quality loss, and the true front of a set of them.

A configuration's capacity is judged by a `Judge` handed in: the trace, the SLO and the level rules
live on floors above this package, so the caller builds it, e.g. from `capacity.virtual.true_capacity`
(the highest load whose whole-trace replay passes tune's own level rules, on the model the
configuration serves by):

    judge = lambda model: true_capacity(requests, CapacityOptions(slos=...), model).rps
    front = true_front(true_points(grid(SLOTS, PRECISIONS), judge))

Its quality loss is its precision's (`model.PRECISIONS`), which the quality probe measures exactly."""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Callable, Iterable, Sequence

from tracetune.engine_adapter.sim.config import SimConfig, SimPrecision, loss_nats, model_of
from tracetune.engine_adapter.sim.model import SimModel

# A queueing model -> the capacity it has (requests/s, or any unit the caller compares in).
Judge = Callable[[SimModel], float]


@dataclasses.dataclass(frozen=True)
class TruePoint:
    """One configuration's truth: its capacity (the judge's unit) and its mean NLL increase a token."""

    config: SimConfig
    capacity: float
    quality_loss_nats: float

    @property
    def ppl_change(self) -> float:
        return math.expm1(self.quality_loss_nats)

    def beats(self, other: TruePoint) -> bool:
        """At least as good on both, better on one (higher capacity, lower loss)."""
        return (self.capacity >= other.capacity and self.quality_loss_nats <= other.quality_loss_nats
                and (self.capacity > other.capacity or self.quality_loss_nats < other.quality_loss_nats))


def grid(slots: Sequence[int], precisions: Sequence[SimPrecision], base: SimConfig | None = None) -> list[SimConfig]:
    """Every configuration of `slots` x `precisions` on top of `base` (default: the simulator's defaults)."""
    base = base or SimConfig()
    return [base.model_copy(update={"max_num_seqs": n, "dtype": p}) for n, p in itertools.product(slots, precisions)]


def true_point(config: SimConfig, judge: Judge) -> TruePoint:
    return TruePoint(config=config, capacity=judge(model_of(config)), quality_loss_nats=loss_nats(config))


def true_points(configs: Iterable[SimConfig], judge: Judge) -> list[TruePoint]:
    """Each configuration's truth; configurations serving by the same model are judged once."""
    judged: dict[SimModel, float] = {}
    out = []
    for config in configs:
        model = model_of(config)
        if model not in judged:
            judged[model] = judge(model)
        out.append(TruePoint(config=config, capacity=judged[model], quality_loss_nats=loss_nats(config)))
    return out


def true_front(points: Sequence[TruePoint], max_loss_nats: float = math.inf) -> list[TruePoint]:
    """The points within `max_loss_nats` that no other point within it beats, by capacity (highest first)."""
    kept = [p for p in points if p.quality_loss_nats <= max_loss_nats]
    front = [p for p in kept if not any(q.beats(p) for q in kept)]
    return sorted(front, key=lambda p: (-p.capacity, p.quality_loss_nats))
