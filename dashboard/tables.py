"""Tables of a study: the Trials table and its filter conditions, Compare's rows, failures grouped
by cause."""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Iterable, Sequence

from tracetune.dashboard import capacity, judged
from tracetune.dashboard.data import has_capacity
from tracetune.dashboard.metrics import METRICS, display_interval, display_value, quality_text, speculation
from tracetune.dashboard.standing import apart
from tracetune.dashboard.study_view import StudyView
from tracetune.dashboard.trial import CATEGORIES, TrialView, diff_text
from tracetune.errors import InputError
from tracetune.replay.acceptance import caveat_line
from tracetune.replay.metrics import METRICS as LATENCIES
from tracetune.replay.metrics import Summary
from tracetune.tuner.front import economics
from tracetune.types import JsonDict

# A table's row: column -> cell.
Row = dict[str, str | int | float | bool | None]

# -- conditions (table filters and --pick) ------------------------------------------------------
_COND = re.compile(r"^\s*([a-z0-9_]+)\s*(<=|>=|==|!=|<|>)\s*([-+]?[0-9]*\.?[0-9]+(?:[eE][-+]?\d+)?)\s*(ms|s|us)?\s*$")


_UNITS = {"ms": 1e-3, "s": 1.0, "us": 1e-6, None: 1.0}


@dataclasses.dataclass(frozen=True)
class Condition:
    metric: str
    op: str
    value: float
    text: str = dataclasses.field(default="", compare=False)  # as the user wrote it (`ttft_p99<500ms`)

    def holds(self, value: float) -> bool:
        if math.isnan(value):
            return False
        return {"<": value < self.value, "<=": value <= self.value, ">": value > self.value,
                ">=": value >= self.value, "==": value == self.value, "!=": value != self.value}[self.op]

    def __str__(self) -> str:
        return self.text or f"{self.metric}{self.op}{self.value:g}"


def parse_conditions(text: str | None, *, what: str = "filter") -> list[Condition]:
    """`ttft_p99<0.5 and output_tps>=15` (latencies in seconds, or with a unit: `ttft_p99<500ms`)."""
    if not text or not text.strip():
        return []
    out = []
    for part in re.split(r"\s+and\s+|\s*,\s*|\s*&&?\s*", text.strip()):
        if not part:
            continue
        m = _COND.match(part)
        if not m:
            raise InputError(f"{what}: cannot read {part!r}; write METRIC OP NUMBER, e.g. 'ttft_p99<0.5' or "
                             f"'ttft_p99<500ms and output_tps>20' (OP: < <= > >= == !=)")
        metric, op, number, unit = m.groups()
        if metric not in METRICS:
            raise InputError(f"{what}: unknown metric {metric!r} in {part!r}; choose from {sorted(METRICS)}")
        if unit and metric.split("_")[0] not in LATENCIES:
            raise InputError(f"{what}: {metric} is not a latency, so {part!r} cannot carry a time unit")
        out.append(Condition(metric, op, float(number) * _UNITS[unit], text=re.sub(r"\s+", "", part)))
    return out


def filter_trials(trials: Iterable[TrialView], conditions: Sequence[Condition], *,
                  categories: Sequence[str] | None = None) -> list[TrialView]:
    """Trials meeting every condition (a trial without a value for a metric does not meet it)."""
    out = []
    for t in trials:
        if categories is not None and t.category not in categories:
            continue
        if all(c.holds(t.metric(c.metric)) for c in conditions):
            out.append(t)
    return out


# -- tables --------------------------------------------------------------------------------------
def trial_table(study: StudyView, trials: Sequence[TrialView] | None = None) -> list[Row]:
    """One row per trial: the decision columns first (`decision_columns`: number, category, each
    objective, quality cost, the difference from the reference, why it stands where it does), then
    capacity, throughput/latency extras, speculation (the replay's counters; the acceptance probe's
    natural-stop figure and caveats where a trial has one), intervals, sample sizes, start-up time; in a
    study of several workers, which one measured it (`TrialView.worker_text`)."""
    rows = []
    with_capacity, several_workers = has_capacity(study), study.several_workers
    drafted = any(speculation(t.counters)[0] is not None for t in study.candidates)
    probed = any(t.acceptance is not None for t in study.candidates)
    for t in (study.trials if trials is None else trials):
        row: Row = {"trial": t.number, "category": t.category}
        for name in study.objectives:
            row[name] = t.metric(name)
        row["quality vs defaults"] = "-" if t.is_reference else quality_text(t.quality)
        row["differs from reference"] = (diff_text(t.diff) if t.config else
                                         "sampled: " + ", ".join(f"{k}={v}" for k, v in t.params.items()))
        row["why"] = why(study, t)[:300]
        row["status"] = t.status
        if several_workers:
            row["worker"] = t.worker_text
        if with_capacity:
            row.setdefault("capacity", t.metric("capacity"))
            row.update(capacity.table_columns(t.summary if t.measured else None))
            row.update(cost_columns(study, t.summary if t.measured else None))
        for extra in ("ttft_p50", "e2e_p99", "output_tps", "error_rate", *(SPEC_COLUMNS if drafted else ())):
            if extra not in row:
                row[extra] = t.metric(extra)
        if probed:
            row.update(probe_columns(t))
        row["95% intervals"] = intervals_text(t, study.objectives)
        row["based on"] = t.sample_sizes
        row["startup_s"] = t.startup_s
        rows.append(row)
    return rows


