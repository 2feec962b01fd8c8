"""The tuning study: Optuna multi-objective search over real engine configurations.

Each trial samples a config from the search space, starts the engine, replays the trace, probes
quality against the reference, stops the engine, and reports the objectives. The objective computes
the trial's outcome (`tuner.trial_end`: measured, reused, infeasible) and one function records it:
configs that cannot run are data, rejected (before any engine starts) and crashed/timed-out engines
end as *infeasible* trials with the reason and log tail stored (`tuner.trial_end` says why they are
not FAIL); SLO and quality-gate violations are constraints the sampler sees (`constraints_func`).
Everything measured goes to the study's SQL database.

Reliability: the study lives in an Optuna `RDBStorage` with a heartbeat, so a trial whose worker
was killed (SIGKILL included) is failed and retried with the same parameters
(`RetryHeartbeatStaleTrialCallback`). Several workers may share one study: the reference and
every configuration are claimed through a database row (`tuner.coordination.Claims`), so nothing is
measured twice; a worker that draws a configuration already measured reuses that result.

Parts: `tuner/settings.py` (StudySettings), `tuner/optuna_study.py` (opening, annotating and queueing
the Optuna study), `tuner/runner.py` (the `TrialRunner` seam and its `Measurement`), `tuner/measure.py`
(`EngineRunner`: one engine run: start, replay or capacity search, quality probe, stop),
`tuner/trial_end.py` (a trial's outcome and its one recording), `tuner/trial_record.py` (a trial's
Optuna attributes), `tuner/reporter.py` (the `Reporter` of events), `tuner/coordination.py` (storage
with its heartbeat, claims, what counts, recovery), `tuner/objectives.py` (objectives, constraints,
samplers), `quality/probe.py`, `tuner/front.py` (the front with the reference competing),
`tuner/storage.py` (tracetune's tables), `tuner/secrets.py` (what is never stored).
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from tracetune.capacity.step import Verdict
from tracetune.engine_adapter.choice import ENGINE, defaults_of
from tracetune.engine_adapter.platform import Platform
from tracetune.engine_adapter.registry import EngineKind, engine_kind
from tracetune.errors import EngineError, Rejected, TuneError
from tracetune.quality.probe import QualityResult
from tracetune.replay.metrics import Summary
from tracetune.replay.trace import Trace
from tracetune.search_spaces.space import SearchSpace, Value
from tracetune.tuner.capacity_prior import CapacityPrior
from tracetune.tuner.coordination import Coordinator, config_key, counted, running, skipped
from tracetune.tuner.front import Candidate, Plateau, not_meaningful, slo_misses
from tracetune.tuner.incumbents import front_labels, prune_rival, pruned_reason
from tracetune.tuner.measure import client_overload_reason, machine_busy_reason
from tracetune.tuner.objectives import (
    FAILED_VIOLATION,
    constraint_values,
    objective_value,
    outside_gate,
    penalty_values,
)
from tracetune.tuner.optuna_study import open_study, queue_first_trials, report_retries
from tracetune.tuner.reference_run import ReferenceRun
from tracetune.tuner.reporter import NullReporter, Reporter
from tracetune.tuner.runner import Measurement, TrialRunner
from tracetune.tuner.secrets import Redactor
from tracetune.tuner.settings import StudySettings
from tracetune.tuner.storage import ResultStore, Status
from tracetune.tuner.trial_end import Attempt, Infeasible, Measured, Outcome, Reused, TrialEnd
from tracetune.tuner.trial_record import TrialRecord
from tracetune.tuner.worker_name import worker_name

if TYPE_CHECKING:
    import optuna
    from optuna.storages import RDBStorage

    from tracetune.engine_adapter.kind import EngineConfig

__all__ = ["Measurement", "NullReporter", "Reporter", "StudySettings", "TrialRunner", "Tuner"]


class Tuner:
    """Runs one study: samples configurations, has its `runner` measure them (a `TrialRunner`, as Optuna
    hands a sampler to a study), stores what was measured and tells its `report`er (a `Reporter`).
    The command line hands it an `EngineRunner` (tuner.measure), which starts real engines."""

    def __init__(self, settings: StudySettings, *, trace: Trace, space: SearchSpace, model_dir: Path,
                 platform: Platform, runner: TrialRunner, report: Reporter | None = None,
                 base: Mapping[str, object] | None = None, make_checkpoint: Callable[[str], Path] | None = None,
                 engine: EngineKind | None = None) -> None:
        self.settings = settings
        self.engine = engine or engine_kind()  # which engine the study starts (engine_adapter.registry)
        self.reporter = report if report is not None else NullReporter()
        self.runner = runner  # measures one configuration (tuner.measure.EngineRunner starts real engines)
        self.trace = trace
        self.space = space
        self.model_dir = model_dir
        self.platform = platform
        self.base = base or {}
        self.make_checkpoint = make_checkpoint
        self.redact = Redactor(settings.secrets + ([settings.api_key] if settings.api_key else []))
        self.store = ResultStore(settings.storage_url, redact=self.redact)
        self.coord = Coordinator(self.store, study_name=settings.study_name, heartbeat_s=settings.heartbeat_s,
                                 reporter=self.reporter)
        self.worker = self.coord.worker
        self.worker_name = worker_name()  # kept on each trial it measures: the dashboard shows who measured what
        self.ending = TrialEnd(settings, self.store, self.reporter, self.redact,  # records every trial's outcome
                               engine=self.engine)
        self.ref = ReferenceRun(settings, store=self.store, coord=self.coord, runner=runner, reporter=self.reporter)
        self._rival: Candidate | None = None  # what the running trial's capacity search may stop at (prune_level)
        self.prior = CapacityPrior(space)  # where each trial's capacity search starts (tuner.capacity_prior)

    # -- the reference (tuner.reference_run) ----------------------------------------------------
    def ensure_reference(self) -> None:
        """Measure the engine's reference configuration once per study (`ReferenceRun.ensure`)."""
        reference_of = self.engine.reference
        assert reference_of is not None, "a tuned engine is tunable (cli.tune checks)"
        self.ref.ensure(reference_of(fixed=self.space.fixed, model_dir=self.model_dir, base=self.base))

    @property
    def reference_values(self) -> list[float] | None:
        """The reference's objective values, once measured (or read back): a front candidate."""
        return self.ref.values

    # -- the Optuna objective ------------------------------------------------------------------
    def objective(self, trial: optuna.trial.Trial) -> list[float]:
        """One trial: its outcome computed (`_measure`, `_reused`, or infeasible before any engine
        starts), then recorded in one place (`TrialEnd.record`)."""
        defaults = TrialRecord.of(trial).defaults_of  # another engine's own defaults (`queue_first_trials`)
        attempt = Attempt(trial.number, self._sample(trial, defaults))
        TrialRecord(values=attempt.values, worker=self.worker, worker_name=self.worker_name).write(trial)
        try:
            config = self._config(attempt.values, defaults)
        except Rejected as exc:
            return self._end(trial, attempt, Infeasible(Status.REJECTED, f"rejected before start: {exc}"))
        except TuneError as exc:  # e.g. the quantized checkpoint could not be made
            return self._end(trial, attempt, Infeasible(Status.FAILED, f"could not prepare this config: {exc}"))
        attempt.config = self.redact(json.loads(config.model_dump_json()))
        TrialRecord(config=attempt.config).write(trial)
        key = config_key(attempt.config)
        holder = self.coord.claim_or_wait(key, trial.number, f"trial {trial.number}'s configuration")
        if holder is not None:
            return self._end(trial, attempt, self._reused(holder["trial_number"]))
        with self.coord.measuring(key, trial.number):  # done once the outcome's row is stored
            return self._end(trial, attempt, self._measure(trial, config, attempt))

    def _sample(self, trial: optuna.trial.Trial, defaults: str | None) -> dict[str, Value | None]:
        """The trial's values: sampled from the space, or (an engine's own defaults) the engine alone, as
        queued (the space's own choices: Optuna keeps one distribution per parameter)."""
        if defaults is None or ENGINE not in self.space.parameters:
            return self.space.sample(trial)
        return {ENGINE: trial.suggest_categorical(ENGINE, self.space.parameters[ENGINE].choices or [defaults])}

    def _config(self, values: Mapping[str, object], defaults: str | None) -> EngineConfig:
        """The engine settings of a trial's values, or the own defaults of the engine `defaults` names."""
        if defaults is not None:
            engine = next((k for k in self.engine.engines if k.name == defaults), None)
            if engine is None:
                raise Rejected([f"this study runs {self.engine.shown}, not {defaults}"])
            return defaults_of(engine, fixed=self.space.fixed, model_dir=self.model_dir, base=self.base)
        translate = self.engine.translate
        assert translate is not None, "a tuned engine is tunable (cli.tune checks)"
        return translate(dict(values), fixed=self.space.fixed, platform=self.platform, model_dir=self.model_dir,
                         quantized_checkpoints=self.space.quantized_checkpoints,
                         make_checkpoint=self.make_checkpoint, base=self.base)

    def _end(self, trial: optuna.trial.Trial, attempt: Attempt, outcome: Outcome) -> list[float]:
        return self.ending.record(trial, attempt, outcome, self.reference_values)

    def _measure(self, trial: optuna.trial.Trial, config: EngineConfig, attempt: Attempt) -> Outcome:
        """Measure the trial's configuration; what it measured, judged (`_judged`)."""
        self.reporter.on_trial_start(number=trial.number, values=dict(attempt.values), config=config)
        self._rival = None
        self.prior.fallback = self.ref.capacity_start
        start, _ = self.prior.start(attempt.values)
        try:
            measured = self.runner.measure(config, f"trial-{trial.number:04d}", probe=self.ref.probe(),
                                           start=self._bounded(start),
                                           prune=lambda *args: self.prune_level(trial.study, *args))
        except EngineError as exc:
            return Infeasible(Status.ENGINE_FAILED, exc.reason, log_tail=exc.log_tail)
        if self.settings.capacity is not None:
            self.prior.add(trial.number, attempt.values, measured.summary.capacity, self.settings.capacity.min_scale)
        quality = measured.quality
        if quality is not None and quality.reused_from is None and quality.key is not None:
            self.ref.quality_known[quality.key] = (trial.number, quality.as_dict())
        return self._judged(measured, attempt.config or {}, trial.study)

    def _bounded(self, start: float) -> float:
        """A predicted start within the capacity search's range."""
        capacity = self.settings.capacity
        return start if capacity is None else min(max(start, capacity.min_scale), capacity.max_scale)

    def _judged(self, measured: Measurement, config: dict[str, object], study: optuna.Study) -> Outcome:
        """What a measurement counts as: measured (perhaps pruned, or not meaningful), or unusable."""
        summary, quality, settings = measured.summary, measured.quality, self.settings
        objectives = [objective_value(name, summary, quality) for name in settings.objectives]
        constraints = constraint_values(summary, quality, settings.slos, settings.max_quality_loss)
        if measured.quality_skipped or summary.ended:
            objectives, constraints = self._censored(study, objectives, constraints)
        busy = machine_busy_reason(summary)  # other work took the engine's cores, again when retried
        # It measured the client or the machine: stored with everything it saw, under its own status.
        unmeasurable = summary.client_overloaded or bool(busy)
        pruned = not unmeasurable and (summary.capacity or {}).get("verdict") == Verdict.PRUNED
        why = None if unmeasurable or pruned else not_meaningful(config) or None  # measured, never on the front
        if any(math.isnan(v) for v in objectives):
            return Infeasible(Status.FAILED, "an objective could not be measured (NaN)", measurement=measured,
                              not_meaningful=why)
        if unmeasurable:
            return Infeasible(Status.UNMEASURABLE, busy or client_overload_reason(summary), measurement=measured)
        if pruned:
            assert summary.capacity is not None
            reason = pruned_reason(settings.objectives, self._rival, summary.capacity,
                                   slo_misses(summary.as_dict(), settings.slos),
                                   reference_name=self.engine.defaults_label,
                                   outside=outside_gate(quality, settings.max_quality_loss))
            unprobed = "; its quality not probed" if measured.quality_skipped else ""
            return Measured(measured, objectives, constraints, status=Status.PRUNED, reason=reason + unprobed)
        return Measured(measured, objectives, constraints, reason=why, not_meaningful=why)

    def _censored(self, study: optuna.Study, objectives: list[float],
                  constraints: list[float]) -> tuple[list[float], list[float]]:
        """A trial that missed the SLOs at the trace's rate, measured only as far as that was certain
        (`tuner.measure`: its probe skipped, its trace-rate level ended early), as its sampler sees it:
        an objective it did not measure (quality; TPOT where no request finished) the worst measured
        so far (`penalty_values`), a constraint it did not measure violated as a failed trial's is
        (`FAILED_VIOLATION`). Its constraints already make it infeasible; neither number is shown as
        measured."""
        penalty = penalty_values(study, self.settings.objectives, self.reference_values)
        values = [p if math.isnan(v) else v for v, p in zip(objectives, penalty)]
        return values, [FAILED_VIOLATION if math.isinf(c) else c for c in constraints]

    def _reused(self, original: int) -> Outcome:
        """This configuration was already measured (by this or another worker): the same result for the
        sampler, without starting an engine. Not counted toward --trials."""
        settings = self.settings
        rows = self.store.trials(settings.study_name, original)
        row = rows[0] if rows else None
        note = f"same configuration as trial {original}: its result is reused, nothing was measured again"
        if row is None or row["status"] != Status.MEASURED or row["summary"] is None:
            reason = (row or {}).get("failure_reason") or "no stored result"
            return Infeasible(Status.DUPLICATE, f"{note} ({(row or {}).get('status')}: {reason})"[:2000],
                              duplicate_of=original)
        summary = Summary.from_dict(row["summary"])
        quality = QualityResult.from_dict(row["quality"]) if row["quality"] else None
        objectives = [objective_value(name, summary, quality) for name in settings.objectives]
        if any(math.isnan(v) for v in objectives):
            return Infeasible(Status.DUPLICATE, f"{note} (an objective was NaN)", duplicate_of=original)
        constraints = constraint_values(summary, quality, settings.slos, settings.max_quality_loss)
        return Reused(original, objectives, constraints, error_rate=summary.error_rate,
                      error_examples=list(summary.error_examples), note=note)

    # -- the study ---------------------------------------------------------------------------
    def run(self) -> optuna.Study:
        settings = self.settings
        study, storage = open_study(settings, space=self.space, engine=self.engine.name, model_dir=self.model_dir,
                                    platform=self.platform)
        queue_first_trials(study, settings, space=self.space, records=self.trace.records, platform=self.platform,
                           model_dir=self.model_dir, reporter=self.reporter,
                           reference_engine=self.engine.engines[0].name)
        self.coord.recover(study, storage)
        self.reporter.on_study(name=settings.study_name, done=counted(study),
                               remaining=max(settings.trials - counted(study), 0))
        report_retries(study, self.reporter)
        if counted(study) < settings.trials:
            self.ensure_reference()
        self._trials(study, storage)
        return study

    def _trials(self, study: optuna.Study, storage: RDBStorage) -> None:
        """Run trials until --trials count, --timeout passes, or (--patience) the front, vLLM's
        defaults included, stays the same for that many trials in a row."""
        settings = self.settings
        deadline = None if settings.timeout_s is None else time.monotonic() + settings.timeout_s
        # Rejected and duplicate configurations cost no engine time and do not count toward
        # --trials (capped, so a space the platform mostly cannot run still ends).
        max_skipped = skipped(study) + 10 * settings.trials
        waiting_announced = False
        plateau = Plateau(settings.patience) if settings.patience else None
        while counted(study) < settings.trials and skipped(study) < max_skipped:
            if deadline is not None and time.monotonic() > deadline:
                assert settings.timeout_s is not None
                self.reporter.on_timeout(limit_s=settings.timeout_s, done=counted(study), trials=settings.trials)
                break
            self.coord.recover(study, storage)
            if counted(study) + running(study) >= settings.trials:
                # Other workers are measuring the last trials: wait for them (or for their
                # heartbeat to go stale, which re-queues their trial for us).
                if not waiting_announced:
                    self.reporter.on_waiting(what="the last trials of other workers", owner="", trial=None)
                    waiting_announced = True
                time.sleep(min(2.0, settings.heartbeat_s / 2))
                continue
            before = counted(study)
            try:
                study.optimize(self.objective, n_trials=1)
            except KeyboardInterrupt:
                self.coord.requeue_interrupted(study)
                raise
            if plateau and counted(study) > before and plateau.unchanged(self.front_labels(study)):
                self.reporter.on_converged(patience=plateau.patience, done=counted(study), trials=settings.trials)
                break

    # -- the front, and where a capacity search may stop (tuner.incumbents) ----------------------
    def front_labels(self, study: optuna.Study) -> frozenset[int | str]:
        """The trials on the front now, the reference competing ("reference" when it is on it)."""
        return front_labels(study, self.settings.objectives, self.reference_values)

    def prune_level(self, study: optuna.Study, summary: Summary, quality: QualityResult | None, gpus: int,
                    base_rps: float) -> float | None:
        """The load level at which a trial's capacity search stops early (`incumbents.prune_rival`)."""
        found = prune_rival(self.settings, study, self.reference_values, summary, quality, gpus, base_rps)
        if found is None:
            return None
        level, self._rival = found
        return level
