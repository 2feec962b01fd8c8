"""How a trial ends: the objective computes an `Outcome` and `TrialEnd.record` records it, in one fixed
order (as Optuna's `_run_trial` decides a state and one `_tell` records it): the results row first, then
the trial's attributes (`TrialRecord`, its status last), then the reporter; it returns what the sampler
is told.

Why the row first: a trial's status attribute marks it ended (it counts toward --trials and is not queued
again); written last, a worker killed while recording leaves a trial without status, which is measured
again, never one that counts without its row.

Why infeasible trials are not Optuna FAILs: NSGA-II, TPE and GP drop FAIL trials, so the sampler would keep
proposing configurations that cannot run. Instead the trial is COMPLETE with penalty values
(`penalty_values`: worst measured so far, zero throughput) and a positive value for every constraint
(`set_constraints`); NSGA-II ranks such a trial below every feasible one, TPE puts it in its "bad" group,
GP models its feasibility, so the search moves away from it. The Pareto front only takes measured,
feasible trials. The tracetune status, the reason and the log tail stay in the trial's user attributes
and in the results table.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING

from tracetune.stored import listed, mapping
from tracetune.tuner.objectives import FAILED_VIOLATION, feasible, penalty_values, set_constraints
from tracetune.tuner.reporter import Reporter
from tracetune.tuner.runner import Measurement
from tracetune.tuner.secrets import Redactor
from tracetune.tuner.settings import StudySettings
from tracetune.tuner.storage import ResultStore, Status
from tracetune.tuner.trial_record import ParamValue, TrialRecord

if TYPE_CHECKING:
    import optuna

    from tracetune.engine_adapter.kind import EngineKind


@dataclasses.dataclass
class Attempt:
    """One trial as it runs: its sampled values, its engine config (None until translated) and when it began."""

    number: int
    values: Mapping[str, ParamValue]
    t0: float = dataclasses.field(default_factory=time.perf_counter)
    config: dict[str, object] | None = None


@dataclasses.dataclass(frozen=True)
class Measured:
    """Measured within the engine's means (it may still violate a constraint): MEASURED, or PRUNED when its
    capacity search stopped early (the sampler learns its values; the front never takes it)."""

    measurement: Measurement
    objectives: list[float]
    constraints: list[float]  # the SLOs' and the quality gate's (<= 0: kept)
    status: Status = Status.MEASURED
    reason: str | None = None  # why it was pruned, or why it is measured but not meaningful
    not_meaningful: str | None = None


@dataclasses.dataclass(frozen=True)
class Reused:
    """The same configuration as trial `original`, which was measured: its values, nothing measured again."""

    original: int
    objectives: list[float]
    constraints: list[float]
    error_rate: float
    error_examples: list[str]
    note: str


@dataclasses.dataclass(frozen=True)
class Infeasible:
    """No usable measurement: rejected before start, could not be prepared, the engine failed, the client
    could not keep the schedule, an objective was NaN, or a duplicate of such a trial."""

    status: Status
    reason: str
    log_tail: str = ""
    measurement: Measurement | None = None  # what was measured, when something was (stored with the row)
    duplicate_of: int | None = None
    not_meaningful: str | None = None


Outcome = Measured | Reused | Infeasible


class TrialEnd:
    """Records trials' outcomes for one study: its results rows, its trials' attributes, its reporter."""

    def __init__(self, settings: StudySettings, store: ResultStore, reporter: Reporter, redact: Redactor,
                 engine: EngineKind | None = None) -> None:
        self.settings = settings
        self.store = store
        self.reporter = reporter
        self.redact = redact
        self.engine = engine  # the study's engine kind: the slots of a config (None: none known)

    def record(self, trial: optuna.trial.Trial, attempt: Attempt, outcome: Outcome,
               reference_values: list[float] | None) -> list[float]:
        """Store `outcome`'s row, set its attributes, tell the reporter; the values the sampler is told."""
        wall_s = time.perf_counter() - attempt.t0
        outcome = self._explained(trial, attempt, outcome)
        self._store(attempt, outcome, wall_s)
        self._attributes(trial, outcome)
        self._report(attempt, outcome, wall_s)
        if isinstance(outcome, Infeasible):
            return penalty_values(trial.study, self.settings.objectives, reference_values)
        return outcome.objectives

    def _explained(self, trial: optuna.trial.Trial, attempt: Attempt, outcome: Outcome) -> Outcome:
        """A measured trial's failed load levels with their causes (`capacity.causes`) on its stored
        capacity steps; a pruned trial's reason then ends with the cause of the level it failed."""
        if not isinstance(outcome, Measured) or not outcome.measurement.levels:
            return outcome
        summary = outcome.measurement.summary
        if not summary.capacity:
            return outcome
        from tracetune.capacity.causes import explain_steps
        from tracetune.engine_adapter.metrics import EngineMetrics
        from tracetune.tuner.incumbents import with_cause

        steps = [mapping(s) for s in listed(summary.capacity.get("steps"))]
        engine = EngineMetrics.from_dict(summary.engine) if summary.engine else None
        causes = explain_steps(steps, outcome.measurement.levels, self.settings.slos,
                               slots=self._slots(attempt.config), trace_rate_engine=engine)
        summary.capacity = {**summary.capacity, "steps": [{**s, "cause": c or s.get("cause") or ""}
                                                          for s, c in zip(steps, causes)]}
        if outcome.status != Status.PRUNED:
            return outcome
        return dataclasses.replace(outcome, reason=with_cause(outcome.reason or "", summary.capacity))

    def _store(self, attempt: Attempt, outcome: Outcome, wall_s: float) -> None:
        name, number = self.settings.study_name, attempt.number
        values, config = dict(attempt.values), attempt.config
        if isinstance(outcome, Reused):
            self.store.save_trial(name, number, Status.DUPLICATE, values=values, config=config,
                                  failure_reason=outcome.note, wall_s=wall_s)
            return
        reason = outcome.reason if isinstance(outcome, Measured) else self.redact(outcome.reason)
        if outcome.measurement is None:
            assert isinstance(outcome, Infeasible)
            self.store.save_trial(name, number, outcome.status, values=values, config=config,
                                  failure_reason=reason, log_tail=outcome.log_tail, wall_s=wall_s)
            return
        self.store.save_trial(name, number, outcome.status, values=values, config=config, wall_s=wall_s,
                              failure_reason=reason, **outcome.measurement.stored())
        self.store.save_levels(name, number, outcome.measurement.levels)

    def _attributes(self, trial: optuna.trial.Trial, outcome: Outcome) -> None:
        """The trial's attributes, and the constraints its sampler sees (`set_constraints`)."""
        names = self.settings.constraint_names
        if isinstance(outcome, Infeasible):
            failed = [FAILED_VIOLATION] * self.settings.n_user_constraints
            set_constraints(trial, names, [FAILED_VIOLATION, *failed])
            TrialRecord(failure_reason=self.redact(outcome.reason), feasible=False, constraints=failed,
                        log_tail=self.redact(outcome.log_tail[-4000:]) if outcome.log_tail else None,
                        duplicate_of=outcome.duplicate_of, not_meaningful=outcome.not_meaningful,
                        status=outcome.status).write(trial)
            return
        if isinstance(outcome, Measured):
            summary = outcome.measurement.summary
            error_rate, examples = summary.error_rate, list(summary.error_examples)
            duplicate_of, status = None, outcome.status
            kept = status == Status.MEASURED and outcome.not_meaningful is None  # else off every front
        else:
            error_rate, examples = outcome.error_rate, outcome.error_examples
            duplicate_of, status, kept = outcome.original, Status.DUPLICATE, False  # the original is on the front
        set_constraints(trial, names, [error_rate, *outcome.constraints])
        reason = outcome.reason if isinstance(outcome, Measured) and status == Status.PRUNED else None
        if reason is None and error_rate > 0:
            # Failed requests (e.g. timed out) make the measurement biased toward the survivors:
            # kept, but infeasible, with the reason.
            reason = self.redact(f"{error_rate:.0%} of requests failed, e.g. {examples[:1]}")
        if reason is None and isinstance(outcome, Measured):
            reason = outcome.not_meaningful
        TrialRecord(failure_reason=reason, feasible=kept and feasible(error_rate, outcome.constraints),
                    constraints=list(outcome.constraints), duplicate_of=duplicate_of,
                    not_meaningful=outcome.not_meaningful if isinstance(outcome, Measured) else None,
                    status=status).write(trial)

    def _report(self, attempt: Attempt, outcome: Outcome, wall_s: float) -> None:
        number = attempt.number
        if isinstance(outcome, Reused):
            self.reporter.on_duplicate(number=number, original=outcome.original)
        elif isinstance(outcome, Infeasible) and outcome.status == Status.DUPLICATE:
            self.reporter.on_duplicate(number=number, original=outcome.duplicate_of,
                                       reason=self.redact(outcome.reason))
        elif isinstance(outcome, Infeasible):
            self.reporter.on_trial_failed(number=number, status=outcome.status, reason=self.redact(outcome.reason))
        elif outcome.status == Status.PRUNED:
            self.reporter.on_trial_pruned(number=number, reason=outcome.reason or "", wall_s=wall_s,
                                          summary=outcome.measurement.summary)
        else:
            measurement = outcome.measurement
            self.reporter.on_trial_done(number=number, objectives=dict(zip(self.settings.objectives,
                                                                           outcome.objectives)),
                                        constraints=outcome.constraints, summary=measurement.summary,
                                        quality=measurement.quality, wall_s=wall_s, startup_s=measurement.startup_s)

    def _slots(self, config: Mapping[str, object] | None) -> int | None:
        """The slots of a trial's config, as the study's engine says them; None: not known."""
        return self.engine.slots_of(config) if self.engine is not None and config else None
