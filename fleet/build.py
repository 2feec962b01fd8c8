"""A fleet from the study's flags and the fleet's options: the manifests, the worker image's Dockerfile,
and what the user does next (build the image, make the Secret, apply, watch), each decision said once."""

from __future__ import annotations

import dataclasses
import shlex
from pathlib import Path

from tracetune.engine_adapter.kind import EngineKind
from tracetune.errors import InputError
from tracetune.fleet.command import Option, given, worker_args
from tracetune.fleet.image import DOCKERFILE, DOCKERIGNORE, dockerfile, dockerignore, source_checkout
from tracetune.fleet.manifests import INPUTS_DIR, MODELS_DIR, TRACE_DIR, WORK_DIR, Manifest, Worker, fleet_manifests
from tracetune.fleet.plan import (
    POSTGRES_DEFAULT_MAX_CONNECTIONS,
    FleetOptions,
    Inputs,
    Storage,
    place_inputs,
    postgres_name,
    secret_command,
    study_storage,
    worker_storage,
)
from tracetune.k8s import comment_safe, yaml_text

MANIFESTS = "fleet.yaml"  # every object, in the order kubectl should create them
# Metavars of the engine flags that name a file or folder of this machine (a model, a draft, a GGUF file).
PATH_METAVARS = frozenset({"DIR", "FILE", "GGUF"})


@dataclasses.dataclass(frozen=True)
class Study:
    """What the fleet reads of the main job's flags: the study's name (given or derived, as the main job
    derives it), its trace, space, storage and engine, its trial count, and every option as given."""

    name: str
    trace: Path
    space: Path | None
    storage: str | None
    engine: EngineKind
    trials: int
    options: list[Option]


@dataclasses.dataclass
class Fleet:
    """The files to write (fleet.yaml: the manifests, their comments first; the Dockerfile and its ignore
    file), the manifests themselves, and the lines that say what was chosen and what to run next."""

    manifests: list[Manifest]
    files: dict[str, str]
    chosen: list[str]
    steps: list[str]


def default_gpus(engine: EngineKind) -> int:
    """GPUs per worker when none are given: one for an engine whose image runs on NVIDIA GPUs, else none."""
    return 1 if engine.deployment is not None and engine.deployment.platform == "cuda" else 0


def check_gpus(engine: EngineKind, gpus: int) -> None:
    """GPUs for an engine whose image runs on them, none for one that runs on the CPU."""
    on_gpus = default_gpus(engine) > 0
    if on_gpus and gpus < 1:
        raise InputError(f"--gpus-per-worker 0: the {engine.shown} image runs on NVIDIA GPUs; give 1 or more")
    if not on_gpus and gpus > 0:
        raise InputError(f"--gpus-per-worker {gpus}: the {engine.shown} engine runs on the CPU here; leave it out")


def check_flags(options: list[Option]) -> None:
    """The main job's flags a worker pod cannot take as given: --gpus (a pod is one worker: give
    --gpus-per-worker), --api-key-env (the pod has no such variable), a credential in --engine-env or
    --engine-arg (it would be written into the manifest), a --warm-start-storage the pods cannot reach."""
    from tracetune.tuner.secrets import is_secret, strip_secret_args

    if given(options, "--gpus"):
        raise InputError("--gpus: each pod is one worker; give its GPUs with tune fleet --gpus-per-worker N")
    if given(options, "--api-key-env"):
        raise InputError("--api-key-env: a worker's pods have no such variable, and each worker's engines listen "
                         "inside its own pod; leave it out")
    secret_env = [pair.partition("=")[0] for pair in given(options, "--engine-env")
                  if is_secret(pair.partition("=")[0], pair.partition("=")[2])]
    dropped: list[str] = []
    strip_secret_args(given(options, "--engine-arg"), dropped)
    if secret_env or dropped:
        raise InputError(f"--engine-env/--engine-arg {', '.join(secret_env + dropped)}: a credential would be "
                         f"written into the manifest; leave it out of the fleet's flags")
    for url in given(options, "--warm-start-storage"):
        if worker_storage(url, flag="--warm-start-storage").stripped:
            raise InputError("--warm-start-storage: a password in the URL would be written into the manifest; "
                             "leave it out (the workers read PGPASSWORD from the Secret)")


def _model_paths(engine: EngineKind, options: list[Option]) -> tuple[set[str], dict[str, str]]:
    """The engine flags that name local paths, and each path of this machine they name -> its place on the
    models claim (/models/NAME); a value that is no path here (a path in the image, a derived draft) stays."""
    flags = {f.flag for kind in engine.engines for f in kind.flags if f.metavar in PATH_METAVARS}
    moved = {value: f"{MODELS_DIR}/{Path(value).expanduser().name}" for flag, value in options
             if flag in flags and value is not None and Path(value).expanduser().exists()}
    return flags, moved


def _shared_memory(engine: EngineKind) -> bool:
    return engine.deployment is not None and engine.deployment.shared_memory


