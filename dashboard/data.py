"""A study as the dashboard and exports see it: `load_study` reads it (through `dashboard.storage`,
never writing) into a `StudyView` of `TrialView`s, the reference's run among them as a candidate,
with the front decided by the tuner's own rule (`tuner.front`), ties inside the intervals marked,
each trial's status (stale heartbeats are interrupted) and why it is off the front. Plain functions,
no Streamlit, so every page's numbers are tested without a browser. Metrics: `dashboard.metrics`;
tables: `dashboard.tables`; thresholds and bands: `dashboard.charts`; request records:
`dashboard.records`; search progress: `dashboard.progress`.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from tracetune.dashboard import capacity, judged
from tracetune.dashboard.metrics import METRICS, metric_interval, metric_value
from tracetune.dashboard.storage import optuna_storage, read_results, resolve_study, silent_for
from tracetune.errors import InputError
from tracetune.quality.gate import GateDecision, cost_text, floor_estimates, floor_text, random_weights, shown_quality

# The tuner's one dominance rule (also on the plotted axes), front decision and cost arithmetic.
from tracetune.tuner.front import (
    REFERENCE,
    BeyondGate,
    Candidate,
    decide,
    dominates,
    economics,
    trials_beyond_only_the_gate,
)
from tracetune.tuner.objectives import reference_feasible
from tracetune.tuner.storage import REFERENCE_RUN

# Categories of a trial in the Pareto view, in drawing order.
CATEGORIES = ("pareto", "tie", "dominated", "infeasible", "pruned", "failed", "running", "queued", "duplicate")


# How an engine log shows its platform, for studies made before the study kept it: vLLM's KV-cache lines
# ("CPU KV cache size", "GPU KV cache usage") and its start-up line "detected platform cpu".
_PLATFORM_LINE = re.compile(r"\b(CPU|GPU) KV cache (?:size|usage)|detected platform (cpu|cuda)\b")


def config_diff(config: dict[str, Any], reference: dict[str, Any]) -> dict[str, Any]:
    """Settings where `config` differs from the reference (speculation flattened; the model path
    shown by its directory name)."""
    from tracetune.tuner.study import config_diff as study_diff

    diff = study_diff(config, reference)
    if "model" in diff:
        diff["model"] = Path(str(diff["model"])).name
    return diff


def diff_text(diff: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in diff.items()) or "(same as reference)"


@dataclasses.dataclass
class TrialView:
    """One trial as the dashboard sees it."""

    number: int
    state: str                      # optuna state: COMPLETE, FAIL, RUNNING, ...
    # measured | pruned | rejected | engine_failed | failed | unmeasurable | interrupted | running
    status: str
    objective_values: dict[str, float]
    constraints: list[float]
    feasible: bool
    params: dict[str, Any]          # search-space values
    config: dict[str, Any] | None   # VLLMConfig dump
    diff: dict[str, Any]
    summary: dict[str, Any] | None = None
    quality: dict[str, Any] | None = None
    engine: dict[str, Any] | None = None
    requests_jsonl: str | None = None
    failure_reason: str | None = None
    not_meaningful: str | None = None  # why the tuner keeps it off every front (`tuner.front.not_meaningful`)
    log_tail: str | None = None
    startup_s: float | None = None
    wall_s: float | None = None
    on_front: bool = False
    beaten_by_reference: bool = False  # vLLM's defaults are at least as good on every objective
    tied: bool = False  # dominated, but only by differences inside the 95% intervals (`clearly_dominates`)
    outside_gate: bool = False  # its quality breaks the study's gate (gate off: the default gate, not applied)
    only_the_gate: bool = False  # kept every SLO and served every request, but broke the quality gate
    gate_decision: GateDecision | None = None  # the shown gate's judgement of its quality interval
    violations: list[str] = dataclasses.field(default_factory=list)  # why it is infeasible, in words

    @property
    def is_reference(self) -> bool:
        return self.number == REFERENCE_RUN

    @property
    def label(self) -> str:
        return "ref" if self.is_reference else str(self.number)

    @property
    def title(self) -> str:
        return "reference (vLLM's defaults)" if self.is_reference else f"trial {self.number}"

    @property
    def measured(self) -> bool:
        return self.status == "measured" and self.summary is not None

    @property
    def category(self) -> str:
        # A duplicate reuses an earlier trial's result; a pruned trial stopped early, below an incumbent: not failures.
        if self.status in ("running", "queued", "duplicate", "pruned"):
            return self.status
        if not self.measured or self.state != "COMPLETE":
            return "failed"
        if not self.feasible:
            return "infeasible"
        return "pareto" if self.on_front else "tie" if self.tied else "dominated"

    def metric(self, name: str) -> float:
        if name in self.objective_values and math.isfinite(self.objective_values[name]):
            return self.objective_values[name]
        if not self.measured:
            return math.nan
        return metric_value(name, self.summary, self.quality, self.engine)

    def interval(self, name: str) -> tuple[float, float] | None:
        """The metric's 95% interval (None when measured without one, or not measured)."""
        return metric_interval(name, self.summary, self.quality) if self.measured else None

    @property
    def sample_sizes(self) -> str:
        """How many requests the latencies and how many probe texts the quality rest on."""
        parts = []
        if self.summary and self.summary.get("requests") is not None:
            parts.append(f"{self.summary['requests']} requests")
        if self.quality and self.quality.get("n_prompts"):
            parts.append(f"{self.quality['n_prompts']} probe texts")
        return ", ".join(parts)