SPEC_COLUMNS = ("spec_acceptance_rate", "spec_accepted_length")


def probe_columns(t: TrialView) -> Row:
    """The acceptance probe's columns (`replay.acceptance`): draft acceptance with natural stops, beside
    the replay's forced one (`spec_acceptance_rate`), and why it may not hold on real traffic ("-": no
    caveat, or no probe)."""
    return {"spec_natural_rate": t.metric("spec_natural_rate"),
            "speculation caveat": caveat_line(t.acceptance) or "-"}


def decision_columns(study: StudyView) -> list[str]:
    """The Trials view's default columns: what a choice is made by (at most 8 with three objectives), and
    which worker measured each trial when several did."""
    # "why" beside the category it explains: last, it was off-screen on a 1440 px wide page
    return ["trial", "category", "why", *study.objectives, "quality vs defaults", "differs from reference",
            *(["worker"] if study.several_workers else [])]


def why(study: StudyView, t: TrialView) -> str:
    """Why a trial stands where it does, in a few words: what it breaks, what stopped it, what it ties."""
    if t.is_reference:
        return "; ".join([f"{study.reference_name}: the reference every trial is measured against", *t.violations])
    if t.violations:
        return "; ".join(t.violations)
    if not t.measured:
        return t.failure_reason or t.status
    if t.beaten_by_reference:
        tie = " (inside the 95% intervals: a tie)" if t.tied else ""
        return f"{study.reference_name} beat it on every objective{tie}"
    notes = {"tie": "dominated only inside the 95% intervals", "dominated": "another run is better on every objective"}
    words = [notes.get(t.category, "")] + ([f"{judged.gate_phrase(t.gate_decision)} {study.gate_words}"]
                                           if t.outside_gate else [])
    return "; ".join(w for w in words if w)


# -- the front, as a decision ---------------------------------------------------------------------
def front_rows(study: StudyView) -> list[TrialView]:
    """What a choice is made from: the front (the reference when on it), the trials tied with it
    inside the intervals, and the trials only the quality gate kept off it that would otherwise be on it."""
    from tracetune.tuner.front import Candidate, front

    pool = [t for t in study.candidates if t.measured and (t.category in ("pareto", "tie", "dominated")
                                                           or t.only_the_gate or (t.is_reference and t.feasible))]
    points = [Candidate(t.number, tuple(t.metric(o) for o in study.objectives)) for t in pool]
    ungated = {c.label for c in front(points, study.directions)}
    chosen = [t for t in pool if t.on_front or t.tied or (t.only_the_gate and t.number in ungated)]
    ref = study.reference_run  # breaking the SLO, the engine's defaults stay listed: as the reference, not a candidate
    chosen += [ref] if ref is not None and ref.measured and not ref.feasible else []
    order = {"pareto": 0, "tie": 1}
    return sorted(chosen, key=lambda t: (0 if t.is_reference else 1, order.get(t.category, 2), t.number))


def standing(study: StudyView, t: TrialView, rows: Sequence[TrialView]) -> str:
    """Where a row of the front table stands, in words."""
    phrase = judged.gate_phrase(t.gate_decision)
    if t.is_reference and t.violations:
        return "the reference, not a candidate: " + "; ".join(t.violations)
    if t.only_the_gate:
        return f"off the front: {phrase} {study.gate_words} alone"
    if t.on_front:
        return "on the front" + (f", {phrase} {study.gate_words}" if t.outside_gate else "")
    from tracetune.tuner.front import dominates

    by = [u.label for u in rows if u is not t and dominates([u.metric(o) for o in study.objectives],
                                                            [t.metric(o) for o in study.objectives], study.directions)]
    return f"tie: dominated by {', '.join(by) or 'another run'} only inside the 95% intervals"


def apart_text(study: StudyView, t: TrialView, rows: Sequence[TrialView]) -> str:
    """Which other rows `t` is statistically apart from (95% intervals apart on at least one objective)."""
    others = [u for u in rows if u is not t]
    far = [u.label for u in others if any(apart(t, u, o) for o in study.objectives)]
    near = [u.label for u in others if u.label not in far]
    if not others:
        return "-"
    if not near:
        return "apart from every other row"
    return (f"apart from {', '.join(far)}; " if far else "") + f"inside the intervals of {', '.join(near)}"


