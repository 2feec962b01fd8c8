"""The fleet's Kubernetes objects: an Indexed Job whose every pod is one worker running the same study
(`worker_job`), the ConfigMap its inputs travel in (`inputs_configmap`) and, for a team without a
database, a PostgreSQL StatefulSet and its Service (`postgres`). Secrets are referenced by name, never
written: the study's URL and password come from the Secret the user makes (`plan.secret_command`)."""

from __future__ import annotations

import dataclasses

from tracetune.fleet.plan import FleetOptions, Inputs, postgres_name
from tracetune.k8s import GPU_NODE_SELECTOR, GPU_RESOURCE, GPU_TOLERATIONS

# A Kubernetes object as written: nested mappings and lists of plain values.
Manifest = dict[str, object]

# Where a worker pod mounts what it reads and writes.
INPUTS_DIR = "/etc/tracetune/inputs"   # the ConfigMap: the trace (when it fits) and the search space
TRACE_DIR = "/data/traces"             # --trace-pvc, read-only
WORK_DIR = "/tracetune"                # the run folder (run/) and TRACETUNE_HOME (home/: checkpoints made)
MODELS_DIR = "/models"                 # --models-pvc, read-only
# The Job controller's annotation of a pod's index, read through the downward API.
INDEX_ANNOTATION = "batch.kubernetes.io/job-completion-index"
POSTGRES_IMAGE = "postgres:17"
# tune stops its engine and puts its running trial back in the queue on SIGTERM; vLLM takes seconds to stop.
GRACE_S = 120


@dataclasses.dataclass(frozen=True)
class Worker:
    """One worker pod's program: its image, its `tune` arguments, its study's name and whether its
    engine's workers share tensors through /dev/shm, and whether it reads models from the claim."""

    image: str
    args: list[str]
    study: str
    shared_memory: bool
    models: bool


def _meta(name: str, options: FleetOptions, component: str) -> Manifest:
    meta: Manifest = {"name": name, "labels": _labels(options, component)}
    if options.namespace:
        meta["namespace"] = options.namespace
    return meta


def _labels(options: FleetOptions, component: str) -> dict[str, str]:
    return {"app.kubernetes.io/name": "tracetune", "app.kubernetes.io/instance": options.name,
            "app.kubernetes.io/component": component, "app.kubernetes.io/managed-by": "tracetune"}


def inputs_configmap(inputs: Inputs, options: FleetOptions) -> Manifest:
    """The ConfigMap of the trace (when it fits) and the search space, mounted read-only in every pod."""
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": _meta(f"{options.name}-inputs", options, "inputs"),
            "data": dict(inputs.configmap)}


def _env(options: FleetOptions) -> list[Manifest]:
    """The storage URL and password from the Secret (a database without a password needs no password
    key), the worker's name (its pod's: `kubectl logs` takes it) and index, and where checkpoints go."""
    secret = options.db_secret
    return [
        {"name": "TRACETUNE_STORAGE", "valueFrom": {"secretKeyRef": {"name": secret, "key": "url"}}},
        {"name": "PGPASSWORD", "valueFrom": {"secretKeyRef": {"name": secret, "key": "password", "optional": True}}},
        {"name": "TRACETUNE_WORKER", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": "TRACETUNE_WORKER_INDEX",
         "valueFrom": {"fieldRef": {"fieldPath": f"metadata.annotations['{INDEX_ANNOTATION}']"}}},
        {"name": "TRACETUNE_HOME", "value": f"{WORK_DIR}/home"},
    ]


def _volumes(inputs: Inputs, worker: Worker, options: FleetOptions) -> tuple[list[Manifest], list[Manifest]]:
    """The pod's volumes and the worker's mounts: the inputs, the trace claim, the run folder (a claim's
    subfolder per worker index, or the pod's own emptyDir), the models claim, /dev/shm."""
    volumes: list[Manifest] = [{"name": "inputs", "configMap": {"name": f"{options.name}-inputs"}}]
    mounts: list[Manifest] = [{"name": "inputs", "mountPath": INPUTS_DIR, "readOnly": True}]
    if inputs.trace_pvc is not None:
        volumes.append({"name": "traces", "persistentVolumeClaim": {"claimName": inputs.trace_pvc, "readOnly": True}})
        mounts.append({"name": "traces", "mountPath": TRACE_DIR, "readOnly": True})
    if options.runs_pvc is not None:
        volumes.append({"name": "work", "persistentVolumeClaim": {"claimName": options.runs_pvc}})
        mounts.append({"name": "work", "mountPath": WORK_DIR, "subPathExpr": "worker-$(TRACETUNE_WORKER_INDEX)"})
    else:
        volumes.append({"name": "work", "emptyDir": {}})
        mounts.append({"name": "work", "mountPath": WORK_DIR})
    if worker.models:
        volumes.append({"name": "models",
                        "persistentVolumeClaim": {"claimName": options.models_pvc, "readOnly": True}})
        mounts.append({"name": "models", "mountPath": MODELS_DIR, "readOnly": True})
    if worker.shared_memory:
        volumes.append({"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": f"{options.shm_gib}Gi"}})
        mounts.append({"name": "dshm", "mountPath": "/dev/shm"})
    return volumes, mounts


