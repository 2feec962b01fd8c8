"""Where each trial of a study stands: the front decided by the tuner's own rule (`tuner.front.decide`,
the engine's defaults competing like a trial), the trials tied with it inside the 95% intervals, why each
measured trial is off it (`dashboard.metrics.violations`), and the 2-D fronts of the plotted axes."""

from __future__ import annotations

import math
from collections.abc import Sequence

from tracetune.dashboard import judged
from tracetune.dashboard.metrics import METRICS, violations
from tracetune.dashboard.study_view import StudyView
from tracetune.dashboard.trial import TrialView
from tracetune.quality.gate import cost_text

# The tuner's one dominance rule (also on the plotted axes) and front decision.
from tracetune.tuner.front import REFERENCE, BeyondGate, Candidate, decide, dominates
from tracetune.tuner.objectives import keeps_slos


def pareto_mask(points: Sequence[Sequence[float]], directions: Sequence[str]) -> list[bool]:
    """True for the points no other point dominates (points with a NaN are never on the front)."""
    valid = [not any(math.isnan(v) for v in p) for p in points]
    out = []
    for i, p in enumerate(points):
        if not valid[i]:
            out.append(False)
            continue
        out.append(not any(valid[j] and dominates(q, p, directions) for j, q in enumerate(points) if j != i))
    return out


def front_on(trials: Sequence[TrialView], metrics: Sequence[str]) -> list[TrialView]:
    """Feasible measured trials on the Pareto front of the given metrics (e.g. the two plotted)."""
    candidates = [t for t in trials if t.category in ("pareto", "tie", "dominated")]
    directions = [METRICS[m] for m in metrics]
    mask = pareto_mask([[t.metric(m) for m in metrics] for t in candidates], directions)
    return [t for t, on in zip(candidates, mask) if on]


def front_line(trials: Sequence[TrialView], x: str, y: str) -> tuple[list[float], list[float]]:
    """The 2-D front as a staircase through its points, sorted along x (for drawing)."""
    pts = sorted((t.metric(x), t.metric(y)) for t in front_on(trials, [x, y]))
    xs: list[float] = []
    ys: list[float] = []
    for i, (px, py) in enumerate(pts):
        if i:
            # step: keep the previous y until the next x (the front is a staircase, not a diagonal)
            xs.append(px)
            ys.append(ys[-1])
        xs.append(px)
        ys.append(py)
    return xs, ys


def explain(study: StudyView, only_gate: set[int]) -> None:
    """Say why each measured trial is off the front for a constraint (`metrics.violations`), and mark
    the trials whose quality breaks the gate shown (the study's, or the default one when it set none)."""
    gate = study.shown_gate
    for t in study.trials:
        if not t.measured:
            continue
        t.gate_decision = gate.decide(t.quality)
        t.outside_gate = t.gate_decision.measured is not None and not t.gate_decision.within
        if not t.feasible:
            # speculation on random weights: measured, kept off the front for the reason the tuner stored
            t.violations = [t.not_meaningful] if t.not_meaningful else \
                violations(t.summary, t.quality, study.parsed_slos, study.quality_gate, t.constraints)
            # `tuner.front.trials_beyond_only_the_gate`, with every request served (as the verdict counts them)
            t.only_the_gate = t.number in only_gate and not (t.summary and t.summary.error_rate)


def reference_values(study: StudyView) -> tuple[float, ...] | None:
    """The reference's values of the study objectives, as the tuner counts them (None: no reference yet)."""
    if study.reference_summary is None:
        return None
    values = tuple(study.reference_metric(o) if o in METRICS else math.nan for o in study.objectives)
    return None if all(math.isnan(v) for v in values) else values


def mark_front(study: StudyView) -> None:
    """Set `on_front` for the feasible measured trials on the study's Pareto front, with the engine's
    defaults (the reference) competing like a trial: `tuner.front.decide`, the tuner's own rule."""
    candidates = [t for t in study.trials if t.measured and t.state == "COMPLETE" and t.feasible]
    for t in study.trials:
        t.on_front = t.beaten_by_reference = False
    if not study.directions:
        return
    points = [Candidate(t.number, tuple(t.objective_values.get(o, math.nan) for o in study.objectives))
              for t in candidates]
    ref = reference_values(study)
    ref_ok = keeps_slos(study.reference_summary, study.parsed_slos)
    beyond = [BeyondGate(Candidate(t.number, tuple(t.objective_values.get(o, math.nan) for o in study.objectives)),
                         str(study.quality_gate), cost_text(t.quality)) for t in study.trials if t.only_the_gate]
    study.decision = decide(points, None if ref is None else Candidate(REFERENCE, ref), study.objectives,
                            study.directions, reference_feasible=ref_ok, beyond_gate=beyond,
                            outside_constraints=sum(t.category == "infeasible" for t in study.trials),
                            stopped_early=sum(t.category == "pruned" for t in study.trials),
                            reference_breach=judged.breach(study.reference, study.parsed_slos, ref_ok),
                            quality_words=judged.quality_words(study.trials, study.gate_words),
                            speculation_words=judged.speculation_words(study.trials),
                            reference_name=study.reference_name)
    on_front = set(study.decision.trials_on_front)
    beaten = set(study.decision.dominated_by_reference)
    for t in candidates:
        t.on_front, t.beaten_by_reference = t.number in on_front, t.number in beaten
    judged.mark_reference(study.reference_run, study.decision)  # on the front, or marked as breaking the SLO
    pool = candidates + ([study.reference_run] if study.reference_run is not None else [])
    for t in pool:
        t.tied = not t.on_front and not any(
            clearly_dominates(other, t, study.objectives, study.directions) for other in pool if other is not t)


# A zero-width interval (every request good, or too few requests for the bootstrap to spread them)
# says the sample could not show its spread, not that the value is exact: no interval is read
# narrower than +-1% of its value (a replay of the same trace varies by more from run to run).
MIN_HALF_WIDTH = 0.01


def interval_of(t: TrialView, name: str) -> tuple[float, float]:
    """The metric's 95% interval as dominance reads it: at least +-MIN_HALF_WIDTH of the value wide."""
    value = t.metric(name)
    low, high = t.interval(name) or (value, value)
    half = abs(value) * MIN_HALF_WIDTH
    return min(low, value - half), max(high, value + half)


def apart(a: TrialView, b: TrialView, name: str) -> bool:
    """The two runs' intervals of the metric do not overlap: statistically apart on it."""
    (a_low, a_high), (b_low, b_high) = interval_of(a, name), interval_of(b, name)
    return a_high < b_low or b_high < a_low


def clearly_dominates(a: TrialView, b: TrialView, objectives: Sequence[str], directions: Sequence[str]) -> bool:
    """`a` dominates `b`, and on at least one objective their 95% intervals (`interval_of`) do not
    overlap. Otherwise the difference is inside the measurement's uncertainty: `b` is shown as tied
    with the front, not as dominated."""
    if not dominates([a.metric(o) for o in objectives], [b.metric(o) for o in objectives], directions):
        return False
    return any(apart(a, b, o) for o in objectives)