@dataclasses.dataclass
class StudyView:
    name: str
    storage: str
    objectives: list[str]
    directions: list[str]
    slos: list[str]
    max_quality_loss: float | None
    trials: list[TrialView]
    reference: dict[str, Any] | None    # {"config", "summary"}
    platform: str                       # the platform the study measured on (cpu | cuda | unknown)
    decision: Any = None                # tuner.front.Decision over the study objectives (reference included)
    economics: dict[str, float] = dataclasses.field(default_factory=dict)  # gpu_hour_cost, target_rate
    quality_gate: Any = None            # quality.probe.QualityGate, shown as e.g. "kld<=0.01"
    vllm_version: str | None = None     # the vLLM the study measured with (None: a study from before it was kept)
    reference_run: TrialView | None = None  # the reference as a candidate (number REFERENCE_RUN)
    noise_floor: dict[str, Any] = dataclasses.field(default_factory=dict)  # quality.gate.floor_estimates
    floor_text: str = ""                # the floor in one line, with the probe's size ("" without one)
    heartbeat_s: float = 30.0           # how often a worker beats; silent for twice this, it is gone

    @property
    def quality_check(self) -> str:
        """The probe's self-check: lossless-by-construction trials within the floor, or too noisy."""
        from tracetune.quality.gate import self_check

        return self_check([(t.number, t.quality) for t in self.trials])

    def costs(self, summary: dict | None) -> dict[str, float]:
        """$ per 1M tokens and replicas/GPUs for the study's --gpu-hour-cost / --target-rate."""
        return economics(capacity.capacity_of(summary), **self.economics) if self.economics else {}

    def trial(self, number: int) -> TrialView:
        """A trial by number; REFERENCE_RUN: the reference's run."""
        for t in self.candidates:
            if t.number == number:
                return t
        raise InputError(f"study {self.name!r} has no trial {number}; trials: "
                         f"{[t.number for t in self.trials]}")

    @property
    def candidates(self) -> list[TrialView]:
        """The reference's run (vLLM's defaults), then every trial: what tables, Compare and Export list."""
        return ([self.reference_run] if self.reference_run is not None else []) + self.trials

    @property
    def front(self) -> list[TrialView]:
        return [t for t in self.trials if t.category == "pareto"]

    @property
    def parsed_slos(self) -> list[Any]:
        """The study's SLOs (`slos` holds them as the user wrote them) as `replay.metrics.SLO`s."""
        from tracetune.replay.metrics import parse_slos

        return [slo for spec in self.slos for slo in parse_slos(spec, flag="study SLO")]

    @property
    def running(self) -> bool:
        """A worker is measuring a trial now (its heartbeat is recent); queued trials wait for one."""
        return any(t.status == "running" for t in self.trials)

    @property
    def gate_off(self) -> bool:
        """The study was run without a quality gate (`--max-quality-loss none`)."""
        return self.quality_gate is None and self.max_quality_loss is None

    @property
    def shown_gate(self) -> Any:
        """The gate trials are judged by on the page: the study's, or (gate off) the default one,
        which then marks trials without having kept them off the front."""
        from tracetune.quality.gate import DEFAULT_GATE, parse_gate

        if self.quality_gate is not None:
            return self.quality_gate
        return parse_gate(self.max_quality_loss if self.max_quality_loss is not None else DEFAULT_GATE)

    @property
    def gate_words(self) -> str:
        """The gate as the page names it: "the quality gate ppl<=+1%" or "the default gate ppl<=+1% (not set)"."""
        return (f"the default quality gate {self.shown_gate} (this study set none)" if self.gate_off
                else f"the quality gate {self.shown_gate}")

    def reference_metric(self, name: str) -> float:
        """The reference run's value of a metric (its quality loss is 0 by definition)."""
        if not self.reference or not self.reference.get("summary"):
            return math.nan
        if name in ("quality_loss", "kld", "ppl_change"):
            return 0.0
        if name == "top1_agreement":
            return 1.0
        return metric_value(name, self.reference["summary"], None)


