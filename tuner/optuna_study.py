"""Opening a study's Optuna side: create it (or load it, to resume) with its directions and sampler, keep
the rules it is measured under with it (or check them on resume), annotate it (economics, the trace's
profile), and queue its first trials: the user's --try configurations, an earlier study's (--warm-start)
and informed presets, then the retries of interrupted trials are announced."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from tracetune.engine_adapter.choice import ENGINE
from tracetune.engine_adapter.platform import Platform, installed_vllm_version
from tracetune.errors import InputError
from tracetune.quality.gate import QualityGate
from tracetune.replay.trace import TraceRecord
from tracetune.search_spaces.space import SearchSpace
from tracetune.tuner.coordination import check_same_choices, counted, make_storage
from tracetune.tuner.objectives import OBJECTIVES, make_sampler, startup_trials
from tracetune.tuner.presets import presets
from tracetune.tuner.reporter import Reporter
from tracetune.tuner.settings import StudySettings, check_rules, study_rules
from tracetune.tuner.trial_record import Attr, ParamValue, StudyAttr

if TYPE_CHECKING:
    import optuna
    from optuna.storages import RDBStorage

Params = Mapping[str, ParamValue]


def open_study(settings: StudySettings, *, space: SearchSpace, engine: str, model_dir: Path,
               platform: Platform) -> tuple[optuna.Study, RDBStorage]:
    """The study (created, or loaded to resume) and its storage; what it was created with is kept
    and checked again on resume."""
    import optuna

    # Failed trials are reported by tracetune itself; optuna would add a traceback per trial.
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    directions = [OBJECTIVES[name] for name in settings.objectives]  # "minimize" | "maximize"
    storage = make_storage(settings.storage_url, settings.heartbeat_s)
    study = optuna.create_study(
        study_name=settings.study_name, storage=storage,
        directions=[optuna.study.StudyDirection[d.upper()] for d in directions],
        sampler=make_sampler(settings.sampler, settings.seed, 1 + settings.n_user_constraints,
                             n_startup=startup_trials(space.size())), load_if_exists=True)
    if [d.name.lower() for d in study.directions] != directions:
        raise InputError(f"study {settings.study_name!r} exists with objectives in other directions; "
                         f"use another --study name or the same --objectives")
    rules = study_rules(settings, engine=engine, model_dir=model_dir)
    if study.user_attrs.get(StudyAttr.OBJECTIVES) is None:
        _keep_rules(study, settings, rules, platform)
    else:  # the command line checked this already, before it wrote anything (cli.job.check_resume)
        check_rules(settings.study_name, study.user_attrs, rules)
    check_same_choices(study, space, settings.study_name)
    for key, value in {**settings.economics, StudyAttr.TRACE_PROFILE.value: settings.trace_profile}.items():
        study.set_user_attr(key, value)
    return study, storage


def _keep_rules(study: optuna.Study, settings: StudySettings, rules: Mapping[str, object],
                platform: Platform) -> None:
    """A new study's rules and what the dashboard draws them with (`settings.RULE_FLAGS`)."""
    # The rules first: a worker that finds the objectives (a study made) finds its rules too.
    study.set_user_attr(StudyAttr.RULES.value, {k: v for k, v in rules.items() if k != "objectives"})
    study.set_user_attr(StudyAttr.OBJECTIVES.value, settings.objectives)
    study.set_user_attr(StudyAttr.SLOS.value, [str(s) for s in settings.slos])
    gate = settings.max_quality_loss
    if isinstance(gate, QualityGate):
        study.set_user_attr(StudyAttr.QUALITY_GATE.value, gate.spec)
        # The nats limit is drawn on the quality_loss axis (nats per token) by the dashboard.
        study.set_user_attr(StudyAttr.MAX_QUALITY_LOSS.value, gate.limit if gate.unit == "nats" else None)
    else:
        study.set_user_attr(StudyAttr.MAX_QUALITY_LOSS.value, gate)
    study.set_user_attr(StudyAttr.PLATFORM.value, platform.value)
    study.set_user_attr(StudyAttr.VLLM_VERSION.value, installed_vllm_version())
    study.set_user_attr(StudyAttr.HEARTBEAT_S.value, settings.heartbeat_s)


def queue_first_trials(study: optuna.Study, settings: StudySettings, *, space: SearchSpace,
                       records: Sequence[TraceRecord], platform: Platform, model_dir: Path,
                       reporter: Reporter, reference_engine: str | None = None) -> None:
    """The configurations tried first: (a new study choosing between engines) each other engine's own
    defaults, the user's --try values, then (a new study only) an earlier study's (--warm-start) and
    informed presets, within the trials the study has room for."""
    _enqueue_engine_defaults(study, space, reference_engine)
    # Ones the study already has are skipped, so a resumed or second worker does not add them again.
    for params in settings.enqueue:
        study.enqueue_trial(params, skip_if_exists=True)
    _enqueue(study, settings.trials, _warm_start(settings, space, platform, model_dir), reporter.on_warm_start)
    _enqueue(study, settings.trials, presets(space, records) if settings.presets else [], reporter.on_presets)


def _enqueue_engine_defaults(study: optuna.Study, space: SearchSpace, reference_engine: str | None) -> None:
    """In a new study whose space offers several engines: a first trial per engine other than the reference
    engine (the first), measuring that engine's own defaults as any trial is measured (the quality
    reference stays the reference engine's defaults). Marked with the engine (`Attr.DEFAULTS_OF`)."""
    if counted(study) or ENGINE not in space.parameters or reference_engine is None:
        return
    for name in space.engines():
        if name != reference_engine:
            study.enqueue_trial({ENGINE: name}, user_attrs={Attr.DEFAULTS_OF.value: name}, skip_if_exists=True)


def _enqueue(study: optuna.Study, trials: int, chosen: list[dict[str, ParamValue]],
             announce: Callable[..., None]) -> None:
    """First trials for a new study (warm-start configurations, presets), within the `trials` it
    has room for after what is already queued (the user's --try values first)."""
    import optuna

    if not chosen or counted(study):
        return
    waiting = len(study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.WAITING,)))
    chosen = chosen[:max(trials - waiting, 0)]
    for params in chosen:
        study.enqueue_trial(params, skip_if_exists=True)
    if chosen:
        announce(configs=chosen)


def _warm_start(settings: StudySettings, space: SearchSpace, platform: Platform,
                model_dir: Path) -> list[dict[str, ParamValue]]:
    """The configurations of an earlier study (--warm-start) on the same model and platform,
    front first: tried first here, measured again on this trace, never reused as measurements."""
    if not settings.warm_start:
        return []
    from tracetune.tuner.warm_start import earlier_configs

    url, name = settings.warm_start
    return earlier_configs(url, name, space=space, platform=platform.value, model=Path(str(model_dir)).name)


def report_retries(study: optuna.Study, reporter: Reporter) -> None:
    """Queued trials that measure again what an interrupted trial was measuring: they run before
    this run's --try configurations and the sampler's (they were queued first)."""
    import optuna

    retries = [(t.number, int(t.system_attrs["failed_trial"]), dict(t.params))
               for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.WAITING,))
               if "failed_trial" in t.system_attrs]
    if retries:
        reporter.on_retries_first(trials=retries)
