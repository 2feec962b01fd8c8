"""The `json` format: everything about the export for tools (the trial, its measurements, the
config without credentials, the server's argv and environment, the notes)."""

from __future__ import annotations

import json
import math

from tracetune.dashboard import capacity
from tracetune.dashboard.data import StudyView, TrialView
from tracetune.dashboard.export.notes import choice_notes, placing_lines, platform_lines
from tracetune.dashboard.export.options import ExportOptions
from tracetune.dashboard.export.serve import Exported, exported_engine, release, serve_spec
from tracetune.tuner.secrets import is_secret, strip_secret_args


def to_json(study: StudyView, trial: TrialView, options: ExportOptions) -> str:
    """The export as one JSON document (`tracetune_export: 1`)."""
    engine = exported_engine(study, options, trial.config)
    spec = serve_spec(trial.config or {}, options, container=False, measured_on=study.platform, engine=engine)
    config = json.loads(json.dumps(trial.config))
    config["extra_args"] = strip_secret_args(list(config.get("extra_args") or []), [])
    config["env"] = {k: v for k, v in (config.get("env") or {}).items() if not is_secret(k, v)}
    doc: dict[str, object] = {
        "tracetune_export": 1,
        "study": study.name, "trial": "reference" if trial.is_reference else trial.number,
        "measured_platform": study.platform, **_releases(study, options, engine),
        "note": " ".join(platform_lines(study, options, engine)),
        "chosen_under": {"slos": study.slos, "quality_gate": str(study.quality_gate) if study.quality_gate else None},
        "quality": trial.quality,
        "objectives": {o: None if math.isnan(v := trial.metric(o)) else v for o in study.objectives},
        "feasible": trial.feasible,
        "differs_from_reference": trial.diff,
        "config": config,
        "serve": {"argv": [*engine.deployment.program, *spec.args], "env": spec.env},
        "left_out": spec.dropped,
        "left_out_for_gpu": spec.platform_only,
        "notes": choice_notes(study, trial, options.chosen_by) + placing_lines(spec, "json", options),
    }
    if trial.summary is not None and capacity.capacity_of(trial.summary):
        doc["capacity"] = trial.summary.capacity  # as stored, with its cost (`dashboard.data.with_costs`)
    return json.dumps(doc, indent=2, default=str) + "\n"


def _releases(study: StudyView, options: ExportOptions, engine: Exported) -> dict[str, object]:
    """The release measured and the one deployed: `measured_vllm`/`target_vllm` for an engine whose
    release the study records (vLLM), else the engine's name, its image and `target_release`."""
    if engine.deployment.records_version:
        return {"measured_vllm": study.vllm_version, "target_vllm": release(study, options, engine)}
    return {"engine": engine.kind.name, "image": options.image, "target_release": release(study, options, engine)}