# -- Pareto logic --------------------------------------------------------------------------------
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
    xs, ys = [], []
    for i, (px, py) in enumerate(pts):
        if i:
            # step: keep the previous y until the next x (the front is a staircase, not a diagonal)
            xs.append(px)
            ys.append(ys[-1])
        xs.append(px)
        ys.append(py)
    return xs, ys


def _gate_of(attrs: dict[str, Any]) -> Any:
    """The study's quality gate (`quality.probe.QualityGate`): its stored spec, or the plain nats
    limit of a study made before gates had units; None without one (or one this version cannot read)."""
    from tracetune.quality.gate import parse_gate

    try:
        return parse_gate(attrs.get("quality_gate") or attrs.get("max_quality_loss"))
    except InputError:
        return None


def with_costs(study: StudyView) -> None:
    """Give every capacity result of the view its $ per 1M output tokens (study's --gpu-hour-cost),
    so cost is a metric like any other: an axis, a filter, a column."""
    if "gpu_hour_cost" not in study.economics:
        return
    for summary in _summaries(study):
        cap = capacity.capacity_of(summary)
        if cap:  # a copy: the stored result stays as measured
            summary["capacity"] = {**cap, "usd_per_1m_output_tokens": study.costs(summary)["usd_per_1m_output_tokens"]}


def has_capacity(study: StudyView) -> bool:
    """Whether any run of the study (the reference included) has a capacity measurement."""
    return any(capacity.capacity_of(s) for s in _summaries(study))


def _summaries(study: StudyView) -> list[dict | None]:
    """The stored summary of every measured run: the trials', then the reference's."""
    return [t.summary for t in study.trials if t.measured] + [(study.reference or {}).get("summary")]


def _platform_of(study_attrs: dict, rows: Iterable[dict]) -> str:
    if study_attrs.get("platform"):
        return str(study_attrs["platform"])
    for row in rows:
        m = _PLATFORM_LINE.search(row.get("log_tail") or "")
        if m:
            return {"CPU": "cpu", "GPU": "cuda"}[m.group(1)] if m.group(1) else m.group(2)
    return "unknown"


