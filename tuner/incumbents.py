"""The front as it stands while a study runs, the reference (the engine's defaults) competing: which
trials are on it (for --patience) and where a trial's capacity search may stop early (--prune): at
the capacity of the strongest incumbent at least as good on every other objective; and at the
trace's own rate when the trial misses the study's SLOs there, which keeps it off the front whatever
its capacity."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from tracetune.quality.probe import QualityResult
from tracetune.replay.metrics import Summary
from tracetune.stored import Stored
from tracetune.tuner.front import REFERENCE, Candidate, decide, measured_trials, strongest_rival
from tracetune.tuner.objectives import OBJECTIVES, keeps_slos, objective_value
from tracetune.tuner.settings import StudySettings

if TYPE_CHECKING:
    import optuna


def candidates(study: optuna.Study, reference_values: list[float] | None) -> tuple[Candidate | None, list[Candidate]]:
    """The reference (None until measured) and the measured, feasible trials, as front candidates."""
    ref = None if reference_values is None else Candidate(REFERENCE, tuple(reference_values))
    return ref, [Candidate(t.number, tuple(t.values)) for t in measured_trials(study)]


def front_labels(study: optuna.Study, objectives: list[str],
                 reference_values: list[float] | None) -> frozenset[int | str]:
    """The trials on the front now, the reference competing ("reference" when it is on it)."""
    reference, trials = candidates(study, reference_values)
    decision = decide(trials, reference, objectives, [OBJECTIVES[name] for name in objectives])
    return frozenset(c.label for c in decision.front)


def prune_rival(settings: StudySettings, study: optuna.Study, reference_values: list[float] | None,
                summary: Summary, quality: QualityResult | None, gpus: int,
                base_rps: float) -> tuple[float, Candidate | None] | None:
    """The load level at which a trial's capacity search stops early (`capacity.step`), and the rival
    it cannot beat: the strongest incumbent (the reference included) at least as good as this trial on
    every other objective; failing its capacity, the trial cannot be on the front. A trial that missed
    the study's SLOs at the trace's rate (`tuner.objectives.keeps_slos`) is off the front whatever its capacity: its
    search stops at least as low as where it fails the trace's rate (1x; the rival None when no
    incumbent would have stopped it). None: nothing to stop at."""
    objectives = settings.objectives
    if not settings.prune or settings.capacity is None or "capacity" not in objectives or base_rps <= 0:
        return None
    index = objectives.index("capacity")
    mine = [objective_value(name, summary, quality) if name != "capacity" else math.nan for name in objectives]
    reference, trials = candidates(study, reference_values)
    rival = strongest_rival(mine, ([reference] if reference else []) + trials,
                            [OBJECTIVES[name] for name in objectives], index)
    level = None if rival is None or not rival.values[index] > 0 else rival.values[index] * gpus / base_rps
    if not keeps_slos(summary, settings.slos):
        # A level at or above 1x stops the search where the trace's rate failed (`capacity.search`'s prune).
        return min(max(level or 1.0, 1.0), settings.capacity.max_scale), rival if level else None
    return None if level is None or rival is None else (min(level, settings.capacity.max_scale), rival)


def pruned_reason(objectives: list[str], rival: Candidate | None, capacity: Stored, missed: list[str], *,
                  reference_name: str, outside: str = "") -> str:
    """Why a trial's capacity search stopped early, naming the configuration (`rival`; the reference as
    `reference_name`, its engine's `EngineKind.defaults_label`) it cannot beat, the study's SLOs it
    `missed` at the trace's rate (`tuner.front.slo_misses`) where it stopped there, or the quality gate
    it lies `outside` (`tuner.objectives.outside_gate`: searched no further than the trace's rate)."""
    from tracetune.capacity.step import CapacityResult, bracket_text

    result = CapacityResult.from_dict(capacity)
    high = result.bracket_high
    tail = f": it cannot be on the front; capacity {bracket_text(capacity)}, not searched further"
    if outside and not (missed and high is not None and high <= 1.0 + 1e-9):
        return (f"pruned: {outside}: it cannot be on the front whatever its capacity; capacity "
                f"{bracket_text(capacity)}, not searched beyond the trace's rate")
    assert high is not None, "a pruned search ends at a failed level"
    head = f"pruned: fails {high:.3g}x the trace's rate ({result.confirmation()}), "
    if missed and high <= 1.0 + 1e-9:
        return f"{head}and misses the study's SLOs there: {', '.join(missed)}{tail}"
    is_reference = rival is not None and rival.label == REFERENCE
    who = "an incumbent" if rival is None else reference_name if is_reference else f"trial {rival.label}"
    others = [n for n in objectives if n != "capacity"]
    verb = "pass and are" if is_reference else "passes and is"
    return f"{head}where {who} {verb} at least as good on {', '.join(others) or 'every other objective'}{tail}"


def with_cause(reason: str, capacity: Stored) -> str:
    """`reason` followed by why the level that bounds the capacity failed (`capacity.causes`), where a
    cause was found."""
    from tracetune.capacity.result import CapacityResult, failure_cause

    cause, high = failure_cause(capacity), CapacityResult.from_dict(capacity).bracket_high
    return f"{reason}. At {high:.3g}x: {cause}" if cause and high is not None else reason
