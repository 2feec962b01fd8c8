"""The `helm-values` format: values for a generic single-container Deployment chart (`helm create`'s
layout), the same container, volumes and placement as the `k8s` format."""

from __future__ import annotations

from tracetune.dashboard.data import StudyView, TrialView
from tracetune.dashboard.export.kubernetes import Manifest, container, placement, volumes
from tracetune.dashboard.export.notes import header, trial_id
from tracetune.dashboard.export.options import ExportOptions, deployment_name
from tracetune.dashboard.export.serve import ServeSpec, exported_engine, serve_spec
from tracetune.dashboard.export.text import yaml_text


def image_parts(image: str) -> tuple[str, str]:
    """(repository, tag) of an image reference; "latest" when it names none (a registry port is no tag)."""
    repository, _, tag = image.rpartition(":")
    if "/" in tag or not repository:  # a registry port, not a tag
        return image, "latest"
    return repository, tag


def helm_values(study: StudyView, trial: TrialView, options: ExportOptions) -> tuple[Manifest, ServeSpec]:
    """The chart's values, and the server they run."""
    spec = serve_spec(trial.config or {}, options, container=True, measured_on=study.platform,
                      engine=exported_engine(study, options, trial.config))
    repository, tag = image_parts(options.image or "")
    server = container(spec, options)
    values = {
        "nameOverride": deployment_name(study, trial, options),
        "replicaCount": options.replicas,
        "image": {"repository": repository, "tag": tag, "pullPolicy": "IfNotPresent"},
        **{k: server[k] for k in ("command", "args", "env")},
        "containerPort": options.port,
        "service": {"type": "ClusterIP", "port": options.port},
        **{k: server[k] for k in ("resources", "startupProbe", "readinessProbe", "livenessProbe")},
        "volumes": volumes(options, spec),
        "volumeMounts": server["volumeMounts"],
        **placement(options),
        "podAnnotations": {"tracetune.io/study": study.name, "tracetune.io/trial": trial_id(trial),
                           "tracetune.io/measured-platform": study.platform},
    }
    return values, spec


def to_helm_values(study: StudyView, trial: TrialView, options: ExportOptions) -> str:
    """The values as YAML, the comments first."""
    values, spec = helm_values(study, trial, options)
    note = ["# values for a generic single-container Deployment chart (e.g. `helm create`'s layout): "
            "image, args, env, resources, probes, volumes; args/env are ready for Kubernetes ($ doubled)"]
    return "\n".join(header(study, trial, "helm-values", options, spec) + note) + "\n" + yaml_text([values])
