"""What a study tells whoever watches it: one method per event the tuner (`tuner.study.Tuner`) and its
engine runs (`tuner.measure.EngineRunner`) emit. The console (`cli.reporter.ConsoleReporter`)
implements it; `NullReporter` hears nothing. The tuner always passes fields by keyword."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from tracetune.capacity.step import CapacityResult, Step
    from tracetune.engine_adapter.kind import EngineConfig
    from tracetune.quality.probe import QualityResult
    from tracetune.replay.acceptance import Acceptance
    from tracetune.replay.metrics import Estimate, Summary
    from tracetune.tuner.trial_record import ParamValue

    Params = Mapping[str, ParamValue]  # a trial's sampled values (`search_spaces.space.SearchSpace.sample`)


class Reporter(Protocol):
    """Progress of a study, for display (each method returns nothing; none needs to be implemented:
    the protocol's own bodies ignore the event, so a reporter may subclass it and show only some)."""

    # -- the study ------------------------------------------------------------------------------
    def on_study(self, *, name: str, done: int, remaining: int) -> None:
        return None

    def on_retries_first(self, *, trials: list[tuple[int, int, dict[str, ParamValue]]]) -> None:
        return None

    def on_warm_start(self, *, configs: list[dict[str, ParamValue]]) -> None:
        return None

    def on_presets(self, *, configs: list[dict[str, ParamValue]]) -> None:
        return None

    def on_reference_start(self, *, config: EngineConfig) -> None:
        return None

    def on_reference_reused(self) -> None:
        return None

    def on_reference_done(self, *, summary: Summary, quality: QualityResult | None) -> None:
        return None

    def on_waiting(self, *, what: str, owner: str, trial: int | None) -> None:
        return None

    def on_timeout(self, *, limit_s: float, done: int, trials: int) -> None:
        return None

    def on_converged(self, *, patience: int, done: int, trials: int) -> None:
        return None

    def on_recovered(self, *, trials: list[int]) -> None:
        return None

    # -- one trial ------------------------------------------------------------------------------
    def on_trial_start(self, *, number: int, values: Params, config: EngineConfig) -> None:
        return None

    def on_trial_done(self, *, number: int, objectives: dict[str, float], constraints: list[float], summary: Summary,
                      quality: QualityResult | None, wall_s: float, startup_s: float) -> None:
        return None

    def on_trial_failed(self, *, number: int, status: str, reason: str) -> None:
        return None

    def on_trial_pruned(self, *, number: int, reason: str, wall_s: float,
                        summary: Summary | None = None) -> None:
        return None

    def on_duplicate(self, *, number: int, original: int | None, reason: str | None = None) -> None:
        return None

    # -- one engine run -------------------------------------------------------------------------
    def on_engine_starting(self, *, label: str) -> None:
        return None

    def on_engine_ready(self, *, label: str, startup_s: float) -> None:
        return None

    def on_client_overloaded(self, *, label: str, procs: int, lag_p99_s: float) -> None:
        return None

    def on_capacity_window(self, *, text: str) -> None:
        return None

    def on_capacity_step(self, *, label: str, step: Step) -> None:
        return None

    def on_capacity_done(self, *, label: str, capacity: CapacityResult) -> None:
        return None

    def on_quality(self, *, label: str) -> None:
        return None

    def on_quality_reused(self, *, label: str, trial: int) -> None:
        return None

    def on_skipped(self, *, label: str, reason: str) -> None:
        """A part of a trial's measurement was not run (`tuner.measure`: the quality probe, the capacity
        search beyond the trace's rate): `reason` says what and why."""
        return None

    def on_probe_noisy(self, *, label: str, kld: Estimate | None, beyond: dict[str, Estimate] | None) -> None:
        return None

    def on_acceptance(self, *, label: str, done: int, total: int) -> None:
        """The acceptance probe of a speculative trial (`replay.acceptance`): `done` of `total` prompts."""
        return None

    def on_acceptance_done(self, *, label: str, acceptance: Acceptance) -> None:
        return None

    def replay_progress(self, done: int, total: int, in_flight: int) -> None:
        return None


class NullReporter(Reporter):
    """A `Reporter` that ignores every event (the protocol's methods do nothing); a reporter that
    shows only some events can start from it."""
