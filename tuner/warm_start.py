"""Warm start: a new study tries first the configurations an earlier study found best, on the same
model and platform (another trace, another SLO). They are proposals, measured again on this trace;
nothing measured before is reused as a measurement of this one."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING

from tracetune.errors import InputError
from tracetune.tuner.trial_record import ParamValue, StudyAttr, TrialRecord

if TYPE_CHECKING:
    import optuna

    from tracetune.search_spaces.space import SearchSpace


def earlier_configs(url: str, name: str, *, space: SearchSpace, platform: str,
                    model: str) -> list[dict[str, ParamValue]]:
    """The earlier study's measured, feasible configurations as values of `space`: its front first,
    then the rest by its deciding objective. Values `space` does not offer are left to the sampler.
    The earlier study is read only (perhaps another user's database): nothing is written there."""
    import optuna

    from tracetune.tuner.front import deciding_objective, measured_trials, pareto_trials
    from tracetune.tuner.read_only import optuna_storage
    from tracetune.tuner.secrets import display_url
    from tracetune.tuner.storage import read_reference

    storage = optuna_storage(url, flag="--warm-start-storage")
    try:
        try:
            source = optuna.load_study(study_name=name, storage=storage)
        except KeyError:
            raise InputError(f"--warm-start: no study {name!r} in {display_url(url)}") from None
        _check_same_setting(source, read_reference(storage.engine, name), name, platform=platform, model=model)
        front, trials = pareto_trials(source), measured_trials(source)
        directions = [d.name.lower() for d in source.directions]
        i = deciding_objective(list(source.user_attrs.get(StudyAttr.OBJECTIVES) or []), directions)
    finally:
        storage.engine.dispose()
    sign = -1.0 if directions[i] == "maximize" else 1.0
    on_front = {t.number for t in front}
    rest = sorted((t for t in trials if t.number not in on_front),
                  key=lambda t: sign * t.values[i] if not math.isnan(t.values[i]) else math.inf)
    out: list[dict[str, ParamValue]] = []
    for t in [*front, *rest]:
        values = _in_space(TrialRecord.of(t).values or t.params, space)
        if values and values not in out:
            out.append(values)
    return out


def _check_same_setting(source: optuna.Study, reference: Mapping[str, object] | None, name: str, *, platform: str,
                        model: str) -> None:
    theirs = source.user_attrs.get(StudyAttr.PLATFORM)
    if theirs and theirs != platform:
        raise InputError(f"--warm-start {name}: measured on {theirs}, this study runs on {platform}; what wins "
                         f"there says little here")
    config = (reference or {}).get("config")
    stored_model = config.get("model", "") if isinstance(config, Mapping) else ""
    their_model = str(stored_model).rstrip("/").rsplit("/", 1)[-1]
    if their_model and their_model != model:
        raise InputError(f"--warm-start {name}: measured on model {their_model}, this study runs {model}")


def _in_space(values: Mapping[str, ParamValue], space: SearchSpace) -> dict[str, ParamValue]:
    """The values this space offers (a parameter it lacks, or a value it does not offer, is dropped)."""
    out: dict[str, ParamValue] = {}
    for key, value in values.items():
        param = space.parameters.get(key)
        if param is None:
            continue
        if param.choices is not None and value not in param.choices:
            continue
        if param.choices is None and not (isinstance(value, int | float) and param.low is not None
                                          and param.high is not None and param.low <= value <= param.high):
            continue
        out[key] = value
    return out
