"""The `k8s` format: a Deployment and its Service, the models read from a PersistentVolumeClaim,
probes on /health, GPU placement (for a GPU image) as NVIDIA's GPU operator labels and taints nodes. The container,
volumes and placement are shared with the Helm values (`helm`)."""

from __future__ import annotations

from tracetune.dashboard.data import StudyView, TrialView
from tracetune.dashboard.export.notes import header, trial_id
from tracetune.dashboard.export.options import ExportOptions, deployment_name
from tracetune.dashboard.export.serve import CONTAINER_MODELS_DIR, ServeSpec, exported_engine, serve_spec
from tracetune.dashboard.export.text import dollars, yaml_text
from tracetune.k8s import GPU_NODE_SELECTOR, GPU_TOLERATIONS

# A Kubernetes object as written: nested mappings and lists of plain values.
Manifest = dict[str, object]


def probes(port_name: str) -> Manifest:
    """Startup, readiness and liveness probes on /health."""
    get = {"path": "/health", "port": port_name}
    # vLLM loads weights and (unless eager) compiles before /health answers: allow 15 minutes (llama.cpp's
    # server answers within seconds of loading its GGUF; the same allowance costs it nothing).
    return {"startupProbe": {"httpGet": get, "periodSeconds": 10, "failureThreshold": 90},
            "readinessProbe": {"httpGet": get, "periodSeconds": 10, "failureThreshold": 3},
            "livenessProbe": {"httpGet": get, "periodSeconds": 30, "failureThreshold": 3, "timeoutSeconds": 10}}


def container(spec: ServeSpec, options: ExportOptions) -> Manifest:
    """The server's container: image, command, resources, probes, mounts."""
    deployment = spec.deployment
    assert deployment is not None
    gpu = {"nvidia.com/gpu": options.gpus} if options.gpus else {}
    resources = {"requests": {**options.requests(deployment.shared_memory), **gpu}, **({"limits": gpu} if gpu else {})}
    shm = [{"name": "dshm", "mountPath": "/dev/shm"}] if deployment.shared_memory else []
    return {
        "name": deployment.container,
        "image": options.image,
        "command": list(deployment.entrypoint),
        "args": [dollars(a) for a in spec.args],
        "env": [{"name": k, "value": dollars(v)} for k, v in spec.env.items()],
        "ports": [{"name": "http", "containerPort": options.port, "protocol": "TCP"}],
        "resources": resources,
        **probes("http"),
        "volumeMounts": [{"name": "models", "mountPath": CONTAINER_MODELS_DIR, "readOnly": True}, *shm],
    }


def volumes(options: ExportOptions, spec: ServeSpec) -> list[Manifest]:
    """The models' claim (read-only) and, for an engine whose workers share tensors, a memory-backed /dev/shm."""
    shared = spec.deployment is not None and spec.deployment.shared_memory
    shm: list[Manifest] = [{"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": f"{options.shm_gib}Gi"}}]
    return [{"name": "models", "persistentVolumeClaim": {"claimName": options.models_pvc, "readOnly": True}},
            *(shm if shared else [])]


def placement(options: ExportOptions) -> Manifest:
    """nodeSelector and tolerations for GPU nodes (none without GPUs)."""
    return {"nodeSelector": GPU_NODE_SELECTOR, "tolerations": GPU_TOLERATIONS} if options.gpus else {}


def k8s_manifests(study: StudyView, trial: TrialView, options: ExportOptions) -> tuple[list[Manifest], ServeSpec]:
    """The Deployment and the Service, and the server they run."""
    spec = serve_spec(trial.config or {}, options, container=True, measured_on=study.platform,
                      engine=exported_engine(study, options, trial.config))
    name = deployment_name(study, trial, options)
    labels = {"app.kubernetes.io/name": name, "app.kubernetes.io/managed-by": "tracetune"}
    meta: Manifest = {"name": name, "labels": labels,
                      "annotations": {"tracetune.io/study": study.name, "tracetune.io/trial": trial_id(trial),
                                      "tracetune.io/measured-platform": study.platform}}
    if options.namespace:
        meta["namespace"] = options.namespace
    pod = {"containers": [container(spec, options)], "volumes": volumes(options, spec), **placement(options)}
    deployment: Manifest = {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": meta,
        "spec": {"replicas": options.replicas, "selector": {"matchLabels": {"app.kubernetes.io/name": name}},
                 "template": {"metadata": {"labels": labels}, "spec": pod}}}
    service: Manifest = {
        "apiVersion": "v1", "kind": "Service", "metadata": {k: v for k, v in meta.items() if k != "annotations"},
        "spec": {"type": "ClusterIP", "selector": {"app.kubernetes.io/name": name},
                 "ports": [{"name": "http", "port": options.port, "targetPort": "http", "protocol": "TCP"}]}}
    return [deployment, service], spec


def to_k8s(study: StudyView, trial: TrialView, options: ExportOptions) -> str:
    """The manifests as one YAML file, the comments first."""
    docs, spec = k8s_manifests(study, trial, options)
    return "\n".join(header(study, trial, "k8s", options, spec)) + "\n" + yaml_text(docs)