def load_study(url: str, name: str | None = None) -> StudyView:
    """Everything the dashboard shows about one study, read from its storage (never written)."""
    import optuna

    name = resolve_study(url, name)
    storage = optuna_storage(url)
    study = optuna.load_study(study_name=name, storage=storage)
    rows, reference = read_results(storage.engine, name)
    ref_config = reference["config"] if reference else {}
    attrs = study.user_attrs
    silent = silent_for(storage.engine, name)
    heartbeat_s = float(attrs.get("heartbeat_s") or 30)
    grace = 2 * heartbeat_s
    directions = [d.name.lower() for d in study.directions]
    objectives = list(attrs.get("objectives") or [f"objective_{i}" for i in range(len(directions))])
    started = _started_ages(study)
    trials = []
    for ft in study.get_trials(deepcopy=False):
        row = rows.get(ft.number, {})
        ua = ft.user_attrs
        state = ft.state.name
        status, reason = trial_status(state, ua.get("status") or row.get("status"),
                                      row.get("failure_reason") or ua.get("failure_reason"),
                                      silent_s=silent.get(ft.number), started_s=started.get(ft.number), grace_s=grace)
        # Trials without a measurement may be COMPLETE with penalty values for the sampler: never show those.
        values = dict(zip(objectives, ft.values)) if ft.values and state == "COMPLETE" and status == "measured" else {}
        config = row.get("config") or ua.get("config")
        constraints = list(ua.get("constraints") or [])
        trials.append(TrialView(
            number=ft.number, state=state, status=status, objective_values=values, constraints=constraints,
            feasible=bool(ua.get("feasible", all(c <= 0 for c in constraints))),
            params=dict(ua.get("values") or ft.params),
            config=config, diff=config_diff(config, ref_config) if config and ref_config else {},
            summary=row.get("summary"), quality=shown_quality(config, row.get("quality")), engine=row.get("engine"),
            requests_jsonl=row.get("requests_jsonl"), failure_reason=reason, not_meaningful=ua.get("not_meaningful"),
            log_tail=row.get("log_tail") or ua.get("log_tail"),
            startup_s=row.get("startup_s"), wall_s=row.get("wall_s")))
    probe = None if random_weights(ref_config) else (reference or {}).get("probe")
    floor = floor_estimates(probe)
    view = StudyView(name=name, storage=url, objectives=objectives, directions=directions,
                     slos=list(attrs.get("slos") or []), max_quality_loss=attrs.get("max_quality_loss"),
                     trials=trials,
                     reference=reference and {"config": reference["config"], "summary": reference["summary"]},
                     platform=_platform_of(attrs, rows.values()),
                     economics={k: float(attrs[k]) for k in ("gpu_hour_cost", "target_rate") if attrs.get(k)},
                     quality_gate=_gate_of(attrs), vllm_version=attrs.get("vllm_version"), noise_floor=floor,
                     floor_text=floor_text(probe, floor), heartbeat_s=heartbeat_s)
    view.reference_run = _reference_run(view, rows.get(REFERENCE_RUN), ref_config)
    with_costs(view)
    explain(view, {t.number for t in trials_beyond_only_the_gate(study)}
            | judged.undecided_by_the_gate(view.trials, view.quality_gate))
    mark_front(view)
    return view


def _age_text(seconds: float) -> str:
    if seconds < 3600:
        return f"{seconds:.0f} s"
    return f"{seconds / 3600:.1f} h" if seconds < 2 * 86400 else f"{seconds / 86400:.1f} days"


def trial_status(state: str, stored: str | None, reason: str | None, *, silent_s: float | None,
                 started_s: float | None, grace_s: float) -> tuple[str, str | None]:
    """A trial's status and reason as the page shows them. RUNNING is running only while its worker
    beats (Optuna's heartbeat, or, without one, since it started) within `grace_s`; otherwise its
    worker is gone and the trial interrupted. WAITING is queued: no worker measures it until the
    study runs again."""
    if state == "RUNNING":
        if silent_s is not None and silent_s > grace_s:
            return "interrupted", (f"interrupted: its worker stopped sending heartbeats {_age_text(silent_s)} ago "
                                   f"(stopped or crashed); resuming the study runs it again")
        if silent_s is None and started_s is not None and started_s > grace_s:
            return "interrupted", (f"interrupted: started {_age_text(started_s)} ago and no heartbeat from its worker "
                                   f"since (stopped or crashed); resuming the study runs it again")
        return "running", reason
    if state == "WAITING":
        return "queued", ("queued: waits for a worker (re-queued after an interruption, or enqueued); the study's "
                          "next run measures it")
    if stored is None:
        return "interrupted", reason or "interrupted: the tuner stopped during this trial (it is run again on resume)"
    return stored, reason


