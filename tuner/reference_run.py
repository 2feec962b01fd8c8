"""vLLM's defaults (the engine's reference configuration) in a study: measured once per study (reused
on resume, and by every other worker: the first one claims it, the others wait for its row), the
reference continuations every trial's quality probe compares against, its objective values (a front
candidate) and its capacity, where trials start their capacity search."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from tracetune.errors import TuneError
from tracetune.quality.probe import Reference, StoredQuality, quality_key
from tracetune.replay.metrics import Summary
from tracetune.tuner.coordination import Coordinator
from tracetune.tuner.measure import machine_busy_reason
from tracetune.tuner.objectives import objective_value
from tracetune.tuner.reporter import Reporter
from tracetune.tuner.runner import QualityProbe, TrialRunner
from tracetune.tuner.settings import StudySettings
from tracetune.tuner.storage import REFERENCE_RUN, ResultStore, Status

if TYPE_CHECKING:
    from tracetune.engine_adapter.kind import EngineConfig


class ReferenceRun:
    """The study's reference: its config, continuations, objective values and capacity, once known."""

    def __init__(self, settings: StudySettings, *, store: ResultStore, coord: Coordinator, runner: TrialRunner,
                 reporter: Reporter) -> None:
        self.settings, self.store, self.coord, self.runner, self.reporter = settings, store, coord, runner, reporter
        self.reference: Reference | None = None  # the continuations quality probes compare against
        self.config: EngineConfig | None = None  # the engine's settings model (engine.config_model)
        self.values: list[float] | None = None  # its objective values (quality loss 0 by definition)
        self.capacity: float | None = None  # its capacity level k
        self.quality_known: dict[str, tuple[int, StoredQuality]] = {}  # quality key -> (trial, quality) probed here

    def ensure(self, config: EngineConfig) -> None:
        """Measure the reference `config` unless the study has it (stored, or claimed by another worker)."""
        name = self.settings.study_name
        self.config = config
        stored = self.store.reference(name)
        if stored is None:
            holder = self.coord.claim_or_wait("reference", REFERENCE_RUN, "the reference")
            stored = self.store.reference(name)
            if stored is None and holder is not None:
                raise TuneError("the reference claim is marked done but no reference is stored; "
                                "delete the study's tracetune_claims row 'reference' and run again")
        if stored is None:
            self._measure(config)
            return
        probe = stored.get("probe")
        self.reference = Reference.from_json(probe) if probe else None  # none: a study that measures no quality
        summary = stored.get("summary")
        if summary:
            self.set_values(summary)
        self.reporter.on_reference_reused()

    def _measure(self, config: EngineConfig) -> None:
        name = self.settings.study_name
        self.reporter.on_reference_start(config=config)
        config_json = json.loads(config.model_dump_json())
        with self.coord.measuring("reference", REFERENCE_RUN):
            measured = self.runner.measure(config, "reference", probe=self.probe())
            busy = machine_busy_reason(measured.summary)
            if busy:  # every trial is compared with it: a lower bound is no reference (nothing stored)
                raise TuneError(f"the reference could not be measured: {busy}")
            self.reference = measured.reference
            assert self.reference is not None or not self.settings.measures_quality, \
                "the reference's run measures its continuations"
            self.store.save_reference(name, config=config_json,
                                      probe=None if self.reference is None else self.reference.as_dict(),
                                      summary=measured.summary.as_dict())
            self.store.save_trial(name, REFERENCE_RUN, Status.MEASURED, config=config_json, **measured.stored())
            self.store.save_levels(name, REFERENCE_RUN, measured.levels)
        self.set_values(measured.summary)
        self.reporter.on_reference_done(summary=measured.summary, quality=measured.quality)

    def probe(self) -> QualityProbe | None:
        """What this study's quality probes compare against, and the qualities it already knows; None
        in a study that measures no quality (`StudySettings.measures_quality`)."""
        if not self.settings.measures_quality:
            return None
        config = None if self.config is None else json.loads(self.config.model_dump_json())
        return QualityProbe(reference=self.reference, reference_config=config, known=self._known_quality)

    def _known_quality(self, key: str) -> tuple[int, StoredQuality] | None:
        """(trial, quality) of a configuration with this quality key probed by this worker, or stored
        by any (another worker's, or before a resume)."""
        return self.quality_known.get(key) or next(
            ((n, q) for n, c, q in self.store.measured_qualities(self.settings.study_name) if quality_key(c) == key),
            None)

    @property
    def capacity_start(self) -> float:
        """Where a trial's capacity search starts: the reference's capacity (most configurations
        land near it, so the bracket closes in a few levels), else the trace's own rate."""
        capacity = self.settings.capacity
        if capacity is None or not self.capacity:
            return 1.0
        return min(max(self.capacity, capacity.min_scale), capacity.max_scale)

    def set_values(self, summary: Summary | dict[str, object]) -> None:
        """The reference as a candidate: its objective values (quality loss 0 by definition) and its
        capacity level, where trials start their capacity search. `summary` as measured, or as stored."""
        if not isinstance(summary, Summary):
            summary = Summary.from_dict(summary)
        self.values = [objective_value(n, summary, None) if n != "quality_loss" else 0.0
                       for n in self.settings.objectives]
        scale = (summary.capacity or {}).get("capacity_scale")
        self.capacity = float(scale) if isinstance(scale, int | float) and scale else None
