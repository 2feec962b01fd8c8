"""The study's answer as documents: `pareto` (pareto.json: every candidate on the front, the engine's
defaults among them, and the verdict) and `best` (best.json: the front's best by the study's deciding
objective). `tune --trace` writes both when a study ends; `tune export --format pareto|best` writes
them again from any study's storage. Both read the one `StudyView` the dashboard and the console read:
its decision, its runs, its economics."""

from __future__ import annotations

import json

from tracetune.dashboard.data import StudyView, TrialView
from tracetune.dashboard.export.options import ExportOptions
from tracetune.errors import InputError
from tracetune.stored import Stored, mapping
from tracetune.tuner.front import REFERENCE, Label, economics
from tracetune.types import JsonDict


def to_pareto(study: StudyView, trial: TrialView | None = None, options: ExportOptions | None = None) -> str:
    """pareto.json: the study, its objectives, a row per candidate on the front and the verdict."""
    decision = study.decision
    return _dumps({"study": study.name, "objectives": study.objectives, "trials": front_rows(study),
                   "verdict": decision.verdict() if decision is not None else ""})


def to_best(study: StudyView, trial: TrialView | None = None, options: ExportOptions | None = None) -> str:
    """best.json: the front's best (`Decision.best`) as its row, with the verdict and the objective
    that decided; an InputError when nothing measured is feasible yet."""
    decision = study.decision
    if decision is None or decision.best is None:
        raise InputError(f"study {study.name!r} has no feasible measured trial yet: nothing on the front, "
                         "no best to write")
    row = _row(study, decision.best.label, dict(zip(study.objectives, decision.best.values)))
    return _dumps({**row, "verdict": decision.verdict(), "by": decision.by,
                   "reference_is_best": decision.reference_is_best})


def front_rows(study: StudyView) -> list[JsonDict]:
    """One row per candidate on the front, in the decision's order: its label, objective values,
    config, what differs from the reference, summary, quality, capacity and economics; another
    engine's own defaults say so (`shown`)."""
    decision = study.decision
    if decision is None:
        return []
    return [_row(study, c.label, dict(zip(study.objectives, c.values))) for c in decision.front]


def defaults_label(study: StudyView, t: TrialView) -> str | None:
    """"llama.cpp defaults" for a trial measuring another engine's own defaults; None otherwise."""
    if t.defaults_of is None:
        return None
    from tracetune.engine_adapter.registry import engine_kind

    return f"{engine_kind(t.defaults_of).shown} defaults"


def _row(study: StudyView, label: Label, values: dict[str, float]) -> JsonDict:
    quality: Stored = {}
    diff: JsonDict = {}
    shown = None
    if label == REFERENCE:
        stored = study.reference or {}
        config, summary = stored.get("config") or {}, mapping(stored.get("summary"))
    else:
        t = study.trial(int(label))
        config, summary, quality = t.config or {}, t.summary.as_dict() if t.summary else {}, t.quality or {}
        diff, shown = _shown_diff(t), defaults_label(study, t)
    capacity = mapping(summary.get("capacity")) or None
    row: JsonDict = {"trial": label, "values": values, "config": config, "differs_from_reference": diff,
                     "summary": summary, "quality": quality, "capacity": capacity,
                     "economics": economics(capacity, gpu_hour_cost=study.economics.get("gpu_hour_cost"),
                                            target_rate=study.economics.get("target_rate"))}
    if shown:
        row["shown"] = f"{label} ({shown})"
    return row


def _shown_diff(t: TrialView) -> JsonDict:
    """What a trial changes from the reference, by the search-space value where that says more than
    the config: the weight bits that made a quantized checkpoint, the derived draft model's name."""
    diff = dict(t.diff)
    if "model" in diff and "weight_bits" in t.params:
        diff = {"weight_bits": t.params["weight_bits"], **{k: v for k, v in diff.items() if k != "model"}}
    if "draft_model" in diff and "draft_model" in t.params:
        diff["draft_model"] = t.params["draft_model"]
    return diff


def _dumps(doc: JsonDict) -> str:
    return json.dumps(doc, indent=2, default=str)
