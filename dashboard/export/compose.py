"""The `compose` format: one docker compose service running the engine's image (on the GPUs for a
GPU image), the model directories or files bind-mounted read-only, `$` doubled where compose would
expand it."""

from __future__ import annotations

from tracetune.dashboard.data import StudyView, TrialView
from tracetune.dashboard.export.notes import header
from tracetune.dashboard.export.options import ExportOptions, deployment_name
from tracetune.dashboard.export.serve import exported_engine, serve_spec
from tracetune.dashboard.export.text import dollars, yaml_text


def to_compose(study: StudyView, trial: TrialView, options: ExportOptions) -> str:
    """A compose file with one service for `trial`."""
    spec = serve_spec(trial.config or {}, options, container=True, measured_on=study.platform,
                      engine=exported_engine(study, options, trial.config))
    name = deployment_name(study, trial, options)
    deployment = spec.deployment
    assert deployment is not None
    service: dict[str, object] = {
        "image": options.image,
        "entrypoint": list(deployment.entrypoint),
        "command": [dollars(a) for a in spec.args],
        "environment": {k: dollars(v) for k, v in spec.env.items()},
        "ports": [f"{options.port}:{options.port}"],
        "volumes": [{"type": "bind", "source": dollars(h), "target": t, "read_only": True}
                    for h, t in spec.mounts.items()],
        **({"ipc": "host"} if deployment.shared_memory else {}),  # workers share tensors through /dev/shm
        "healthcheck": {"test": [part.replace("{port}", str(options.port)) for part in deployment.health],
                        "interval": "10s", "timeout": "5s", "retries": 3, "start_period": "900s"},
        "restart": "unless-stopped",
    }
    if options.gpus:
        service["deploy"] = {"resources": {"reservations": {"devices": [
            {"driver": "nvidia", "count": options.gpus, "capabilities": ["gpu"]}]}}}
    doc = {"services": {name: service}}
    return "\n".join(header(study, trial, "compose", options, spec)) + "\n" + yaml_text([doc])
