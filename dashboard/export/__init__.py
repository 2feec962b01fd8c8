"""Exports of a measured configuration to something a cluster runs.

Formats (one table, `dashboard.export_formats`, that the command line and the dashboard read):
`command` (one shell command, `shell`), `compose` (a docker compose service, `compose`),
`k8s` (Deployment + Service, `kubernetes`), `helm-values` (values for a generic deployment chart,
`helm`), `json` (everything, for tools, `document`). The trial is chosen in `pick`; the server each
format runs (the engine's command line, image and release) is `serve`; the comments are `notes`;
the deployment's shape is `options`; safe text (comments, `$`, YAML) is `text`.

The engine that ran the trial (the study's, or in a study choosing between engines the one the
trial ran on, `EngineKind.of`) supplies the flags (`EngineKind.command`, for the platform its image
runs on; what only a CPU measurement needed is left out for a GPU image, saying so), the image and
its default release (`EngineKind.image`, `image_version`) and how a deployment runs its server
(`EngineKind.deployment`); an engine without them is refused. Deployment formats run that image:
vLLM as `vllm serve MODEL ARGS...` on GPUs, llama.cpp as `/app/llama-server ARGS...` on the CPU, the
model (a directory, or a GGUF file) mounted read-only under `/models/<name>`; comments say how to
place a model made on the measuring machine and how to make a GGUF file again (docs/export.md).

Safety: commands are lists (exec form) or `shlex`-quoted; YAML and JSON are written by their libraries
(any model path round-trips exactly); `$` is doubled where compose or Kubernetes would expand it;
comments lose control characters. Credential-like settings (names like key/token/secret/password,
values shaped like API tokens) are dropped, their names listed, never their values.
"""

from __future__ import annotations

import dataclasses

from tracetune.dashboard.data import StudyView, TrialView
from tracetune.dashboard.export.notes import is_dummy, label
from tracetune.dashboard.export.options import DEFAULT_PORT, ExportOptions, k8s_name
from tracetune.dashboard.export.serve import exported_engine, image_of
from tracetune.dashboard.export.text import comment_safe
from tracetune.dashboard.export_formats import FORMATS, export_format
from tracetune.errors import InputError

__all__ = ["DEFAULT_PORT", "FORMATS", "ExportOptions", "comment_safe", "export",
           "image_of", "k8s_name"]



def export(study: StudyView, trial: TrialView, fmt: str, options: ExportOptions | None = None) -> str:
    """`trial`'s configuration in format `fmt` (one of FORMATS, or an earlier name of one)."""
    writer = export_format(fmt)
    if trial.config is None:
        raise InputError(f"{label(trial, study)} has no stored config ({trial.status}); nothing to export")
    options = options or ExportOptions()
    # the engine that ran the trial; refuses one tracetune cannot deploy, before anything else
    engine = exported_engine(study, options, trial.config)
    options = dataclasses.replace(options, image=image_of(study, options, trial.config),
                                  gpus=options.gpus if engine.deployment.platform == "cuda" else 0)
    if is_dummy(trial) and not options.allow_dummy_weights:
        raise InputError(f"{label(trial, study)} was measured with random weights (load_format dummy): deployed as "
                         f"it is, the server would answer with noise. Its speed holds for real weights of the same "
                         f"shape: deploy those; --allow-dummy-weights exports it anyway (a test deployment)")
    return writer.write(study, trial, options)
