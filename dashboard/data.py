"""Reading a study for the dashboard and exports: `load_study` reads it (through `dashboard.storage`,
never writing) into a `StudyView` (`dashboard.study_view`) of `TrialView`s (`dashboard.trial`), each
run's stored records read back as their types, the reference's run among them as a candidate, then
marks where each trial stands (`dashboard.standing`). Plain functions, no Streamlit, so every page's
numbers are tested without a browser. Metrics: `dashboard.metrics`; tables: `dashboard.tables`;
thresholds and bands: `dashboard.charts`; request records: `dashboard.records`; search progress:
`dashboard.progress`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import TYPE_CHECKING

from tracetune.dashboard import judged
from tracetune.dashboard.capacity import capacity_of

# What the pages and exports import from here: the views and where their trials stand.
from tracetune.dashboard.metrics import METRICS
from tracetune.dashboard.standing import (  # noqa: F401
    MIN_HALF_WIDTH,
    apart,
    clearly_dominates,
    explain,
    front_line,
    front_on,
    interval_of,
    mark_front,
    pareto_mask,
    reference_values,
)
from tracetune.dashboard.storage import optuna_storage, read_results, resolve_study, silent_for
from tracetune.dashboard.study_view import StudyView
from tracetune.dashboard.trial import (  # noqa: F401
    CATEGORIES,
    TrialView,
    config_diff,
    diff_text,
    trial_status,
    worker_note,
)
from tracetune.errors import InputError
from tracetune.quality.gate import QualityGate, floor_estimates, floor_text, random_weights, shown_quality
from tracetune.replay.metrics import Summary
from tracetune.stored import Stored
from tracetune.tuner.front import dominates, trials_beyond_only_the_gate  # noqa: F401
from tracetune.tuner.storage import REFERENCE_RUN, StoredRun
from tracetune.tuner.trial_record import StudyAttr, TrialRecord
from tracetune.types import JsonDict

if TYPE_CHECKING:
    import optuna

# How an engine log shows its platform, for studies made before the study kept it: vLLM's KV-cache lines
# ("CPU KV cache size", "GPU KV cache usage") and its start-up line "detected platform cpu".
_PLATFORM_LINE = re.compile(r"\b(CPU|GPU) KV cache (?:size|usage)|detected platform (cpu|cuda)\b")


def _gate_of(attrs: Stored) -> QualityGate | None:
    """The study's quality gate (`quality.probe.QualityGate`): its stored spec, or the plain nats
    limit of a study made before gates had units; None without one (or one this version cannot read)."""
    from tracetune.quality.gate import parse_gate

    try:
        spec = attrs.get(StudyAttr.QUALITY_GATE) or attrs.get(StudyAttr.MAX_QUALITY_LOSS)
        return parse_gate(spec if isinstance(spec, str | float) else None)
    except InputError:
        return None


def with_costs(study: StudyView) -> None:
    """Give every capacity result of the view its $ per 1M output tokens (study's --gpu-hour-cost),
    so cost is a metric like any other: an axis, a filter, a column."""
    if "gpu_hour_cost" not in study.economics:
        return
    for summary in _summaries(study):
        if summary.capacity is not None and capacity_of(summary):  # a copy: the stored result stays as measured
            summary.capacity = {**summary.capacity,
                                "usd_per_1m_output_tokens": study.costs(summary)["usd_per_1m_output_tokens"]}


def has_capacity(study: StudyView) -> bool:
    """Whether any run of the study (the reference included) has a capacity measurement."""
    return any(capacity_of(s) for s in _summaries(study))


def _summaries(study: StudyView) -> list[Summary]:
    """The summary of every measured run: the trials', then the reference's."""
    summaries = [t.summary for t in study.trials if t.measured and t.summary is not None]
    return summaries + ([study.reference_summary] if study.reference_summary is not None else [])


def _platform_of(study_attrs: Stored, rows: Iterable[StoredRun]) -> str:
    if study_attrs.get(StudyAttr.PLATFORM):
        return str(study_attrs[StudyAttr.PLATFORM])
    for row in rows:
        m = _PLATFORM_LINE.search(row.log_tail or "")
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
    engine_name = (attrs.get(StudyAttr.RULES) or {}).get("engine")  # the study's engine reads its configs' differences
    silent = silent_for(storage.engine, name)
    heartbeat_s = float(attrs.get(StudyAttr.HEARTBEAT_S) or 30)
    grace = 2 * heartbeat_s
    directions = [d.name.lower() for d in study.directions]
    objectives = list(attrs.get(StudyAttr.OBJECTIVES) or [f"objective_{i}" for i in range(len(directions))])
    started = _started_ages(study)
    trials = []
    for ft in study.get_trials(deepcopy=False):
        row = rows.get(ft.number) or StoredRun(ft.number, "")
        ua = TrialRecord.of(ft)
        state = ft.state.name
        # A queued trial has no worker: a re-queued one still carries the attributes of the one that died.
        worker = "" if state == "WAITING" else ua.worker_name or ""
        status, reason = trial_status(state, ua.status or row.status or None,
                                      row.failure_reason or ua.failure_reason, silent_s=silent.get(ft.number),
                                      started_s=started.get(ft.number), grace_s=grace, worker=worker)
        # Trials without a measurement may be COMPLETE with penalty values for the sampler: never show those.
        values = dict(zip(objectives, ft.values)) if ft.values and state == "COMPLETE" and status == "measured" else {}
        config = row.config or ua.config
        constraints = list(ua.constraints or [])
        trials.append(TrialView(
            number=ft.number, state=state, status=status, objective_values=values, constraints=constraints,
            feasible=ua.feasible if ua.feasible is not None else all(c <= 0 for c in constraints),
            params=dict(ua.values or ft.params),
            config=config, diff=config_diff(config, ref_config, engine_name) if config and ref_config else {},
            summary=row.summary, quality=shown_quality(config, row.quality), engine=row.engine,
            requests_jsonl=row.requests_jsonl, failure_reason=reason, not_meaningful=ua.not_meaningful,
            defaults_of=ua.defaults_of,
            log_tail=row.log_tail or ua.log_tail, startup_s=row.startup_s, wall_s=row.wall_s, worker=worker,
            heartbeat_age_s=silent.get(ft.number)))
    probe = None if random_weights(ref_config) else (reference.get("probe") if reference else None)
    floor = floor_estimates(probe)
    view = StudyView(name=name, storage=url, objectives=objectives, directions=directions,
                     slos=list(attrs.get(StudyAttr.SLOS) or []), max_quality_loss=attrs.get(StudyAttr.MAX_QUALITY_LOSS),
                     trials=trials,
                     reference=reference and {"config": reference["config"], "summary": reference["summary"]},
                     platform=_platform_of(attrs, rows.values()),
                     economics={k: float(attrs[k]) for k in ("gpu_hour_cost", "target_rate") if attrs.get(k)},
                     quality_gate=_gate_of(attrs), vllm_version=attrs.get(StudyAttr.VLLM_VERSION), engine=engine_name,
                     noise_floor=floor,
                     floor_text=floor_text(probe, floor), heartbeat_s=heartbeat_s,
                     reference_summary=Summary.from_dict(reference["summary"]) if reference and reference["summary"]
                     else None)
    view.reference_run = _reference_run(view, rows.get(REFERENCE_RUN), ref_config)
    with_costs(view)
    explain(view, {t.number for t in trials_beyond_only_the_gate(study)}
            | judged.undecided_by_the_gate(view.trials, view.quality_gate))
    mark_front(view)
    return view


def _started_ages(study: optuna.Study) -> dict[int, float]:
    """Seconds since each RUNNING trial started (Optuna stores this host's local time)."""
    import datetime as dt

    now = dt.datetime.now()
    return {ft.number: (now - ft.datetime_start.replace(tzinfo=None)).total_seconds()
            for ft in study.get_trials(deepcopy=False) if ft.state.name == "RUNNING" and ft.datetime_start}


def _reference_run(study: StudyView, row: StoredRun | None, config: JsonDict) -> TrialView | None:
    """The reference as a candidate: its stored run (a study from before the run was stored: the
    reference's config and summary alone), with its objective values as the tuner counts them."""
    summary = (row.summary if row else None) or study.reference_summary
    if study.reference_summary is None or summary is None:
        return None
    row = row or StoredRun(REFERENCE_RUN, "")
    values = {o: study.reference_metric(o) for o in study.objectives if o in METRICS}
    return TrialView(number=REFERENCE_RUN, state="COMPLETE", status="measured", objective_values=values,
                     constraints=[], feasible=True, params={}, config=row.config or config, diff={},
                     summary=summary, quality=shown_quality(config, row.quality), engine=row.engine,
                     requests_jsonl=row.requests_jsonl, log_tail=row.log_tail,
                     startup_s=row.startup_s, wall_s=row.wall_s)