def front_table(study: StudyView) -> list[Row]:
    """The front as a decision: each row's standing, objectives with 95% intervals, its quality cost
    in perplexity, KLD and top-1 (with intervals), and which other rows it is statistically apart from."""
    rows = front_rows(study)
    out = []
    for t in rows:
        row: Row = {"trial": t.label, "standing": standing(study, t, rows),
                               "statistically": apart_text(study, t, rows)}
        for o in study.objectives:
            row[o] = " ".join(filter(None, (display_value(o, t.metric(o)), display_interval(o, t.interval(o)))))
        row["quality vs defaults"] = "the reference itself" if t.is_reference else quality_text(t.quality)
        row["differs from reference"] = f"({study.reference_name})" if t.is_reference else diff_text(t.diff)
        out.append(row)
    return out


def cost_columns(study: StudyView, summary: Summary | None) -> dict[str, float]:
    """The table's cost and sizing columns (none when the study was run without the flags)."""
    names = {"usd_per_1m_output_tokens": "$/1M output tokens", "usd_per_1m_input_tokens": "$/1M input tokens",
             "replicas": "replicas", "gpus_total": f"GPUs for {study.economics.get('target_rate', 0):g} req/s"}
    columns = economics({"capacity_rps": 1.0}, **study.economics) if study.economics else {}  # which the flags give
    costs = study.costs(summary)
    return {names[key]: costs.get(key, math.nan) for key in columns}


def sort_for_table(trials: Iterable[TrialView]) -> list[TrialView]:
    """Front first, then dominated, infeasible, failed and running; by trial number within each."""
    order = {c: i for i, c in enumerate(CATEGORIES)}
    return sorted(trials, key=lambda t: (order[t.category], t.number))


def intervals_text(t: TrialView, metrics: Sequence[str]) -> str:
    """Each metric's 95% interval, for the table (capacity's is its bracket)."""
    parts = [f"{m} {display_interval(m, t.interval(m))}" for m in metrics if t.interval(m) is not None]
    return " · ".join(parts)


def flat_config(config: JsonDict | None) -> JsonDict:
    """A config dump with speculation flattened, for side-by-side display."""
    if not config:
        return {}
    out = {k: v for k, v in config.items() if k not in ("speculative", "env", "extra_args")}
    spec = config.get("speculative") or {}
    for k, v in spec.items():
        out[f"speculative.{k}"] = v
    out["extra_args"] = " ".join(config.get("extra_args") or []) or None
    out["env"] = ", ".join(sorted(config.get("env") or {})) or None
    return out


def compare(study: StudyView, a: TrialView, b: TrialView) -> list[Row]:
    """Side-by-side rows, with whether they differ: status, the config fields that differ, every
    metric, then the config fields that are the same."""
    rows = [{"field": "status", "a": a.status, "b": b.status, "differs": a.status != b.status}]
    ca, cb = flat_config(a.config), flat_config(b.config)
    config_rows = [{"field": f"config.{key}", "a": "-" if ca.get(key) is None else str(ca.get(key)),
                    "b": "-" if cb.get(key) is None else str(cb.get(key)), "differs": ca.get(key) != cb.get(key)}
                   for key in dict.fromkeys([*ca, *cb])]
    rows += [r for r in config_rows if r["differs"]]
    for name in [*study.objectives, *(m for m in METRICS if m not in study.objectives)]:
        va, vb = a.metric(name), b.metric(name)
        if math.isnan(va) and math.isnan(vb):
            continue
        shown = [" ".join(filter(None, (display_value(name, v), display_interval(name, t.interval(name)))))
                 for v, t in ((va, a), (vb, b))]
        # measured with intervals, a difference inside them is no difference (`standing.apart`)
        differs = apart(a, b, name) if a.interval(name) and b.interval(name) else \
            display_value(name, va) != display_value(name, vb)
        rows.append({"field": name, "a": shown[0], "b": shown[1], "differs": differs})
    rows.append({"field": "based on", "a": a.sample_sizes or "-", "b": b.sample_sizes or "-",
                 "differs": a.sample_sizes != b.sample_sizes})
    ba, bb = (capacity.bracket_text(t.capacity) for t in (a, b))
    if ba or bb:
        rows.append({"field": "capacity bracket", "a": ba or "-", "b": bb or "-", "differs": ba != bb})
    return rows + [r for r in config_rows if not r["differs"]]


def failure_causes(trials: Sequence[TrialView]) -> list[Row]:
    """Unmeasured trials grouped by cause (`tuner.front.group_failures`), the most frequent first."""
    from tracetune.tuner.front import group_failures

    groups = group_failures([(t.number, t.status, (t.failure_reason or "")[:300]) for t in trials])
    return [{"status": status, "count": len(numbers), "trials": ", ".join(map(str, numbers)), "reason": reason}
            for status, reason, numbers in groups]
