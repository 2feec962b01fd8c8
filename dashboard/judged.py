"""The decisions a study view carries beyond its stored numbers: the quality gate read from intervals
(`quality.gate.QualityGate.decide`) on studies stored before the gate read them, the engine's defaults
marked as breaking the SLO (`tuner.front.slo_breach`) when they do, and the words the verdict says of
a trial (its quality, its speculation's caveats). No Streamlit; `dashboard.data` calls these on its
views (typed here by the few fields they touch)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Protocol

from tracetune.quality.gate import UNDECIDED, GateDecision, QualityGate
from tracetune.quality.probe import StoredQuality
from tracetune.replay.acceptance import Acceptance, caveat_line
from tracetune.replay.metrics import SLO
from tracetune.tuner.front import REFERENCE, Decision, slo_breach
from tracetune.tuner.storage import StoredReference


class Judged(Protocol):
    """The fields of a `dashboard.data.TrialView` these decisions read and set."""

    number: int
    feasible: bool
    on_front: bool
    quality: StoredQuality | None
    violations: list[str]
    gate_decision: GateDecision | None

    @property
    def measured(self) -> bool: ...

    @property
    def acceptance(self) -> Acceptance | None: ...


def gate_phrase(decision: GateDecision | None) -> str:
    """How a trial not within the gate stands before the gate's name: "outside", or "undecided
    against" when its quality interval reaches both sides of the limit."""
    return "undecided against" if decision is not None and decision.word == UNDECIDED else "outside"


def undecided_by_the_gate(trials: Iterable[Judged], gate: QualityGate | None) -> set[int]:
    """Trials a study's gate let through on the point of their quality (stored before the gate read
    intervals) whose interval is not within it: now infeasible, by the gate alone (their SLOs held)."""
    if gate is None:
        return set()
    out = set()
    for t in trials:
        if t.measured and t.feasible and t.quality and not gate.decide(t.quality).within:
            t.feasible = False
            out.add(t.number)
    return out


def quality_words(trials: Iterable[Judged], gate_words: str) -> dict[int | str, str]:
    """The gate's word on each trial it does not hold within (outside, or undecided with the probe
    size that would decide it), for the verdict (`tuner.front.Decision.quality_words`)."""
    return {t.number: t.gate_decision.text(gate_words) for t in trials
            if t.gate_decision is not None and t.gate_decision.measured is not None and not t.gate_decision.within}


def speculation_words(trials: Iterable[Judged]) -> dict[int | str, str]:
    """Why each measured trial's draft acceptance may not hold on real traffic, its caveats in one line
    (`replay.acceptance.caveat_line`, as `tune` says them), for the verdict (`tuner.front.Decision.speculation_words`,
    as `tune` passes them)."""
    return {t.number: words for t in trials if t.measured and (words := caveat_line(t.acceptance))}


def breach(reference: StoredReference | None, slos: Sequence[SLO], feasible: bool) -> str:
    """How the engine's defaults (the stored reference: config and summary) break the study's SLO, e.g. "TTFT
    p95 17.8 s against 2 s, every load failed" ("" when they keep it)."""
    return "" if feasible else slo_breach(reference.get("summary") if reference else None, slos)


def mark_reference(ref: Judged | None, decision: Decision | None) -> None:
    """The engine's defaults on the decision's front or not; breaking the SLO, they stay the reference,
    marked as breaking it: infeasible, with by how much (never on the front nor best)."""
    if ref is None or decision is None:
        return
    ref.on_front = any(c.label == REFERENCE for c in decision.front)
    if decision.reference_feasible:
        return
    ref.feasible = False
    breach = decision.reference_breach
    ref.violations = ["breaks the SLO" + (f": {breach}" if breach else "")]
