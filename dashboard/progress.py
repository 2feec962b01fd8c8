"""How the search went: the front's hypervolume after each trial, and parameter importance."""

from __future__ import annotations

import functools
import math
import warnings
from typing import TYPE_CHECKING, TypedDict

from tracetune.dashboard.storage import optuna_storage
from tracetune.dashboard.study_view import StudyView
from tracetune.tuner.front import hypervolume
from tracetune.tuner.storage import REFERENCE_RUN

if TYPE_CHECKING:
    from optuna.trial import FrozenTrial


class ProgressPoint(TypedDict):
    """One trial of `search_progress`: its number (REFERENCE_RUN: the reference), category, hypervolume after it."""

    trial: int
    category: str
    hypervolume: float


# -- how the search went ------------------------------------------------------------------------
def search_progress(study: StudyView) -> list[ProgressPoint]:
    """Per trial, in the order run: its category, and the hypervolume of the front of the feasible
    measured trials so far with the reference (objectives scaled to [0, 1] over every run shown,
    reference point 1.1): the share of objective space the search has covered, and when it grew."""
    runs = [t for t in study.candidates if t.category in ("pareto", "tie", "dominated")]
    if not runs or not study.objectives:
        return []
    signs = [1.0 if d == "minimize" else -1.0 for d in study.directions]
    raw = {t.number: [s * t.metric(o) for s, o in zip(signs, study.objectives)] for t in runs}
    raw = {n: v for n, v in raw.items() if not any(math.isnan(x) for x in v)}
    if not raw:
        return []
    lows = [min(v[i] for v in raw.values()) for i in range(len(signs))]
    highs = [max(v[i] for v in raw.values()) for i in range(len(signs))]
    scaled = {n: [(x - lo) / (hi - lo) if hi > lo else 0.0 for x, lo, hi in zip(v, lows, highs)]
              for n, v in raw.items()}
    seen = [scaled[REFERENCE_RUN]] if REFERENCE_RUN in scaled else []
    ref_point = [1.1] * len(signs)
    ref = study.reference_run
    out: list[ProgressPoint] = [{"trial": REFERENCE_RUN, "category": ref.category,
                                 "hypervolume": hypervolume(seen, ref_point)}] if seen and ref is not None else []
    for t in sorted(study.trials, key=lambda t: t.number):
        if t.number in scaled:
            seen.append(scaled[t.number])
        out.append({"trial": t.number, "category": t.category, "hypervolume": hypervolume(seen, ref_point)})
    return out


def param_importances(study: StudyView) -> dict[str, dict[str, float]]:
    """Per objective, how much each searched parameter moved it (Optuna's PED-ANOVA evaluator over
    the measured trials only: a failed trial's penalty values would be noise). Empty when too few
    trials were measured, or nothing varied."""
    import optuna

    measured = {t.number for t in study.trials if t.measured and t.objective_values}
    source = optuna.load_study(study_name=study.name, storage=optuna_storage(study.storage))
    frozen = [ft for ft in source.get_trials(deepcopy=False) if ft.number in measured and ft.params]
    if len(frozen) < 4:
        return {}
    copy = optuna.create_study(directions=[optuna.study.StudyDirection[d.upper()] for d in study.directions])
    copy.add_trials(frozen)
    out: dict[str, dict[str, float]] = {}
    for i, (objective, direction) in enumerate(zip(study.objectives, study.directions)):
        sign = 1.0 if direction == "minimize" else -1.0  # the evaluator asks what makes the target low
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                out[objective] = optuna.importance.get_param_importances(
                    copy, evaluator=optuna.importance.PedAnovaImportanceEvaluator(),
                    target=functools.partial(_signed_value, i, sign))
        except (RuntimeError, ValueError):  # every trial had the same parameter values
            continue
    return {o: v for o, v in out.items() if v}


def _signed_value(i: int, sign: float, trial: FrozenTrial) -> float:
    """A trial's `i`-th objective value, times `sign` (importance asks what makes the target low)."""
    return sign * trial.values[i]
