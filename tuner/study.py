"""The tuning study: Optuna multi-objective search over real engine configurations.

Each trial samples a config from the search space, starts the engine, replays the trace, probes
quality against the reference, stops the engine, and reports the objectives. Configs that cannot
run are data: rejected (before any engine starts) and crashed/timed-out engines end as
*infeasible* trials with the reason and log tail stored (see `Tuner._infeasible` for why they are
not FAIL); SLO and quality-gate violations are constraints the sampler sees (`constraints_func`).
Everything measured goes to the study's SQL database.

Reliability: the study lives in an Optuna `RDBStorage` with a heartbeat, so a trial whose worker
was killed (SIGKILL included) is failed and retried with the same parameters
(`RetryHeartbeatStaleTrialCallback`). Several workers may share one study: the reference and
every configuration are claimed through a database row (`tuner.coordination.Claims`), so nothing is
measured twice; a worker that draws a configuration already measured reuses that result.

Parts: `tuner/settings.py` (StudySettings), `tuner/runner.py` (the `TrialRunner` seam and its
`Measurement`), `tuner/measure.py` (`EngineRunner`: one engine run: start, replay or capacity search,
quality probe, stop), `tuner/reporter.py` (the `Reporter` of events), `tuner/coordination.py` (storage
with its heartbeat, claims, what counts, recovery), `tuner/objectives.py` (objectives, constraints,
samplers), `quality/probe.py`, `tuner/front.py` (the front with vLLM's defaults competing),
`tuner/storage.py` (tracetune's tables), `tuner/secrets.py` (what is never stored).
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tracetune.engine_adapter.platform import Platform, installed_vllm_version
from tracetune.engine_adapter.registry import EngineKind, engine_kind
from tracetune.errors import EngineError, InputError, Rejected, TuneError
from tracetune.quality.gate import QualityGate
from tracetune.quality.probe import QualityResult, Reference, quality_key
from tracetune.replay.metrics import Summary
from tracetune.replay.trace import Trace
from tracetune.search_spaces.space import SearchSpace
from tracetune.tuner.coordination import (
    Coordinator,
    check_same_choices,
    config_key,
    counted,
    make_storage,
    running,
    skipped,
)
from tracetune.tuner.front import REFERENCE, Candidate, Plateau, measured_trials, not_meaningful, strongest_rival
from tracetune.tuner.measure import client_overload_reason
from tracetune.tuner.objectives import (
    FAILED_VIOLATION,
    OBJECTIVES,
    constraint_values,
    feasible,
    make_sampler,
    objective_value,
    penalty_values,
    set_constraints,
    startup_trials,
)
from tracetune.tuner.presets import presets
from tracetune.tuner.reporter import NullReporter, Reporter
from tracetune.tuner.runner import Measurement, QualityProbe, TrialRunner
from tracetune.tuner.secrets import Redactor
from tracetune.tuner.settings import RULES_ATTR, StudySettings, check_rules, study_rules
from tracetune.tuner.storage import REFERENCE_RUN, ResultStore, Status

__all__ = ["Measurement", "NullReporter", "Reporter", "StudySettings", "TrialRunner", "Tuner", "config_diff"]


class Tuner:
    """Runs one study: samples configurations, has its `runner` measure them (a `TrialRunner`, as Optuna
    hands a sampler to a study), stores what was measured and tells its `report`er (a `Reporter`).
    The command line hands it an `EngineRunner` (tuner.measure), which starts real engines."""

    def __init__(self, settings: StudySettings, *, trace: Trace, space: SearchSpace, model_dir: Path,
                 platform: Platform, runner: TrialRunner, report: Reporter | None = None,
                 base: dict[str, Any] | None = None, make_checkpoint: Callable[[str], Path] | None = None,
                 engine: EngineKind | None = None) -> None:
        self.s = settings
        self.engine = engine or engine_kind("vllm")  # which engine the study starts (engine_adapter.registry)
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
        self.reference: Reference | None = None
        self.reference_config: Any = None  # the engine's settings model (engine.config_model)
        self.reference_values: list[float] | None = None
        self.reference_capacity: float | None = None  # the reference's capacity level k
        self._quality_known: dict[str, tuple[int, dict[str, Any]]] = {}  # quality key -> (trial, quality)
        self._rival: Candidate | None = None  # what the running trial's capacity search may stop at (prune_level)

    def ensure_reference(self) -> None:
        """Measure the unquantized reference once per study (reused on resume, and by every other
        worker: the first one claims it, the others wait for its row)."""
        self.reference_config = self.engine.reference(fixed=self.space.fixed, model_dir=self.model_dir, base=self.base)
        stored = self.store.reference(self.s.study_name)
        if stored is None:
            holder = self.coord.claim_or_wait("reference", REFERENCE_RUN, "the reference")
            stored = self.store.reference(self.s.study_name)
            if stored is None and holder is not None:
                raise TuneError("the reference claim is marked done but no reference is stored; "
                                "delete the study's tracetune_claims row 'reference' and run again")
        if stored is None:
            self._measure_reference()
            return
        self.reference = Reference.from_json(stored["probe"])
        if stored.get("summary"):
            self._set_reference_values(stored["summary"])
        self.reporter.on_reference_reused()

    def _measure_reference(self) -> None:
        self.reporter.on_reference_start(config=self.reference_config)
        config = json.loads(self.reference_config.model_dump_json())
        with self.coord.measuring("reference", REFERENCE_RUN):
            measured = self.runner.measure(self.reference_config, "reference", probe=self._probe())
            self.reference = measured.reference
            self.store.save_reference(self.s.study_name, config=config, probe=self.reference.to_json(),
                                      summary=measured.summary.as_dict())
            self.store.save_trial(self.s.study_name, REFERENCE_RUN, Status.MEASURED, config=config, **measured.stored())
            self.store.save_levels(self.s.study_name, REFERENCE_RUN, measured.levels)
        self._set_reference_values(measured.summary.as_dict())
        self.reporter.on_reference_done(summary=measured.summary, quality=measured.quality)

    def _probe(self) -> QualityProbe:
        """What this study's quality probes compare against, and the qualities it already knows."""
        config = None if self.reference_config is None else json.loads(self.reference_config.model_dump_json())
        return QualityProbe(reference=self.reference, reference_config=config, known=self._known_quality)

    def _known_quality(self, key: str) -> tuple[int, dict[str, Any]] | None:
        """(trial, quality) of a configuration with this quality key probed by this worker, or stored
        by any (another worker's, or before a resume)."""
        return self._quality_known.get(key) or next(
            ((n, q) for n, c, q in self.store.measured_qualities(self.s.study_name) if quality_key(c) == key), None)

    @property
    def capacity_start(self) -> float:
        """Where a trial's capacity search starts: the reference's capacity (most configurations
        land near it, so the bracket closes in a few levels), else the trace's own rate."""
        if self.s.capacity is None or not self.reference_capacity:
            return 1.0
        return min(max(self.reference_capacity, self.s.capacity.min_scale), self.s.capacity.max_scale)

    def _set_reference_values(self, summary: dict[str, Any]) -> None:
        """The reference as a candidate: its objective values (quality loss 0 by definition) and
        its capacity level, where trials start their capacity search."""
        self.reference_values = [objective_value(n, summary, None) if n != "quality_loss" else 0.0
                                 for n in self.s.objectives]
        self.reference_capacity = (summary.get("capacity") or {}).get("capacity_scale") or None

    # -- the Optuna objective ------------------------------------------------------------------
    def objective(self, trial: Any) -> list[float]:
        t0 = time.perf_counter()
        values = self.space.sample(trial)
        trial.set_user_attr("values", values)
        trial.set_user_attr("worker", self.worker)
        try:
            config = self.engine.translate(values, fixed=self.space.fixed, platform=self.platform,
                                      model_dir=self.model_dir, quantized_checkpoints=self.space.quantized_checkpoints,
                                      make_checkpoint=self.make_checkpoint, base=self.base)
        except Rejected as exc:
            return self._infeasible(trial, Status.REJECTED, f"rejected before start: {exc}", values=values, t0=t0)
        except TuneError as exc:  # e.g. the quantized checkpoint could not be made
            return self._infeasible(trial, Status.FAILED, f"could not prepare this config: {exc}", values=values, t0=t0)
        config_json = self.redact(json.loads(config.model_dump_json()))
        trial.set_user_attr("config", config_json)
        key = config_key(config_json)
        holder = self.coord.claim_or_wait(key, trial.number, f"trial {trial.number}'s configuration")
        if holder is not None:
            return self._reuse(trial, holder["trial_number"], values=values, config=config_json, t0=t0)
        with self.coord.measuring(key, trial.number):
            return self._measured(trial, config, config_json, values, t0)

    def _measured(self, trial: Any, config: Any, config_json: dict, values: dict, t0: float) -> list[float]:
        self.reporter.on_trial_start(number=trial.number, values=values, config=config)
        self._rival = None
        try:
            measured = self.runner.measure(config, f"trial-{trial.number:04d}", probe=self._probe(),
                                           start=self.capacity_start,
                                           prune=lambda *args: self.prune_level(trial.study, *args))
        except EngineError as exc:
            return self._infeasible(trial, Status.ENGINE_FAILED, exc.reason, values=values, config=config_json,
                                    log_tail=exc.log_tail, t0=t0)
        summary, quality = measured.summary, measured.quality
        if quality is not None and quality.reused_from is None:
            self._quality_known[quality.key] = (trial.number, quality.as_dict())
        objectives = [objective_value(name, summary, quality) for name in self.s.objectives]
        constraints = constraint_values(summary, quality, self.s.slos, self.s.max_quality_loss)
        wall = time.perf_counter() - t0
        # A replay that measured its client is stored with everything it saw, under its own status.
        status, reason = (Status.UNMEASURABLE, client_overload_reason(summary)) if summary.client_overloaded else \
            (Status.MEASURED, None)
        if status == Status.MEASURED and (summary.capacity or {}).get("verdict") == "pruned":
            status, reason = Status.PRUNED, self._pruned_reason(summary.capacity)
        elif status == Status.MEASURED and (why := not_meaningful(config_json)):
            reason = why  # stored and shown; the front never takes it
            trial.set_user_attr("not_meaningful", reason)
            trial.set_user_attr("failure_reason", reason)
        self.store.save_trial(self.s.study_name, trial.number, status, values=values, config=config_json,
                              wall_s=wall, failure_reason=reason, **measured.stored())
        self.store.save_levels(self.s.study_name, trial.number, measured.levels)
        if any(math.isnan(v) for v in objectives):
            return self._infeasible(trial, Status.FAILED, "an objective could not be measured (NaN)", values=values,
                                    config=config_json, t0=t0, saved=True)
        if status == Status.UNMEASURABLE:
            return self._infeasible(trial, status, reason, values=values, config=config_json, t0=t0, saved=True)
        self._set_measured(trial, objectives, constraints, summary.error_rate, summary.error_examples)
        if trial.user_attrs.get("not_meaningful"):
            trial.set_user_attr("feasible", False)  # off every front (the dashboard's reads `feasible`)
        if status == Status.PRUNED:
            # The sampler learns its values (capacity: the bracket's low end); the front never takes it.
            trial.set_user_attr("status", Status.PRUNED.value)
            trial.set_user_attr("feasible", False)
            trial.set_user_attr("failure_reason", reason)
            self.reporter.on_trial_pruned(number=trial.number, reason=reason, wall_s=wall)
            return objectives
        self.reporter.on_trial_done(number=trial.number, objectives=dict(zip(self.s.objectives, objectives)),
                                    constraints=constraints, summary=summary, quality=quality, wall_s=wall,
                                    startup_s=measured.startup_s)
        return objectives

    def _pruned_reason(self, capacity: dict[str, Any]) -> str:
        """Why a trial's capacity search stopped early, naming the configuration it cannot beat."""
        from tracetune.capacity.step import bracket_text

        rival = self._rival
        who = ("an incumbent" if rival is None else "vLLM's defaults" if rival.label == REFERENCE
               else f"trial {rival.label}")
        others = [n for n in self.s.objectives if n != "capacity"]
        verb = "pass and are" if who == "vLLM's defaults" else "passes and is"
        return (f"pruned: fails {capacity['bracket_scale'][1]:.3g}x the trace's rate (confirmed by a repeat), where "
                f"{who} {verb} at least as good on {', '.join(others) or 'every other objective'}: it cannot "
                f"be on the front; capacity {bracket_text(capacity)}, not searched further")

    def _set_measured(self, trial: Any, objectives: list[float], constraints: list[float], error_rate: float,
                      error_examples: list[str]) -> None:
        trial.set_user_attr("constraints", constraints)
        set_constraints(trial, self.s.constraint_names, [error_rate] + constraints)
        trial.set_user_attr("feasible", feasible(error_rate, constraints))
        trial.set_user_attr("status", Status.MEASURED.value)
        if error_rate > 0:
            # Failed requests (e.g. timed out) make the measurement biased toward the survivors:
            # kept, but infeasible, with the reason.
            trial.set_user_attr("failure_reason", self.redact(
                f"{error_rate:.0%} of requests failed, e.g. {error_examples[:1]}"))

    def _reuse(self, trial: Any, original: int, *, values: dict, config: dict, t0: float) -> list[float]:
        """This configuration was already measured (by this or another worker): report the same
        result to the sampler without starting an engine. Not counted toward --trials."""
        rows = self.store.trials(self.s.study_name, original)
        row = rows[0] if rows else None
        note = f"same configuration as trial {original}: its result is reused, nothing was measured again"
        trial.set_user_attr("duplicate_of", original)
        if row is None or row["status"] != Status.MEASURED or row["summary"] is None:
            reason = (row or {}).get("failure_reason") or "no stored result"
            return self._infeasible(trial, Status.DUPLICATE, f"{note} ({(row or {}).get('status')}: {reason})"[:2000],
                                    values=values, config=config, t0=t0)
        summary, quality = row["summary"], row["quality"]
        objectives = [objective_value(name, summary, quality) for name in self.s.objectives]
        if any(math.isnan(v) for v in objectives):
            return self._infeasible(trial, Status.DUPLICATE, f"{note} (an objective was NaN)", values=values,
                                    config=config, t0=t0)
        constraints = constraint_values(summary, quality, self.s.slos, self.s.max_quality_loss)
        self._set_measured(trial, objectives, constraints, summary.get("error_rate", 0.0),
                           summary.get("error_examples", []))
        trial.set_user_attr("status", Status.DUPLICATE.value)
        trial.set_user_attr("feasible", False)  # the original is the one on the front
        self.store.save_trial(self.s.study_name, trial.number, Status.DUPLICATE, values=values, config=config,
                              failure_reason=note, wall_s=time.perf_counter() - t0)
        self.reporter.on_duplicate(number=trial.number, original=original)
        return objectives

    def _infeasible(self, trial: Any, status: str, reason: str, *, values: dict, config: dict | None = None,
                    log_tail: str = "", t0: float, saved: bool = False) -> list[float]:
        """End a trial that produced no usable measurement (rejected config, engine failed to
        start / crashed / timed out, every request failed, duplicate of such a trial).

        Why not an Optuna FAIL: NSGA-II, TPE and GP drop FAIL trials, so the sampler would keep
        proposing configurations that cannot run. Instead the trial is COMPLETE with penalty
        values (`penalty_values`: worst measured so far, zero throughput) and a positive value
        for every constraint (`set_constraints`); NSGA-II ranks such a trial below every
        feasible one, TPE puts it in its "bad" group, GP models its feasibility, so the search
        moves away from it. The Pareto front only takes measured, feasible trials. The
        tracetune status ("rejected", "engine_failed", "failed", "unmeasurable", "duplicate"), the reason and the
        log tail stay in the trial's user attributes and in the results table.
        """
        reason = self.redact(reason)
        trial.set_user_attr("status", str(status))
        trial.set_user_attr("failure_reason", reason)
        trial.set_user_attr("feasible", False)
        trial.set_user_attr("constraints", [FAILED_VIOLATION] * self.s.n_user_constraints)
        set_constraints(trial, self.s.constraint_names, [FAILED_VIOLATION] * (1 + self.s.n_user_constraints))
        if log_tail:
            trial.set_user_attr("log_tail", self.redact(log_tail[-4000:]))
        if not saved:
            self.store.save_trial(self.s.study_name, trial.number, status, values=values, config=config,
                                  failure_reason=reason, log_tail=log_tail, wall_s=time.perf_counter() - t0)
        if status != Status.DUPLICATE:
            self.reporter.on_trial_failed(number=trial.number, status=status, reason=reason)
        else:
            self.reporter.on_duplicate(number=trial.number, original=trial.user_attrs.get("duplicate_of"),
                                       reason=reason)
        return penalty_values(trial.study, self.s.objectives, self.reference_values)

    # -- the study ---------------------------------------------------------------------------
    def run(self):
        import optuna

        # Failed trials are reported by tracetune itself; optuna would add a traceback per trial.
        optuna.logging.set_verbosity(optuna.logging.ERROR)
        study, storage = self._open_study()
        check_same_choices(study, self.space, self.s.study_name)
        for key, value in {**self.s.economics, "trace_profile": self.s.trace_profile}.items():
            study.set_user_attr(key, value)
        # Configurations the user asked to try first (e.g. today's production config); ones the
        # study already has are skipped, so a resumed or second worker does not add them again.
        for params in self.s.enqueue:
            study.enqueue_trial(params, skip_if_exists=True)
        self._enqueue(study, self._warm_start(), self.reporter.on_warm_start)
        chosen = presets(self.space, self.trace.records) if self.s.presets else []
        self._enqueue(study, chosen, self.reporter.on_presets)
        self.coord.recover(study, storage)
        self.reporter.on_study(name=self.s.study_name, done=counted(study),
                               remaining=max(self.s.trials - counted(study), 0))
        self._report_retries(study)
        if counted(study) < self.s.trials:
            self.ensure_reference()
        self._trials(study, storage)
        return study

    def _report_retries(self, study: Any) -> None:
        """Queued trials that measure again what an interrupted trial was measuring: they run before
        this run's --try configurations and the sampler's (they were queued first)."""
        import optuna

        retries = [(t.number, t.system_attrs["failed_trial"], t.params)
                   for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.WAITING,))
                   if "failed_trial" in t.system_attrs]
        if retries:
            self.reporter.on_retries_first(trials=retries)

    def _enqueue(self, study: Any, chosen: list[dict[str, Any]], announce: Callable[..., None]) -> None:
        """First trials for a new study (warm-start configurations, presets), within the trials it
        has room for after what is already queued (the user's --try values first)."""
        import optuna

        if not chosen or counted(study):
            return
        waiting = len(study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.WAITING,)))
        chosen = chosen[:max(self.s.trials - waiting, 0)]
        for params in chosen:
            study.enqueue_trial(params, skip_if_exists=True)
        if chosen:
            announce(configs=chosen)

    def _warm_start(self) -> list[dict[str, Any]]:
        """The configurations of an earlier study (--warm-start) on the same model and platform,
        front first: tried first here, measured again on this trace, never reused as measurements."""
        if not self.s.warm_start:
            return []
        from tracetune.tuner.warm_start import earlier_configs

        url, name = self.s.warm_start
        return earlier_configs(url, name, space=self.space, platform=self.platform.value,
                               model=Path(str(self.model_dir)).name)

    def _open_study(self) -> tuple[Any, Any]:
        """The study (created, or loaded to resume) and its storage; what it was created with is kept
        and checked again on resume."""
        import optuna

        directions = [OBJECTIVES[name] for name in self.s.objectives]
        storage = make_storage(self.s.storage_url, self.s.heartbeat_s)
        study = optuna.create_study(
            study_name=self.s.study_name, storage=storage, directions=directions,
            sampler=make_sampler(self.s.sampler, self.s.seed, 1 + self.s.n_user_constraints,
                                 n_startup=startup_trials(self.space.size())), load_if_exists=True)
        if [d.name.lower() for d in study.directions] != directions:
            raise InputError(f"study {self.s.study_name!r} exists with objectives in other directions; "
                             f"use another --study name or the same --objectives")
        rules = study_rules(self.s, engine=self.engine.name, model_dir=self.model_dir)
        if study.user_attrs.get("objectives") is None:
            # The rules first: a worker that finds the objectives (a study made) finds its rules too.
            study.set_user_attr(RULES_ATTR, {k: v for k, v in rules.items() if k != "objectives"})
            study.set_user_attr("objectives", self.s.objectives)
            study.set_user_attr("slos", [str(s) for s in self.s.slos])
            gate = self.s.max_quality_loss
            if isinstance(gate, QualityGate):
                study.set_user_attr("quality_gate", gate.spec)
                # The nats limit is drawn on the quality_loss axis (nats per token) by the dashboard.
                study.set_user_attr("max_quality_loss", gate.limit if gate.unit == "nats" else None)
            else:
                study.set_user_attr("max_quality_loss", gate)
            study.set_user_attr("platform", self.platform.value)
            study.set_user_attr("vllm_version", installed_vllm_version())
            study.set_user_attr("heartbeat_s", self.s.heartbeat_s)  # silent for twice this: its worker is gone
        else:  # the command line checked this already, before it wrote anything (cli.job.check_resume)
            check_rules(self.s.study_name, study.user_attrs, rules)
        return study, storage

    def _trials(self, study: Any, storage: Any) -> None:
        """Run trials until --trials count, --timeout passes, or (--patience) the front, vLLM's
        defaults included, stays the same for that many trials in a row."""
        deadline = None if self.s.timeout_s is None else time.monotonic() + self.s.timeout_s
        # Rejected and duplicate configurations cost no engine time and do not count toward
        # --trials (capped, so a space the platform mostly cannot run still ends).
        max_skipped = skipped(study) + 10 * self.s.trials
        waiting_announced = False
        plateau = Plateau(self.s.patience) if self.s.patience else None
        while counted(study) < self.s.trials and skipped(study) < max_skipped:
            if deadline is not None and time.monotonic() > deadline:
                self.reporter.on_timeout(limit_s=self.s.timeout_s, done=counted(study), trials=self.s.trials)
                break
            self.coord.recover(study, storage)
            if counted(study) + running(study) >= self.s.trials:
                # Other workers are measuring the last trials: wait for them (or for their
                # heartbeat to go stale, which re-queues their trial for us).
                if not waiting_announced:
                    self.reporter.on_waiting(what="the last trials of other workers", owner="", trial=None)
                    waiting_announced = True
                time.sleep(min(2.0, self.s.heartbeat_s / 2))
                continue
            before = counted(study)
            try:
                study.optimize(self.objective, n_trials=1)
            except KeyboardInterrupt:
                self.coord.requeue_interrupted(study)
                raise
            if plateau and counted(study) > before and plateau.unchanged(self.front_labels(study)):
                self.reporter.on_converged(patience=plateau.patience, done=counted(study), trials=self.s.trials)
                break

    def front_labels(self, study: Any) -> frozenset:
        """The trials on the front now, vLLM's defaults competing ("reference" when it is on it)."""
        from tracetune.tuner.front import decide

        reference, trials = self._candidates(study)
        decision = decide(trials, reference, self.s.objectives, self._directions)
        return frozenset(c.label for c in decision.front)

    @property
    def _directions(self) -> list[str]:
        return [OBJECTIVES[name] for name in self.s.objectives]

    def _candidates(self, study: Any) -> tuple[Candidate | None, list[Candidate]]:
        """vLLM's defaults (None until measured) and the measured, feasible trials, as front candidates."""
        ref = None if self.reference_values is None else Candidate(REFERENCE, tuple(self.reference_values))
        return ref, [Candidate(t.number, tuple(t.values)) for t in measured_trials(study)]

    def prune_level(self, study: Any, summary: Summary, quality: QualityResult | None, gpus: int,
                    base_rps: float) -> float | None:
        """The load level at which a trial's capacity search stops early (`capacity.step`): the
        capacity of the strongest incumbent (vLLM's defaults included) at least as good as this trial on
        every other objective; failing it, the trial cannot be on the front. None: nothing to stop at."""
        if not self.s.prune or self.s.capacity is None or "capacity" not in self.s.objectives or base_rps <= 0:
            return None
        index = self.s.objectives.index("capacity")
        mine = [objective_value(name, summary, quality) if name != "capacity" else math.nan
                for name in self.s.objectives]
        reference, trials = self._candidates(study)
        rival = strongest_rival(mine, ([reference] if reference else []) + trials, self._directions, index)
        if rival is None or not rival.values[index] > 0:
            return None
        self._rival = rival
        return min(rival.values[index] * gpus / base_rps, self.s.capacity.max_scale)


def config_diff(config: dict[str, Any], reference: dict[str, Any]) -> dict[str, Any]:
    """Settings where `config` differs from the reference (nested speculative flattened; "auto",
    vLLM's default, the same as unset)."""
    def flat(c: dict[str, Any]) -> dict[str, Any]:
        out = {k: v for k, v in c.items() if k not in ("speculative", "env", "extra_args")}
        spec = c.get("speculative") or {}
        out["speculative"] = spec.get("method", "none")
        if spec.get("method", "none") != "none":
            out["num_speculative_tokens"] = spec.get("num_speculative_tokens")
        if spec.get("draft_model"):
            out["draft_model"] = Path(str(spec["draft_model"])).name
        return out

    def same(x: Any, y: Any) -> bool:
        return (None if x == "auto" else x) == (None if y == "auto" else y)

    a, b = flat(config), flat(reference)
    return {k: v for k, v in a.items() if not same(b.get(k), v)}