def build_fleet(study: Study, options: FleetOptions, *, base: str, out: Path | None = None) -> Fleet:
    """The fleet that runs `study` as `options` say, its worker image built FROM `base`; `out`: the
    folder it is written to (None: the manifests go to stdout, the Dockerfile nowhere)."""
    check_gpus(study.engine, options.gpus_per_worker)
    check_flags(study.options)
    storage = study_storage(study.storage, options)
    inputs = place_inputs(study.trace, study.space, options)
    path_flags, moved = _model_paths(study.engine, study.options)
    trace_dir = TRACE_DIR if inputs.trace_pvc else INPUTS_DIR
    pinned = {"--trace": f"{trace_dir}/{inputs.trace_key}",
              **({"--space": f"{INPUTS_DIR}/{inputs.space_key}"} if inputs.space_key else {}),
              "--storage": "$(TRACETUNE_STORAGE)", "--run-dir": f"{WORK_DIR}/run", "--study": study.name,
              "--engine": study.engine.name}
    args = worker_args(study.options, pinned, lambda flag, value: moved.get(value, value) if flag in path_flags
                       else value)
    models = any(flag in path_flags for flag, _ in study.options)
    manifests = fleet_manifests(inputs, Worker(options.image, args, study.name, _shared_memory(study.engine), models),
                                options)
    chosen = _chosen(study, options, inputs, storage, base, moved)
    steps = _steps(study, options, storage, out)
    header = ["tracetune fleet (tune fleet): one study, one worker per pod", *chosen, "then:", *steps]
    files = {MANIFESTS: "".join(f"# {comment_safe(line)}\n" for line in header) + yaml_text(manifests)}
    if out is not None:
        files |= {DOCKERFILE: dockerfile(base, study.engine, study.name), DOCKERIGNORE: dockerignore()}
    return Fleet(manifests, files, chosen, steps)


def _chosen(study: Study, options: FleetOptions, inputs: Inputs, storage: Storage, base: str,
            moved: dict[str, str]) -> list[str]:
    """What was decided and why, one line each."""
    gpus = options.gpus_per_worker
    lines = [f"{options.workers} workers x {gpus or 'no'} GPU{'s' * (gpus != 1)}: study {study.name!r}, "
             f"{study.trials} trials in all, engine {study.engine.shown}",
             f"trace: {inputs.why}",
             "run folder: " + (f"the claim {options.runs_pvc}, a subfolder per worker (kept)" if options.runs_pvc
                               else "each pod's emptyDir (logs; the results are in the database)"),
             f"image: {options.image} = {base} + tracetune (Dockerfile)",
             f"database: {storage.url} (Secret {options.db_secret}: keys url, password)"]
    lines += [f"model: {path} -> {place} on the claim {options.models_pvc}" for path, place in moved.items()]
    if storage.stripped:
        lines.append("--storage: its password is left out of everything written; it goes in the Secret")
    if options.workers > study.trials:
        lines.append(f"note: {options.workers} workers for {study.trials} trials: "
                     f"{options.workers - study.trials} will find nothing to measure")
    if not options.with_postgres and options.max_connections > POSTGRES_DEFAULT_MAX_CONNECTIONS:
        lines.append(f"note: the database must accept {options.max_connections} connections (PostgreSQL's "
                     f"default max_connections is {POSTGRES_DEFAULT_MAX_CONNECTIONS})")
    return lines


def _steps(study: Study, options: FleetOptions, storage: Storage, out: Path | None) -> list[str]:
    """The commands that start the fleet and watch it (a database in the cluster through a port-forward)."""
    checkout = source_checkout()
    context = shlex.quote(str(checkout)) if checkout else "TRACETUNE_CHECKOUT"
    ns = f" -n {options.namespace}" if options.namespace else ""
    build = (f"docker build -f {shlex.quote(str(out / DOCKERFILE))} -t {options.image} {context} && "
             f"docker push {options.image}") if out else "tune fleet --out DIR also writes the image's Dockerfile"
    manifests = shlex.quote(str(out / MANIFESTS)) if out else "FILE (this output, saved)"
    watch = storage.url
    steps = [build, secret_command(storage, options),
             f"kubectl apply --server-side -f {manifests}   # server-side: a large ConfigMap fits",
             f"kubectl get pods{ns} -l app.kubernetes.io/instance={options.name} -w"]
    if options.with_postgres:
        watch = "postgresql://tracetune@127.0.0.1:5432/tracetune"
        steps += [f"kubectl port-forward{ns} svc/{postgres_name(options)} 5432:5432 &",
                  f"export PGPASSWORD=$(kubectl get secret{ns} {options.db_secret} -o jsonpath='{{.data.password}}'"
                  f" | base64 -d)"]
    return [*steps, f"tune dashboard --storage {shlex.quote(watch)} --study {shlex.quote(study.name)}   "
                    f"# read-only, as trials land"]
