"""Exports of a measured configuration to something a cluster runs (the trial is chosen in `dashboard.pick`).

Formats: `vllm-cmd` (one shell command), `compose` (a docker compose service), `k8s` (Deployment +
Service), `helm-values` (values for a generic deployment chart), `json` (everything, for tools).

The vLLM flags come from the engine's command builder (`EngineKind.command`, through
`engine_adapter.registry`) for the CUDA platform (the flag mapping lives in the engine adapter
only). Deployment formats run the `vllm/vllm-openai` image as
`vllm serve MODEL ARGS...` on GPUs (`nvidia.com/gpu`), with the model directory mounted read-only
under `/models/<directory name>`.

Safety: commands are lists (exec form) or `shlex`-quoted; YAML and JSON are written by their
libraries, so a model path with spaces, quotes, `;`, `$` or newlines round-trips exactly; `$` is
doubled where compose or Kubernetes would expand it; comment text has control characters removed
(a newline in a study name cannot end a comment). Nothing that looks like a credential is exported:
environment variables and flags named like a key/token/secret/password, and values shaped like API
tokens, are dropped (their names are listed in the output, never their values).
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
import shlex
from pathlib import PurePosixPath
from typing import Any

from tracetune.dashboard import capacity
from tracetune.dashboard.data import StudyView, TrialView
from tracetune.dashboard.metrics import display_value
from tracetune.errors import InputError
from tracetune.tuner.secrets import is_secret, strip_secret_args

FORMATS = ("vllm-cmd", "compose", "k8s", "helm-values", "json")
DEFAULT_PORT = 8000
CONTAINER_MODELS_DIR = "/models"
# tracetune's own measurement settings that a deployment must not inherit: the dev-mode endpoints
# (POST /reset_prefix_cache, ...) and workarounds for the measuring machine's installation.
_MEASUREMENT_ONLY_ENV = {"VLLM_SERVER_DEV_MODE", "VLLM_USE_FLASHINFER_SAMPLER", "LD_PRELOAD"}


def gpu_vllm_version(study: StudyView, options: ExportOptions) -> str:
    """The vLLM release the export will run: --vllm-version, else the one a GPU study measured
    with, else the GPU release tracetune runs (a study measured on CPU ran the CPU build, whose
    version says nothing about the GPU image)."""
    from tracetune.engine_adapter.platform import GPU_VLLM_VERSION

    if options.vllm_version:
        return options.vllm_version.lstrip("v")
    if study.platform == "cuda" and study.vllm_version:
        return study.vllm_version
    return GPU_VLLM_VERSION


def image_of(study: StudyView, options: ExportOptions) -> str:
    """--image, else `vllm/vllm-openai` at `gpu_vllm_version`."""
    return options.image or f"vllm/vllm-openai:v{gpu_vllm_version(study, options)}"


@dataclasses.dataclass
class ExportOptions:
    """Deployment defaults, each overridable from `tune export` flags and the dashboard."""

    image: str | None = None          # default: image_of() (export() sets it)
    vllm_version: str | None = None   # the GPU vLLM release the deployment runs (sets the image tag)
    allow_dummy_weights: bool = False  # export a config measured with random weights (load_format dummy)
    port: int = DEFAULT_PORT
    host: str | None = None           # listen address: 0.0.0.0 in containers, 127.0.0.1 for vllm-cmd
    gpus: int = 1
    name: str | None = None           # Kubernetes/compose name; default tracetune-STUDY-tN
    namespace: str | None = None
    models_pvc: str = "models"        # k8s/helm: PersistentVolumeClaim holding the model directories
    replicas: int = 1

    def __post_init__(self) -> None:
        if not 0 < self.port < 65536:
            raise InputError(f"--port must be between 1 and 65535, got {self.port}")
        if self.gpus < 0:
            raise InputError(f"--gpus must be >= 0, got {self.gpus}")
        if self.replicas < 1:
            raise InputError(f"--replicas must be >= 1, got {self.replicas}")
        if self.name is not None and not _DNS_LABEL.match(self.name):
            raise InputError(f"--name {self.name!r} must be a DNS-1123 label (lowercase letters, digits and '-', "
                             f"starting and ending with a letter or digit, at most 63 characters)")
        if self.namespace is not None and not _DNS_LABEL.match(self.namespace):
            raise InputError(f"--namespace {self.namespace!r} must be a DNS-1123 label")
        if not _DNS_LABEL.match(self.models_pvc):
            raise InputError(f"--models-pvc {self.models_pvc!r} must be a DNS-1123 name")


_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")


def k8s_name(text: str) -> str:
    """A DNS-1123 label made from any text (lowercase, [a-z0-9-], at most 63 characters)."""
    name = re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-")
    name = re.sub(r"-{2,}", "-", name)[:63].strip("-")
    return name or "tracetune"


def comment_safe(text: Any) -> str:
    """Text that stays inside one `#` comment line (control characters, newlines included, removed)."""
    return re.sub(r"[\x00-\x1f\x7f\u2028\u2029\x85]+", " ", str(text))


# -- the server command --------------------------------------------------------------------------
# The registered engine every format runs (`vllm serve`, the vllm/vllm-openai image).
EXPORTED_ENGINE = "vllm"


@dataclasses.dataclass
class ServeSpec:
    """`vllm serve` for one trial: argv after `vllm serve`, environment, and host paths to mount."""

    args: list[str]
    env: dict[str, str]
    mounts: dict[str, str]            # host path -> container path
    dropped: list[str]                # names of secret-looking settings left out


def serve_spec(config: dict[str, Any], options: ExportOptions, *, container: bool) -> ServeSpec:
    """The vLLM server for `config` on CUDA, as `vllm serve` arguments.

    In a container the model (and a draft model) are mounted at /models/<directory name>; the
    served model name stays the directory name measured, so clients need no change.
    """
    from tracetune.engine_adapter.platform import Platform
    from tracetune.engine_adapter.registry import engine_kind

    kind = engine_kind(EXPORTED_ENGINE)
    dropped: list[str] = []
    data = json.loads(json.dumps(config))
    data["extra_args"] = strip_secret_args(list(data.get("extra_args") or []), dropped)
    env_in = dict(data.get("env") or {})
    data["env"] = {}
    cfg = kind.config_model.model_validate(data)
    mounts: dict[str, str] = {}
    if container:
        def mount(host: str) -> str:
            target = str(PurePosixPath(CONTAINER_MODELS_DIR) / PurePosixPath(host.rstrip("/")).name)
            mounts[host] = target
            return target

        cfg = kind.relocate(cfg, mount)
    host = options.host or ("0.0.0.0" if container else "127.0.0.1")
    argv, env = kind.command(cfg, Platform.CUDA, host=host, port=options.port, python="python")
    # The command is `python -m MODULE --model M ...`; `vllm serve` takes the model positionally.
    rest = argv[3:]
    i = rest.index("--model")
    model = rest[i + 1]
    if model.startswith("-"):  # a relative path that would read as a flag
        model = "./" + model
    args = [model, *rest[:i], *rest[i + 2:]]
    out_env = {k: v for k, v in env.items() if k not in _MEASUREMENT_ONLY_ENV}
    for key, value in env_in.items():
        if is_secret(key, value):
            dropped.append(key)
        elif key not in _MEASUREMENT_ONLY_ENV:
            out_env[key] = value
    return ServeSpec(args=args, env=dict(sorted(out_env.items())), mounts=mounts, dropped=dropped)


# -- formats -------------------------------------------------------------------------------------
def _header(study: StudyView, trial: TrialView, fmt: str, options: ExportOptions, spec: ServeSpec) -> list[str]:
    from tracetune.tuner.quality_gate import units_text

    lines = [
        f"tracetune export ({fmt}): study {study.name!r}, {_label(trial)}",
        *_platform_lines(study, options),
        "measured: " + ", ".join(f"{o}={display_value(o, trial.metric(o))}" for o in study.objectives),
    ]
    chosen_under = study.slos + ([f"quality gate {study.quality_gate}"] if study.quality_gate else [])
    if chosen_under:
        lines.append("chosen under: " + ", ".join(chosen_under))
    if units_text(trial.quality) != "-":
        lines.append("quality vs the reference: " + units_text(trial.quality))
    if _dummy(trial):
        lines.append("WARNING: measured with random weights (load_format dummy): this server answers with noise "
                     "until --load-format is removed and the model points at real weights of the same shape")
    if trial.diff:
        lines.append("differs from the reference: " + ", ".join(f"{k}={v}" for k, v in trial.diff.items()))
    if trial.category == "infeasible":
        lines.append("WARNING: this trial violates the study's SLOs or quality gate")
    if trial.beaten_by_reference:
        lines.append("WARNING: vLLM's defaults (the reference) are at least as good on every objective: "
                     "prefer the defaults")
    lines += capacity.header_lines(capacity.capacity_of(trial.summary))
    costs = study.costs(trial.summary)
    if "usd_per_1m_output_tokens" in costs:
        lines.append(f"at capacity, ${study.economics['gpu_hour_cost']:g}/GPU-hour: "
                     f"${costs['usd_per_1m_output_tokens']:.3g} per 1M output tokens, "
                     f"${costs['usd_per_1m_input_tokens']:.3g} per 1M input tokens")
    if "replicas" in costs:
        lines.append(f"for {study.economics['target_rate']:g} req/s of this traffic: {costs['replicas']:g} replicas, "
                     f"{costs['gpus_total']:g} GPUs")
    if fmt != "vllm-cmd":
        lines.append(f"image: {options.image}; port {options.port}; GPUs: {options.gpus}")
        for host, target in spec.mounts.items():
            where = (f"PVC {options.models_pvc!r} at {target}" if fmt in ("k8s", "helm-values")
                     else f"host {host} mounted at {target}")
            lines.append(f"model directory: {where}")
    if spec.dropped:
        lines.append("left out (credential-like, supply them from a secret store): " + ", ".join(spec.dropped))
    return ["# " + comment_safe(line) for line in lines]


def _label(trial: TrialView) -> str:
    return "the reference (vLLM's defaults)" if trial.is_reference else f"trial {trial.number}"


def _trial_id(trial: TrialView) -> str:
    """How exports name the trial: its number, or "reference"."""
    return "reference" if trial.is_reference else str(trial.number)


def _platform_lines(study: StudyView, options: ExportOptions) -> list[str]:
    version = gpu_vllm_version(study, options)
    if study.platform == "cuda":
        return [f"measured on NVIDIA GPU with vLLM {study.vllm_version or '?'}; flags for vLLM {version}"]
    return [f"measured on platform {study.platform} with vLLM {study.vllm_version or '?'}: these are the same "
            f"settings as flags of vLLM {version} for NVIDIA GPUs, where their speed was not measured; "
            f"run a study on the GPU before relying on its numbers"]


def _dummy(trial: TrialView) -> bool:
    return (trial.config or {}).get("load_format") == "dummy"


def _dollars(text: str) -> str:
    """compose and Kubernetes expand `$VAR`/`$(VAR)`; `$$` is their literal `$`."""
    return text.replace("$", "$$")


def _name(study: StudyView, trial: TrialView, options: ExportOptions) -> str:
    if options.name:
        return options.name
    return k8s_name(f"tracetune-{study.name}-" + ("ref" if trial.is_reference else f"t{trial.number}"))[:63].strip("-")


def to_vllm_cmd(study: StudyView, trial: TrialView, options: ExportOptions) -> str:
    """One shell command (environment assignments, then `vllm serve`), a flag per line."""
    spec = serve_spec(trial.config, options, container=False)
    lines = [" ".join(f"{k}={shlex.quote(v)}" for k, v in spec.env.items()),
             shlex.join(["vllm", "serve", spec.args[0]])]
    for arg in spec.args[1:]:
        if arg.startswith("--"):
            lines.append(shlex.quote(arg))
        else:
            lines[-1] += " " + shlex.quote(arg)
    command = " \\\n  ".join(line for line in lines if line)
    return "\n".join([*_header(study, trial, "vllm-cmd", options, spec), command]) + "\n"


def _yaml(docs: list[Any]) -> str:
    import yaml

    class Dumper(yaml.SafeDumper):
        def ignore_aliases(self, data: Any) -> bool:  # no &id001 anchors: people read these files
            return True

    return "---\n".join(yaml.dump(d, Dumper=Dumper, sort_keys=False, allow_unicode=False, width=1 << 16)
                         for d in docs)


def _probes(port_name: str) -> dict[str, Any]:
    get = {"path": "/health", "port": port_name}
    return {
        # vLLM loads weights and (unless eager) compiles before /health answers: allow 15 minutes.
        "startupProbe": {"httpGet": get, "periodSeconds": 10, "failureThreshold": 90},
        "readinessProbe": {"httpGet": get, "periodSeconds": 10, "failureThreshold": 3},
        "livenessProbe": {"httpGet": get, "periodSeconds": 30, "failureThreshold": 3, "timeoutSeconds": 10},
    }


def to_compose(study: StudyView, trial: TrialView, options: ExportOptions) -> str:
    spec = serve_spec(trial.config, options, container=True)
    name = _name(study, trial, options)
    service: dict[str, Any] = {
        "image": options.image,
        "entrypoint": ["vllm", "serve"],
        "command": [_dollars(a) for a in spec.args],
        "environment": {k: _dollars(v) for k, v in spec.env.items()},
        "ports": [f"{options.port}:{options.port}"],
        "volumes": [{"type": "bind", "source": _dollars(h), "target": t, "read_only": True}
                    for h, t in spec.mounts.items()],
        "ipc": "host",  # vLLM's workers share tensors through /dev/shm
        # python3 is in every vLLM image (curl need not be)
        "healthcheck": {"test": ["CMD", "python3", "-c", "import urllib.request; urllib.request.urlopen("
                                 f"'http://localhost:{options.port}/health', timeout=5)"],
                        "interval": "10s", "timeout": "5s", "retries": 3, "start_period": "900s"},
        "restart": "unless-stopped",
    }
    if options.gpus:
        service["deploy"] = {"resources": {"reservations": {"devices": [
            {"driver": "nvidia", "count": options.gpus, "capabilities": ["gpu"]}]}}}
    doc = {"services": {name: service}}
    return "\n".join(_header(study, trial, "compose", options, spec)) + "\n" + _yaml([doc])


def _container(spec: ServeSpec, options: ExportOptions) -> dict[str, Any]:
    resources = {"limits": {"nvidia.com/gpu": options.gpus}, "requests": {"nvidia.com/gpu": options.gpus}} \
        if options.gpus else {}
    return {
        "name": "vllm",
        "image": options.image,
        "command": ["vllm", "serve"],
        "args": [_dollars(a) for a in spec.args],
        "env": [{"name": k, "value": _dollars(v)} for k, v in spec.env.items()],
        "ports": [{"name": "http", "containerPort": options.port, "protocol": "TCP"}],
        "resources": resources,
        **_probes("http"),
        "volumeMounts": [{"name": "models", "mountPath": CONTAINER_MODELS_DIR, "readOnly": True},
                         {"name": "dshm", "mountPath": "/dev/shm"}],
    }


def _volumes(options: ExportOptions) -> list[dict[str, Any]]:
    return [{"name": "models", "persistentVolumeClaim": {"claimName": options.models_pvc, "readOnly": True}},
            {"name": "dshm", "emptyDir": {"medium": "Memory"}}]


def k8s_manifests(study: StudyView, trial: TrialView, options: ExportOptions) -> tuple[list[dict[str, Any]], ServeSpec]:
    spec = serve_spec(trial.config, options, container=True)
    name = _name(study, trial, options)
    labels = {"app.kubernetes.io/name": name, "app.kubernetes.io/managed-by": "tracetune"}
    meta: dict[str, Any] = {"name": name, "labels": labels,
                            "annotations": {"tracetune.io/study": study.name, "tracetune.io/trial": _trial_id(trial),
                                            "tracetune.io/measured-platform": study.platform}}
    if options.namespace:
        meta["namespace"] = options.namespace
    deployment = {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": meta,
        "spec": {
            "replicas": options.replicas,
            "selector": {"matchLabels": {"app.kubernetes.io/name": name}},
            "template": {"metadata": {"labels": labels},
                         "spec": {"containers": [_container(spec, options)], "volumes": _volumes(options)}},
        },
    }
    service = {
        "apiVersion": "v1", "kind": "Service",
        "metadata": {k: v for k, v in meta.items() if k != "annotations"},
        "spec": {"type": "ClusterIP", "selector": {"app.kubernetes.io/name": name},
                 "ports": [{"name": "http", "port": options.port, "targetPort": "http", "protocol": "TCP"}]},
    }
    return [deployment, service], spec


def to_k8s(study: StudyView, trial: TrialView, options: ExportOptions) -> str:
    docs, spec = k8s_manifests(study, trial, options)
    return "\n".join(_header(study, trial, "k8s", options, spec)) + "\n" + _yaml(docs)


def helm_values(study: StudyView, trial: TrialView, options: ExportOptions) -> tuple[dict[str, Any], ServeSpec]:
    spec = serve_spec(trial.config, options, container=True)
    repository, _, tag = options.image.rpartition(":")
    if "/" in tag or not repository:  # a registry port, not a tag
        repository, tag = options.image, "latest"
    container = _container(spec, options)
    values = {
        "nameOverride": _name(study, trial, options),
        "replicaCount": options.replicas,
        "image": {"repository": repository, "tag": tag, "pullPolicy": "IfNotPresent"},
        "command": container["command"],
        "args": container["args"],
        "env": container["env"],
        "containerPort": options.port,
        "service": {"type": "ClusterIP", "port": options.port},
        "resources": container["resources"],
        "startupProbe": container["startupProbe"],
        "readinessProbe": container["readinessProbe"],
        "livenessProbe": container["livenessProbe"],
        "volumes": _volumes(options),
        "volumeMounts": container["volumeMounts"],
        "podAnnotations": {"tracetune.io/study": study.name, "tracetune.io/trial": _trial_id(trial),
                           "tracetune.io/measured-platform": study.platform},
    }
    return values, spec


def to_helm_values(study: StudyView, trial: TrialView, options: ExportOptions) -> str:
    values, spec = helm_values(study, trial, options)
    note = ["# values for a generic single-container Deployment chart (e.g. `helm create`'s layout): "
            "image, args, env, resources, probes, volumes; args/env are ready for Kubernetes ($ doubled)"]
    return "\n".join(_header(study, trial, "helm-values", options, spec) + note) + "\n" + _yaml([values])


def to_json(study: StudyView, trial: TrialView, options: ExportOptions) -> str:
    spec = serve_spec(trial.config, options, container=False)
    config = json.loads(json.dumps(trial.config))
    config["extra_args"] = strip_secret_args(list(config.get("extra_args") or []), [])
    config["env"] = {k: v for k, v in (config.get("env") or {}).items() if not is_secret(k, v)}
    doc = {
        "tracetune_export": 1,
        "study": study.name, "trial": "reference" if trial.is_reference else trial.number,
        "measured_platform": study.platform, "measured_vllm": study.vllm_version,
        "target_vllm": gpu_vllm_version(study, options), "note": " ".join(_platform_lines(study, options)),
        "chosen_under": {"slos": study.slos, "quality_gate": str(study.quality_gate) if study.quality_gate else None},
        "quality": trial.quality,
        "objectives": {o: _finite(trial.metric(o)) for o in study.objectives},
        "feasible": trial.feasible,
        "differs_from_reference": trial.diff,
        "config": config,
        "serve": {"argv": ["vllm", "serve", *spec.args], "env": spec.env},
        "left_out": spec.dropped,
    }
    if capacity.capacity_of(trial.summary):
        doc["capacity"] = capacity.capacity_of(trial.summary)
    return json.dumps(doc, indent=2, default=str) + "\n"


def _finite(value: float) -> float | None:
    return None if value is None or math.isnan(value) else value


_EXPORTERS = {"vllm-cmd": to_vllm_cmd, "compose": to_compose, "k8s": to_k8s, "helm-values": to_helm_values,
              "json": to_json}
FILE_NAMES = {"vllm-cmd": "serve.sh", "compose": "compose.yaml", "k8s": "deployment.yaml",
              "helm-values": "values.yaml", "json": "trial.json"}


def export(study: StudyView, trial: TrialView, fmt: str, options: ExportOptions | None = None) -> str:
    """`trial`'s configuration in format `fmt` (one of FORMATS)."""
    if fmt not in _EXPORTERS:
        raise InputError(f"--format {fmt!r} is not one of {', '.join(FORMATS)}")
    if trial.config is None:
        raise InputError(f"{_label(trial)} has no stored config ({trial.status}); nothing to export")
    options = options or ExportOptions()
    options = dataclasses.replace(options, image=image_of(study, options))
    if _dummy(trial) and not options.allow_dummy_weights:
        raise InputError(f"{_label(trial)} was measured with random weights (load_format dummy): deployed as it is, "
                         f"the server would answer with noise. Its speed holds for real weights of the same shape: "
                         f"deploy those; --allow-dummy-weights exports it anyway (a test deployment)")
    return _EXPORTERS[fmt](study, trial, options)