def _resources(worker: Worker, options: FleetOptions) -> Manifest:
    gpus = {GPU_RESOURCE: options.gpus_per_worker} if options.gpus_per_worker else {}
    return {"requests": {**options.requests(worker.shared_memory), **gpus}, **({"limits": gpus} if gpus else {})}


def _wait_for_database(options: FleetOptions) -> list[Manifest]:
    """With --with-postgres, an init container that waits until the database answers (a worker that
    cannot reach its storage stops with an error, which would spend its retries)."""
    if not options.with_postgres:
        return []
    host = postgres_name(options)
    return [{"name": "wait-for-database", "image": POSTGRES_IMAGE, "command": ["sh", "-c"],
             "args": [f"until pg_isready -h {host} -p 5432 -U tracetune; do sleep 2; done"],
             "resources": {"requests": {"cpu": "50m", "memory": "32Mi"}}}]


def worker_job(inputs: Inputs, worker: Worker, options: FleetOptions) -> Manifest:
    """The Indexed Job: `workers` pods at once, each `tune ARGS` on its GPUs, done when each has exited 0
    (a worker exits when the study holds its trials). A pod disrupted (preempted, evicted, its node
    drained: condition DisruptionTarget) is replaced without counting against its retries; a worker that
    fails is retried `retries` times, on its own index, the others going on."""
    volumes, mounts = _volumes(inputs, worker, options)
    container: Manifest = {
        "name": "worker", "image": worker.image, "imagePullPolicy": "IfNotPresent",
        "command": ["tune"], "args": worker.args, "env": _env(options),
        "resources": _resources(worker, options), "volumeMounts": mounts,
    }
    placement = {"nodeSelector": GPU_NODE_SELECTOR, "tolerations": GPU_TOLERATIONS} if options.gpus_per_worker else {}
    pod: Manifest = {"restartPolicy": "Never", "terminationGracePeriodSeconds": GRACE_S,
                     **({"initContainers": _wait_for_database(options)} if options.with_postgres else {}),
                     "containers": [container], "volumes": volumes, **placement}
    meta = _meta(options.name, options, "worker")
    meta["annotations"] = {"tracetune.io/study": worker.study}
    return {
        "apiVersion": "batch/v1", "kind": "Job", "metadata": meta,
        "spec": {
            "completionMode": "Indexed", "completions": options.workers, "parallelism": options.workers,
            "backoffLimitPerIndex": options.retries,
            "podReplacementPolicy": "Failed",  # a replacement starts once the pod it replaces has stopped
            "podFailurePolicy": {"rules": [
                {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]}]},
            "template": {"metadata": {"labels": _labels(options, "worker"),
                                      "annotations": {"tracetune.io/study": worker.study}},
                         "spec": pod},
        },
    }


def postgres(options: FleetOptions) -> list[Manifest]:
    """A one-replica PostgreSQL StatefulSet on its own claim and its headless Service, for teams without a
    database: user and database `tracetune`, the password from the Secret's `password` key, connections
    for every worker (`FleetOptions.max_connections`)."""
    name = postgres_name(options)
    labels = {**_labels(options, "database"), "app.kubernetes.io/instance": name}
    selector = {"app.kubernetes.io/instance": name, "app.kubernetes.io/component": "database"}
    service: Manifest = {
        "apiVersion": "v1", "kind": "Service", "metadata": {**_meta(name, options, "database"), "labels": labels},
        "spec": {"clusterIP": "None", "selector": selector,
                 "ports": [{"name": "postgres", "port": 5432, "targetPort": "postgres", "protocol": "TCP"}]}}
    ready = {"exec": {"command": ["pg_isready", "-U", "tracetune", "-d", "tracetune"]}, "periodSeconds": 5}
    container: Manifest = {
        "name": "postgres", "image": POSTGRES_IMAGE,
        "args": ["-c", f"max_connections={max(options.max_connections, 100)}"],
        "env": [{"name": "POSTGRES_USER", "value": "tracetune"}, {"name": "POSTGRES_DB", "value": "tracetune"},
                {"name": "POSTGRES_PASSWORD",
                 "valueFrom": {"secretKeyRef": {"name": options.db_secret, "key": "password"}}},
                {"name": "PGDATA", "value": "/var/lib/postgresql/data/pgdata"}],
        "ports": [{"name": "postgres", "containerPort": 5432, "protocol": "TCP"}],
        "readinessProbe": ready,
        "resources": {"requests": {"cpu": "1", "memory": "1Gi"}},
        "volumeMounts": [{"name": "data", "mountPath": "/var/lib/postgresql/data"}],
    }
    claim = {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": options.postgres_disk}}}
    statefulset: Manifest = {
        "apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": {**_meta(name, options, "database"),
                                                                     "labels": labels},
        "spec": {"serviceName": name, "replicas": 1, "selector": {"matchLabels": selector},
                 "template": {"metadata": {"labels": labels}, "spec": {"containers": [container]}},
                 "volumeClaimTemplates": [{"metadata": {"name": "data"}, "spec": claim}]},
    }
    return [service, statefulset]


def fleet_manifests(inputs: Inputs, worker: Worker, options: FleetOptions) -> list[Manifest]:
    """Everything `kubectl apply` takes, in the order it should create them: the database (with
    --with-postgres), the inputs, the Job."""
    return [*(postgres(options) if options.with_postgres else []), inputs_configmap(inputs, options),
            worker_job(inputs, worker, options)]
