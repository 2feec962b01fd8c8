"""Which trial to export: by number, the front's best (the engine's defaults competing: when they win, say
so instead of exporting a worse config), or a `--pick` rule over the front. What the choice costs, in words:
`notes.choice_notes`."""

from __future__ import annotations

import dataclasses
import math
import re

from tracetune.dashboard.data import StudyView, TrialView
from tracetune.dashboard.metrics import METRICS
from tracetune.dashboard.tables import Condition, parse_conditions
from tracetune.errors import InputError


@dataclasses.dataclass(frozen=True)
class PickRule:
    goal: str                      # max | min
    metric: str
    where: tuple[Condition, ...] = ()

    def __str__(self) -> str:
        text = f"{self.goal}:{self.metric}"
        return text + (" where " + " and ".join(map(str, self.where)) if self.where else "")


_PICK = re.compile(r"^\s*(max|min)\s*:\s*([a-z0-9_]+)\s*(?:\bwhere\b(.*))?$", re.S)


def parse_pick(expr: str) -> PickRule:
    """`max:output_tps where ttft_p99<0.5` (conditions joined by `and`; latencies in seconds or with ms/s)."""
    m = _PICK.match(expr or "")
    if not m:
        raise InputError(f"--pick {expr!r}: write max:METRIC or min:METRIC, optionally followed by "
                         f"'where CONDITION and ...', e.g. 'max:output_tps where ttft_p99<0.5'")
    goal, metric, where = m.groups()
    if metric not in METRICS:
        raise InputError(f"--pick: unknown metric {metric!r}; choose from {sorted(METRICS)}")
    if where is not None and not where.strip():
        raise InputError(f"--pick {expr!r}: 'where' needs at least one condition, e.g. 'ttft_p99<0.5'")
    return PickRule(goal, metric, tuple(parse_conditions(where, what="--pick")))


class ReferenceIsBest(InputError):
    """`--best` (or the best rule) when the reference (the engine's defaults) wins: there is no trial to recommend."""


def best_rule(study: StudyView) -> PickRule:
    """What `--best` means: the front's best on the first objective to maximize (else the first
    objective), the same rule `tune --trace` uses for best.json (`tuner.front.deciding_objective`)."""
    key = next((o for o, d in zip(study.objectives, study.directions) if d == "maximize"), study.objectives[0])
    direction = dict(zip(study.objectives, study.directions))[key]
    return PickRule("max" if direction == "maximize" else "min", key)


def pick_trial(study: StudyView, rule: PickRule) -> TrialView:
    """The candidate that meets every condition of `rule` and is best on its metric: the front's
    trials and the engine's defaults (the reference, when they keep the study's SLOs), ties going to the
    defaults (a change must earn its place)."""
    ref = study.reference_run
    pool = ([ref] if ref is not None and _reference_competes(study) else []) + study.front
    if not pool:
        raise InputError(f"study {study.name!r} has no feasible measured trial on its Pareto front yet; "
                         f"use --trial N to export a specific trial")
    ok = [t for t in pool if all(c.holds(t.metric(c.metric)) for c in rule.where)]
    ok = [t for t in ok if not math.isnan(t.metric(rule.metric))]
    if not ok:
        shown = sorted({c.metric for c in rule.where} | {rule.metric})
        values = "; ".join(f"{_name(t, study)}: " + ", ".join(f"{m}={t.metric(m):.4g}" for m in shown)
                           for t in pool)
        nor = f", nor do {study.reference_name}" if pool[0].is_reference else ""
        raise InputError(f"--pick {rule}: no trial on the front meets it{nor} ({values})")
    sign = 1 if rule.goal == "max" else -1
    return max(ok, key=lambda t: (sign * t.metric(rule.metric), -t.number))


def _reference_competes(study: StudyView) -> bool:
    """The reference is a candidate: measured, and within the study's SLOs."""
    ref = study.reference_run
    return ref is not None and ref.measured and (study.decision is None or study.decision.reference_feasible)


def _name(trial: TrialView, study: StudyView) -> str:
    return study.reference_name if trial.is_reference else f"trial {trial.number}"


def best_trial(study: StudyView) -> TrialView:
    """The trial `--best` exports: the tuner's best (`tuner.front.decide`, the engine's defaults competing).
    Raises ReferenceIsBest when the defaults are best: no trial beats them, so none is recommended."""
    decision = study.decision
    if decision is not None and decision.reference_is_best:
        verdict = decision.verdict()
        raise ReferenceIsBest(f"{study.reference_name} are best in study {study.name!r} (by {decision.by}), so there "
                              f"is no trial to export: {verdict} (`--reference` exports the defaults; to export a "
                              f"trial anyway, name it with --trial N.)")
    if decision is not None and decision.best is not None and isinstance(decision.best.label, int):
        return study.trial(decision.best.label)
    return pick_trial(study, best_rule(study))


def pick_for(study: StudyView, rule: PickRule) -> TrialView:
    """`pick_trial`, except that the best rule itself answers as `--best` does (the defaults may win)."""
    return best_trial(study) if rule == best_rule(study) else pick_trial(study, rule)


def select_trial(study: StudyView, *, trial: int | None = None, best: bool = False, pick: str | None = None,
                 reference: bool = False) -> TrialView:
    """The trial `--trial N`, `--best`, `--pick EXPR` or `--reference` names (exactly one of them)."""
    if sum(x is not None and x is not False for x in (trial, best or None, pick, reference or None)) != 1:
        raise InputError("choose the trial with exactly one of --trial N, --best, --pick EXPR or --reference")
    if reference:
        if study.reference_run is None:
            raise InputError(f"study {study.name!r} has no measured reference yet; nothing to export")
        return study.reference_run
    if trial is not None:
        chosen = study.trial(trial)
        if chosen.config is None or not chosen.measured:
            reason = f": {chosen.failure_reason}" if chosen.failure_reason else ""
            raise InputError(f"trial {trial} of study {study.name!r} is {chosen.status}, so there is no measured "
                             f"config to export{reason}")
        return chosen
    return best_trial(study) if best else pick_for(study, parse_pick(pick or ""))

