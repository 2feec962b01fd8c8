"""The `command` format: one shell command (environment assignments, then the engine's server program:
`vllm serve`, `llama-server`), each value `shlex`-quoted, a flag per line."""

from __future__ import annotations

import shlex

from tracetune.dashboard.data import StudyView, TrialView
from tracetune.dashboard.export.notes import header
from tracetune.dashboard.export.options import ExportOptions
from tracetune.dashboard.export.serve import exported_engine, serve_spec


def to_command(study: StudyView, trial: TrialView, options: ExportOptions) -> str:
    """One shell command (environment assignments, then the server's program), a flag per line."""
    spec = serve_spec(trial.config or {}, options, container=False, measured_on=study.platform,
                      engine=exported_engine(study, options, trial.config))
    assert spec.deployment is not None
    lines = [" ".join(f"{k}={shlex.quote(v)}" for k, v in spec.env.items()), shlex.join(spec.deployment.program)]
    for arg in spec.args:
        if arg.startswith("--"):
            lines.append(shlex.quote(arg))
        else:
            lines[-1] += " " + shlex.quote(arg)
    command = " \\\n  ".join(line for line in lines if line)
    return "\n".join([*header(study, trial, "command", options, spec), command]) + "\n"
