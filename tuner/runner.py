"""The seam between the study and whatever measures a configuration: a `TrialRunner` is handed to the
`Tuner` (as Optuna hands a sampler to a study) and returns a `Measurement`. The engine-backed runner is
`tuner.measure.EngineRunner`; tests hand in a scripted one."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol, TypedDict

from tracetune.quality.probe import QualityResult, Reference, StoredQuality
from tracetune.replay.metrics import Summary
from tracetune.replay.types import RequestRecord

if TYPE_CHECKING:
    from tracetune.engine_adapter.kind import EngineConfig

# prune(summary, quality, gpus, base_rps) -> the load level at which a capacity search may stop early
# (`capacity.search.search_capacity`'s `prune_at`), from what the trial measured so far; None: never.
PruneAt = Callable[[Summary, "QualityResult | None", int, float], "float | None"]
# A level a capacity search measured: (scale, is it a repeat, its request records).
Level = tuple[float, bool, list[RequestRecord]]


@dataclasses.dataclass(frozen=True)
class QualityProbe:
    """What a run's quality probe compares against. `reference` None: this run measures the
    reference's continuations (`Measurement.reference`). `known(quality_key)` -> (trial number,
    stored quality) of a configuration already probed with the same quality key, or None."""

    reference: Reference | None = None
    reference_config: dict[str, object] | None = None  # for `quality.lossless_by_construction`
    known: Callable[[str], tuple[int, StoredQuality] | None] = lambda key: None


class StoredColumns(TypedDict):
    """A trial row's measured columns (`ResultStore.save_trial` keywords), as JSON-ready values."""

    summary: dict[str, object]
    quality: StoredQuality | None
    engine: dict[str, float] | None
    requests_jsonl: str
    log_tail: str
    startup_s: float


@dataclasses.dataclass(frozen=True)
class Measurement:
    """What measuring one configuration returned."""

    summary: Summary
    quality: QualityResult | None
    startup_s: float
    requests_jsonl: str = ""  # the trace-rate replay's request records, one JSON per line
    log_tail: str = ""
    levels: tuple[Level, ...] = ()  # every load level of a capacity search, in search order
    reference: Reference | None = None  # the reference continuations, when this run measured them
    # Why the quality probe was not run although asked for ("": it ran, or was not asked for):
    # the run had already missed the study's SLOs at the trace's rate (`tuner.measure`).
    quality_skipped: str = ""

    def stored(self) -> StoredColumns:
        """The trial row's measured columns (`ResultStore.save_trial` keywords), as JSON-ready values."""
        return {"summary": self.summary.as_dict(), "quality": self.quality.as_dict() if self.quality else None,
                "engine": self.summary.engine, "requests_jsonl": self.requests_jsonl, "log_tail": self.log_tail,
                "startup_s": self.startup_s}


class TrialRunner(Protocol):
    """Measures one configuration (the reference under the label "reference", a trial under
    "trial-NNNN"); raises `errors.EngineError` when the engine fails (a failed trial, not a
    failed study)."""

    def measure(self, config: EngineConfig, label: str, *, probe: QualityProbe | None, start: float = 1.0,
                prune: PruneAt | None = None) -> Measurement:
        """`probe` None: no quality probe. `start`: the load level (x the trace's rate) where a
        capacity search starts."""
        ...
