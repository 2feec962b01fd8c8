"""How a deployment is shaped: `ExportOptions` (each a `tune export` flag and a dashboard field),
checked when made, and the DNS-1123 names Kubernetes and compose accept."""

from __future__ import annotations

import dataclasses

from tracetune.dashboard.data import StudyView, TrialView
from tracetune.dashboard.export.pick import PickRule
from tracetune.errors import InputError
from tracetune.k8s import DNS_LABEL, SERVER_CORES_PER_GPU, SERVER_MEMORY_GIB_PER_GPU, check_quantity, k8s_name

DEFAULT_PORT = 8000


@dataclasses.dataclass
class ExportOptions:
    """Deployment defaults, each overridable from `tune export` flags and the dashboard."""

    image: str | None = None          # default: image_of() (export() sets it)
    engine_version: str | None = None  # the engine release the deployment runs (sets the image tag)
    allow_dummy_weights: bool = False  # export a config measured with random weights (load_format dummy)
    port: int = DEFAULT_PORT
    host: str | None = None           # listen address: 0.0.0.0 in containers, 127.0.0.1 for the command format
    gpus: int = 1                     # per replica, for an engine whose image runs on GPUs (else none)
    name: str | None = None           # Kubernetes/compose name; default tracetune-STUDY-tN
    namespace: str | None = None
    models_pvc: str = "models"        # k8s/helm: PersistentVolumeClaim holding the model directories
    replicas: int = 1
    cpu: str | None = None            # k8s/helm CPU request; default 4 per GPU
    memory: str | None = None         # k8s/helm memory request; default 16Gi per GPU + /dev/shm
    shm_gib: int = 8                  # k8s/helm /dev/shm (memory-backed emptyDir) size limit, GiB
    chosen_by: PickRule | None = None  # the --best/--pick rule that chose the trial

    def __post_init__(self) -> None:
        for flag, value, low in (("--port", self.port, 1), ("--gpus", self.gpus, 0), ("--replicas", self.replicas, 1),
                                 ("--shm-gib", self.shm_gib, 1)):
            if value < low or (flag == "--port" and value > 65535):
                bounds = "between 1 and 65535" if flag == "--port" else f">= {low}"
                raise InputError(f"{flag} must be {bounds}, got {value}")
        if self.name is not None and not DNS_LABEL.match(self.name):
            raise InputError(f"--name {self.name!r} must be a DNS-1123 label (lowercase letters, digits and '-', "
                             f"starting and ending with a letter or digit, at most 63 characters)")
        if self.namespace is not None and not DNS_LABEL.match(self.namespace):
            raise InputError(f"--namespace {self.namespace!r} must be a DNS-1123 label")
        if not DNS_LABEL.match(self.models_pvc):
            raise InputError(f"--models-pvc {self.models_pvc!r} must be a DNS-1123 name")
        for flag, quantity in (("--cpu", self.cpu), ("--memory", self.memory)):
            check_quantity(flag, quantity)

    def requests(self, shared_memory: bool = True) -> dict[str, str]:
        """CPU and memory one replica requests: the flags, else 4 cores and 16Gi per GPU (or for a
        server without GPUs) plus the memory-backed /dev/shm where the engine has one (it counts
        against the pod's memory)."""
        gpus = max(self.gpus, 1)
        shm = self.shm_gib if shared_memory else 0
        return {"cpu": self.cpu or str(SERVER_CORES_PER_GPU * gpus),
                "memory": self.memory or f"{SERVER_MEMORY_GIB_PER_GPU * gpus + shm}Gi"}


def deployment_name(study: StudyView, trial: TrialView, options: ExportOptions) -> str:
    """The compose service / Kubernetes name: --name, else tracetune-STUDY-tN (tracetune-STUDY-ref)."""
    if options.name:
        return options.name
    return k8s_name(f"tracetune-{study.name}-" + ("ref" if trial.is_reference else f"t{trial.number}"))[:63].strip("-")