def _started_ages(study: Any) -> dict[int, float]:
    """Seconds since each RUNNING trial started (Optuna stores this host's local time)."""
    import datetime as dt

    now = dt.datetime.now()
    return {ft.number: (now - ft.datetime_start.replace(tzinfo=None)).total_seconds()
            for ft in study.get_trials(deepcopy=False) if ft.state.name == "RUNNING" and ft.datetime_start}


def explain(study: StudyView, only_gate: set[int]) -> None:
    """Say why each measured trial is off the front for a constraint (`metrics.violations`), and mark
    the trials whose quality breaks the gate shown (the study's, or the default one when it set none)."""
    from tracetune.dashboard.metrics import violations

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
            t.only_the_gate = t.number in only_gate and not (t.summary or {}).get("error_rate")


def _reference_run(study: StudyView, row: dict[str, Any] | None, config: dict[str, Any]) -> TrialView | None:
    """The reference as a candidate: its stored run (a study from before the run was stored: the
    reference's config and summary alone), with its objective values as the tuner counts them."""
    if not study.reference or not study.reference.get("summary"):
        return None
    row = row or {}
    summary = row.get("summary") or study.reference["summary"]
    values = {o: study.reference_metric(o) for o in study.objectives if o in METRICS}
    return TrialView(number=REFERENCE_RUN, state="COMPLETE", status="measured", objective_values=values,
                     constraints=[], feasible=True, params={}, config=row.get("config") or config, diff={},
                     summary=summary, quality=shown_quality(config, row.get("quality")), engine=row.get("engine"),
                     requests_jsonl=row.get("requests_jsonl"), log_tail=row.get("log_tail"),
                     startup_s=row.get("startup_s"), wall_s=row.get("wall_s"))


def reference_values(study: StudyView) -> tuple[float, ...] | None:
    """The reference's values of the study objectives, as the tuner counts them (None: no reference yet)."""
    if not study.reference or not study.reference.get("summary"):
        return None
    values = tuple(study.reference_metric(o) if o in METRICS else math.nan for o in study.objectives)
    return None if all(math.isnan(v) for v in values) else values


def mark_front(study: StudyView) -> None:
    """Set `on_front` for the feasible measured trials on the study's Pareto front, with vLLM's
    defaults (the reference) competing like a trial: `tuner.front.decide`, the tuner's own rule."""
    candidates = [t for t in study.trials if t.measured and t.state == "COMPLETE" and t.feasible]
    for t in study.trials:
        t.on_front = t.beaten_by_reference = False
    if not study.directions:
        return
    points = [Candidate(t.number, tuple(t.objective_values.get(o, math.nan) for o in study.objectives))
              for t in candidates]
    ref = reference_values(study)
    ref_ok = reference_feasible((study.reference or {}).get("summary"), study.parsed_slos)
    beyond = [BeyondGate(Candidate(t.number, tuple(t.objective_values.get(o, math.nan) for o in study.objectives)),
                         str(study.quality_gate), cost_text(t.quality)) for t in study.trials if t.only_the_gate]
    study.decision = decide(points, None if ref is None else Candidate(REFERENCE, ref), study.objectives,
                            study.directions, reference_feasible=ref_ok, beyond_gate=beyond,
                            outside_constraints=sum(t.category == "infeasible" for t in study.trials),
                            reference_breach=judged.breach(study.reference, study.parsed_slos, ref_ok))
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
