"""Every export format, one record each, in the one table its readers take their choices from:
`tune export --format`, the dashboard's export page, `export.export` and the files `tune --trace`
writes when a study ends. A new format is a module of dashboard/export/ with one writer, (study,
trial, options) -> text, and one line here. A trial's formats export one configuration; a study's
(`scope="study"`: pareto.json, best.json) write the study's answer and take no trial.

It imports nothing heavy: `tune --help` lists the formats from it, and a format's writer is
imported only when it writes."""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable
from typing import TYPE_CHECKING, cast

from tracetune.errors import InputError

if TYPE_CHECKING:
    from tracetune.dashboard.export.options import ExportOptions
    from tracetune.dashboard.study_view import StudyView
    from tracetune.dashboard.trial import TrialView

Writer = Callable[["StudyView", "TrialView | None", "ExportOptions"], str]


@dataclasses.dataclass(frozen=True)
class ExportFormat:
    """One format: its name, the file `tune export -o FOLDER` and the dashboard's download write, its
    writer ("module:function" under dashboard/export/), the language the dashboard shows it in, its
    earlier names, still accepted, and what it exports: one trial's configuration, or the study."""

    name: str
    file_name: str
    writer: str
    language: str
    aliases: tuple[str, ...] = ()
    scope: str = "trial"  # "trial" | "study"

    def write(self, study: StudyView, trial: TrialView | None, options: ExportOptions) -> str:
        module, function = self.writer.split(":")
        found = getattr(importlib.import_module(f"tracetune.dashboard.export.{module}"), function)
        return cast(Writer, found)(study, trial, options)


EXPORT_FORMATS = (
    ExportFormat("command", "serve.sh", "shell:to_command", "bash", aliases=("vllm-cmd",)),
    ExportFormat("compose", "compose.yaml", "compose:to_compose", "yaml"),
    ExportFormat("k8s", "deployment.yaml", "kubernetes:to_k8s", "yaml"),
    ExportFormat("helm-values", "values.yaml", "helm:to_helm_values", "yaml"),
    ExportFormat("json", "trial.json", "document:to_json", "json"),
    ExportFormat("pareto", "pareto.json", "front:to_pareto", "json", scope="study"),
    ExportFormat("best", "best.json", "front:to_best", "json", scope="study"),
)
FORMATS = tuple(f.name for f in EXPORT_FORMATS if f.scope == "trial")  # a configuration's: the dashboard offers these
STUDY_FORMATS = tuple(f.name for f in EXPORT_FORMATS if f.scope == "study")
FORMAT_ALIASES = {alias: f.name for f in EXPORT_FORMATS for alias in f.aliases}


def canonical(name: str) -> str:
    """A format's name for `name`, which may be an earlier name of it."""
    return FORMAT_ALIASES.get(name, name)


def export_format(name: str) -> ExportFormat:
    """The format named `name` (or an earlier name of it); an InputError naming the choices otherwise."""
    wanted = canonical(name)
    for fmt in EXPORT_FORMATS:
        if fmt.name == wanted:
            return fmt
    raise InputError(f"--format {name!r} is not one of {', '.join((*FORMATS, *STUDY_FORMATS))}")
