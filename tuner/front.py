"""The Pareto front with the reference (the engine's defaults) as a competitor, and the one rule that
picks "best".

The reference (the engine's defaults, measured the same way as every trial) is a candidate like
any trial while it keeps the study's SLOs: a trial it dominates is not on the front and is never
recommended; when the reference itself has the best value of the deciding objective, the answer is
"keep the defaults", said in plain words. A reference that breaks the SLO is no candidate: it is
neither on the front nor best, and the verdict says by how much it breaks it.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from tracetune.replay.metrics import seconds_text
from tracetune.stored import Stored, listed, mapping, whole
from tracetune.stored import number as to_float

if TYPE_CHECKING:
    from optuna import Study
    from optuna.trial import FrozenTrial

    from tracetune.replay.metrics import SLO

REFERENCE = "reference"

Label = int | str  # a trial number, or REFERENCE


@dataclasses.dataclass(frozen=True)
class Candidate:
    label: Label
    values: tuple[float, ...]


def dominates(a: Sequence[float], b: Sequence[float], directions: Sequence[str]) -> bool:
    """`a` is at least as good as `b` on every objective and better on one (NaN is worst)."""
    def better_or_equal(x: float, y: float, direction: str) -> bool:
        if math.isnan(y):
            return True
        if math.isnan(x):
            return False
        return x >= y if direction == "maximize" else x <= y

    if not all(better_or_equal(x, y, d) for x, y, d in zip(a, b, directions)):
        return False
    return any(x != y and not (math.isnan(x) and math.isnan(y)) for x, y in zip(a, b))


def front(candidates: Sequence[Candidate], directions: Sequence[str]) -> list[Candidate]:
    """The candidates no other candidate dominates, in the given order."""
    return [c for c in candidates
            if not any(dominates(o.values, c.values, directions) for o in candidates if o is not c)]


def hypervolume(points: Sequence[Sequence[float]], ref: Sequence[float]) -> float:
    """The volume the points dominate up to `ref`, every objective minimised (negate maximised ones);
    a point not better than `ref` on every objective adds nothing. Exact, by slicing along the last
    objective: fine for the few objectives and hundreds of trials of a study."""
    pts = sorted((tuple(p) for p in points if all(x < r for x, r in zip(p, ref))), key=lambda p: p[-1])
    if not pts:
        return 0.0
    if len(ref) == 1:
        return ref[0] - pts[0][0]
    volume = 0.0
    for i, p in enumerate(pts):
        upper = pts[i + 1][-1] if i + 1 < len(pts) else ref[-1]
        if upper > p[-1]:
            volume += (upper - p[-1]) * hypervolume([q[:-1] for q in pts[:i + 1]], ref[:-1])
    return volume


def strongest_rival(values: Sequence[float], incumbents: Sequence[Candidate], directions: Sequence[str],
                    index: int) -> Candidate | None:
    """Of the incumbents at least as good as `values` on every objective but `index`, the one best on
    `index` (None: no such incumbent). A new candidate worse than it on `index` is dominated by it,
    whatever it turns out to be exactly: the bound a search may stop at (`capacity.step`'s `prune_at`)."""
    def others(v: Sequence[float]) -> list[float]:
        return [x for i, x in enumerate(v) if i != index]

    rest = [d for i, d in enumerate(directions) if i != index]
    sign = 1 if directions[index] == "maximize" else -1
    rivals = [c for c in incumbents if not math.isnan(c.values[index])
              and (others(c.values) == others(values) or dominates(others(c.values), others(values), rest))]
    return max(rivals, key=lambda c: sign * c.values[index], default=None)


def group_failures(failures: Sequence[tuple[int, str, str]]) -> list[tuple[str, str, list[int]]]:
    """(trial, status, reason) of unmeasured trials -> (status, reason, trials), one per cause, the
    most frequent first. Reasons that differ only in their numbers (the same rule broken by other
    values) are one cause, shown by its first trial's reason."""
    import re

    groups: dict[tuple[str, str], tuple[list[str], list[int]]] = {}
    for number, status, reason in failures:
        key = (status, re.sub(r"\d+(\.\d+)?", "N", reason or "")[:200])
        reasons, numbers = groups.setdefault(key, ([], []))
        reasons.append(reason or "")
        numbers.append(number)
    ordered = sorted(groups.items(), key=lambda kv: (-len(kv[1][1]), kv[1][1][0]))
    return [(status, _shown_reason(reasons, numbers), numbers) for (status, _), (reasons, numbers) in ordered]


def _shown_reason(reasons: Sequence[str], numbers: Sequence[int]) -> str:
    """A cause's words: its first trial's reason, said to be that trial's where the others' numbers differ."""
    if len(set(reasons)) == 1:
        return reasons[0]
    return f"{reasons[0]} (trial {numbers[0]}'s; the others differ in their numbers)"


def deciding_objective(objectives: Sequence[str], directions: Sequence[str]) -> int:
    """Index of the objective "best" is judged by: the first one to maximise (capacity or
    throughput), else the first objective."""
    return next((i for i, d in enumerate(directions) if d == "maximize"), 0)


@dataclasses.dataclass(frozen=True)
class BeyondGate:
    """The trial that would have been best by the deciding objective had the quality gate not
    stopped it (it kept every SLO and served every request), with what it costs in quality."""

    candidate: Candidate
    gate: str  # the gate as users read it, e.g. "ppl<=+1%"
    cost: str  # its quality loss in words, e.g. "+13.4% perplexity (KLD 0.067, top-1 0.90)"


def default_reference_name() -> str:
    """The reference's name where the study's engine is not known (e.g. a study stored before it was
    recorded): tracetune's default engine's defaults (`EngineKind.defaults_label`)."""
    from tracetune.engine_adapter.registry import engine_kind

    return engine_kind().defaults_label


@dataclasses.dataclass
class Decision:
    objectives: list[str]
    front: list[Candidate]  # reference included when nothing dominates it
    best: Candidate | None
    dominated_by_reference: list[Label]  # trial labels the defaults beat on every objective
    by: str
    reference_feasible: bool = True  # the reference keeps within the study's SLOs (else: no candidate)
    reference_breach: str = ""  # how they break it, e.g. "TTFT p95 17.8 s against 2 s, every load failed"
    outside_constraints: int = 0  # measured trials left out of the front for breaking a constraint
    stopped_early: int = 0  # trials pruned where they could no longer reach the front (`tuner.incumbents`)
    beyond_gate: BeyondGate | None = None  # the best trade the quality gate turned down
    reference_values: tuple[float, ...] | None = None  # the reference's, on the front or not
    # the quality gate's word on trials it does not hold within (`quality.gate.GateDecision.text`)
    quality_words: Mapping[Label, str] = dataclasses.field(default_factory=dict)
    # why a speculative trial's draft acceptance may not hold on real traffic (`replay.acceptance`)
    speculation_words: Mapping[Label, str] = dataclasses.field(default_factory=dict)
    # the reference as the verdict names it: the study's engine's `EngineKind.defaults_label` ("vLLM's defaults")
    reference_name: str = dataclasses.field(default_factory=default_reference_name)

    @property
    def reference_is_best(self) -> bool:
        return self.best is not None and self.best.label == REFERENCE

    @property
    def trials_on_front(self) -> list[Label]:
        return [c.label for c in self.front if c.label != REFERENCE]

    def verdict(self) -> str:
        """The answer in plain words: the best within the quality gate (and, where the gate does not
        hold it within, e.g. a study without a gate, the gate's word on it), then, where the gate
        turned down a better trade, that trade and its cost."""
        words = self.quality_words.get(self.best.label) if self.best is not None else None
        return (self._within_gate() + (f" Its quality: {words}." if words else "") + self._speculation_text()
                + self._beyond_gate_text())

    def _speculation_text(self) -> str:
        """The caveat on the best trial's speculation, or on other front trials'."""
        if self.best is not None and (words := self.speculation_words.get(self.best.label)):
            return (f" Caveat: its speed rests on speculative decoding whose acceptance may not hold on "
                    f"your traffic: {words}.")
        others = [label for label in self.trials_on_front if label in self.speculation_words]
        if not others:
            return ""
        return (f" Front trial(s) {', '.join(map(str, others))} speculate on acceptance that may not hold "
                f"on your traffic (see the table).")

    def _within_gate(self) -> str:
        if self.best is None:
            if not self.reference_feasible:
                return self._nothing_meets_the_slo()
            return "nothing measured yet: no recommendation."
        if self.reference_is_best:
            if not self.trials_on_front:
                return self._nothing_beats_the_reference()
            return (f"no configuration beats {self.reference_name} on {self.by}: keep the defaults, unless the "
                    f"trade-off of a front trial ({', '.join(map(str, self.trials_on_front))}) suits you better.")
        if not self.reference_feasible:
            breach = f" ({self.reference_breach})" if self.reference_breach else ""
            return (f"trial {self.best.label} is best by {self.by} on the front; {self.reference_name} are not a "
                    f"candidate: they break the SLO{breach}.")
        return f"trial {self.best.label} is best by {self.by} on the front ({self.reference_name} included)."

    def _beyond_gate_text(self) -> str:
        if self.beyond_gate is None:
            return ""
        b = self.beyond_gate
        key = self.objectives.index(self.by)
        value = b.candidate.values[key]
        ref = self.reference_values[key] if self.reference_values is not None else None
        amount = (f"{value / ref:.2f}x {self.reference_name}' {self.by}" if ref and math.isfinite(ref) and ref > 0
                  else f"{self.by} {value:.4g}")
        return (f" Outside the quality gate ({b.gate}): trial {b.candidate.label} reaches {amount} at {b.cost};"
                f" not recommended unless that loss is acceptable for this model and traffic.")

    def _nothing_meets_the_slo(self) -> str:
        """No trial kept the constraints and the reference breaks the SLO: by how much, and what to do."""
        breach = f"{self.reference_name} break it: {self.reference_breach}" if self.reference_breach else ""
        broke = (f"{self.outside_constraints} measured trial(s) broke the SLO or the quality gate"
                 if self.outside_constraints else "")
        why = "; ".join(w for w in (breach, broke) if w)
        return (f"no configuration meets the SLO, {self.reference_name} included{f' ({why})' if why else ''}: "
                "nothing to recommend. Loosen the SLO, or serve this traffic on a faster machine.")

    def _nothing_beats_the_reference(self) -> str:
        """Why no trial is on the front beside the reference (which keeps the SLO: else it is no candidate)."""
        broke = (f"{self.outside_constraints} measured trial(s) broke the SLO or the quality gate"
                 if self.outside_constraints else "")
        stopped = (f"{self.stopped_early} trial(s) were stopped early where they could no longer reach the front"
                   if self.stopped_early else "")
        if self.outside_constraints and not self.dominated_by_reference:
            why = f"{broke}, and none is within them"
        elif self.stopped_early and not self.dominated_by_reference:
            why = ""
        else:
            why = ("every measured trial is worse on at least one objective and no better on any"
                   + (", or broke the SLO or the quality gate" if broke else ""))
        return f"no configuration beats {self.reference_name}: " + "; ".join(w for w in (why, stopped) if w) \
            + ". Keep the defaults."


def decide(trials: Sequence[Candidate], reference: Candidate | None, objectives: Sequence[str],
           directions: Sequence[str], *, reference_feasible: bool = True, outside_constraints: int = 0,
           stopped_early: int = 0, beyond_gate: Sequence[BeyondGate] = (), reference_breach: str = "",
           quality_words: Mapping[Label, str] | None = None,
           speculation_words: Mapping[Label, str] | None = None, reference_name: str | None = None) -> Decision:
    """The front of the feasible trials and the reference (while it keeps the SLO: `reference_feasible`;
    one that breaks it is neither on the front nor best, and beats no trial that keeps it), and the
    best of it by the deciding objective (ties go to the reference: a change must earn its place).
    `outside_constraints` (measured trials that broke a constraint), `stopped_early` (trials pruned
    where they could no longer reach the front) and `reference_breach` (how the
    reference breaks the SLO, `slo_breach`) shape the verdict's words; `beyond_gate` (trials that broke
    only the quality gate) too: the best of them is named, with its cost, when it beats the
    recommendation by the deciding objective. `quality_words`: the gate's word on the trials it does
    not hold within (outside, or undecided: their interval reaches both sides), said of the best;
    `speculation_words`: why a trial's draft acceptance may not hold on real traffic; `reference_name`: the
    reference as the verdict names it (the study's `EngineKind.defaults_label`; default: the default engine's)."""
    competing = reference if reference is not None and reference_feasible else None
    candidates = ([competing] if competing is not None else []) + list(trials)
    on_front = front(candidates, directions)
    beaten = [t.label for t in trials if competing is not None and dominates(competing.values, t.values, directions)]
    key = deciding_objective(objectives, directions)
    best = _best_by(on_front, key, directions[key]) if objectives else None
    turned_down = _best_by([b.candidate for b in beyond_gate], key, directions[key]) if objectives else None
    if turned_down is not None and best is not None and not _better(turned_down, best, key, directions[key]):
        turned_down = None
    return Decision(objectives=list(objectives), front=on_front, best=best, dominated_by_reference=beaten,
                    by=objectives[key] if objectives else "", reference_feasible=reference_feasible,
                    reference_breach=reference_breach if not reference_feasible else "",
                    outside_constraints=outside_constraints, stopped_early=stopped_early,
                    beyond_gate=next((b for b in beyond_gate if b.candidate is turned_down), None),
                    reference_values=reference.values if reference is not None else None,
                    quality_words=dict(quality_words or {}), speculation_words=dict(speculation_words or {}),
                    reference_name=reference_name or default_reference_name())


def _better(a: Candidate, b: Candidate, key: int, direction: str) -> bool:
    sign = 1 if direction == "maximize" else -1
    return sign * a.values[key] > sign * b.values[key]


def _best_by(candidates: Sequence[Candidate], key: int, direction: str) -> Candidate | None:
    """The first candidate with the best value of objective `key` (NaN never wins)."""
    best = None
    for c in candidates:
        if math.isnan(c.values[key]):
            continue
        if best is None or _better(c, best, key, direction):
            best = c
    return best


def economics(capacity: Stored | None, *, gpu_hour_cost: float | None = None,
              target_rate: float | None = None) -> dict[str, float]:
    """What a stored capacity result means in money and machines: $ per 1M output (and input)
    tokens when the GPUs run at capacity (the whole GPU hour charged to each kind of token), and
    the replicas and GPUs needed for `target_rate` requests/s of this traffic."""
    if not capacity:
        return {}
    out: dict[str, float] = {}
    gpus = max(whole(capacity.get("gpus"), 1), 1)
    rps, out_tps, in_tps = (to_float(capacity.get("capacity_rps") or 0.0), to_float(capacity.get("capacity_output_tps")
                            or 0.0), to_float(capacity.get("capacity_input_tps") or 0.0))
    if gpu_hour_cost is not None:
        per_hour = gpu_hour_cost * gpus
        out["usd_per_1m_output_tokens"] = per_hour / (out_tps * 3600) * 1e6 if out_tps > 0 else math.inf
        out["usd_per_1m_input_tokens"] = per_hour / (in_tps * 3600) * 1e6 if in_tps > 0 else math.inf
    if target_rate is not None:
        replicas = math.ceil(target_rate / rps - 1e-9) if rps > 0 else math.inf
        out["replicas"] = replicas
        out["gpus_total"] = replicas * gpus if rps > 0 else math.inf
    return out


def not_meaningful(config: Stored) -> str | None:
    """Why a measured configuration must stay off the front whatever its numbers (None: it need not):
    speculative decoding on random weights, whose draft acceptance (hence its speed) says nothing
    about real traffic."""
    spec = mapping(config.get("speculative")).get("method", "none")
    if spec != "none" and config.get("load_format") == "dummy":
        return (f"not meaningful: speculative decoding ({spec}) on random weights (load_format dummy); how many "
                f"draft tokens random weights accept says nothing about real traffic, so its speed is not "
                f"comparable. Measure speculation on the real weights")
    return None


# -- the front of a stored study (an Optuna study's trials, by the rule above) --------------------
class Plateau:
    """The stop rule: True once the front has not changed for `patience` measured trials in a row."""

    def __init__(self, patience: int) -> None:
        self.patience, self.same = patience, 0
        self.last: frozenset[Label] | None = None

    def unchanged(self, front: frozenset[Label]) -> bool:
        self.same = self.same + 1 if front == self.last else 0
        self.last = front
        return self.same >= self.patience


def _complete_measured(study: Study) -> list[FrozenTrial]:
    import optuna

    from tracetune.tuner.trial_record import TrialRecord

    return [t for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
            if (record := TrialRecord.of(t)).measured and not record.not_meaningful]


def measured_trials(study: Study) -> list[FrozenTrial]:
    """The complete trials measured within their constraints: the candidates of the front."""
    from tracetune.tuner.trial_record import TrialRecord

    return [t for t in _complete_measured(study) if TrialRecord.of(t).is_feasible]


def trials_beyond_only_the_gate(study: Study) -> list[FrozenTrial]:
    """Measured trials that kept every SLO but broke the quality gate (the last constraint when the
    study has one: `tuner.objectives.constraint_names`); failed requests are the caller's to check."""
    from tracetune.tuner.trial_record import StudyAttr, TrialRecord

    attrs = study.user_attrs
    if not attrs.get(StudyAttr.QUALITY_GATE) and attrs.get(StudyAttr.MAX_QUALITY_LOSS) is None:
        return []

    out = []
    for t in _complete_measured(study):
        record = TrialRecord.of(t)
        constraints = record.constraints or []
        if not record.is_feasible and constraints and constraints[-1] > 0 \
                and all(c <= 0 for c in constraints[:-1]):
            out.append(t)
    return out


def trials_outside_constraints(study: Study) -> int:
    """Measured trials left out of the front for breaking a constraint (an SLO, the quality gate,
    failed requests)."""
    from tracetune.tuner.trial_record import TrialRecord

    return sum(not TrialRecord.of(t).is_feasible for t in _complete_measured(study))


def pareto_trials(study: Study) -> list[FrozenTrial]:
    """Measured, feasible trials on their Pareto front, by the project's one dominance rule
    (`tuner.front.front`; the reference joins it in `tuner.front.decide`)."""
    measured = measured_trials(study)
    directions = [d.name.lower() for d in study.directions]
    on = {c.label for c in front([Candidate(t.number, tuple(t.values)) for t in measured], directions)}
    return [t for t in measured if t.number in on]


def slo_misses(stored: Stored | None, slos: Sequence[SLO]) -> list[str]:
    """Each statistic of a stored run (its summary) past its SLO threshold, in words, e.g. "TTFT p95
    17.8 s against 2 s", and its failed requests ([] when it keeps them, or was not measured)."""
    summary = mapping(stored)
    parts = []
    least = "at least " if summary.get("ended") else ""  # a replay ended once its miss was certain
    for slo in slos:
        value = to_float(mapping(mapping(mapping(summary.get("latency_s")).get(slo.metric)).get(slo.stat)).get("value"))
        if math.isfinite(value) and value > slo.threshold_s:
            parts.append(f"{slo.metric.upper()} {slo.stat} {least}{seconds_text(value)} against "
                         f"{seconds_text(slo.threshold_s)}")
    if summary.get("error_rate"):
        parts.append(f"{summary.get('errors', '?')} of {summary.get('requests', '?')} requests failed")
    return parts


def slo_breach(stored: Stored | None, slos: Sequence[SLO]) -> str:
    """How a measured run breaks the SLO, in words: `slo_misses`, and, for a capacity search, that every
    load level failed ("" when it keeps it, or was not measured)."""
    summary = mapping(stored)
    parts = slo_misses(stored, slos)
    steps = listed(mapping(summary.get("capacity")).get("steps"))
    if steps and not any(mapping(step).get("passed") for step in steps):
        loads = {mapping(step).get("scale", i) for i, step in enumerate(steps)}  # a repeat is the same load
        parts.append("every load failed" if len(loads) > 1 else "its one load failed")
    return ", ".join(parts)
