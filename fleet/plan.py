"""What a fleet is made of, decided and checked before anything is written: the fleet's own settings
(`FleetOptions`), the study's storage as the workers reach it (`worker_storage`: PostgreSQL, its
password never in a manifest), where the trace comes from (`place_inputs`: a ConfigMap when it fits,
else a claim the user names) and where the run folder lives."""

from __future__ import annotations

import dataclasses
import re
import shlex
from pathlib import Path

from tracetune.errors import InputError
from tracetune.k8s import DNS_LABEL, SERVER_CORES_PER_GPU, SERVER_MEMORY_GIB_PER_GPU, check_quantity

# Kubernetes refuses a ConfigMap whose data (each key's length plus its value's bytes) exceeds 1 MiB
# (`core.MaxSecretSize`, checked by ValidateConfigMap); etcd's own object limit is 1.5 MiB.
CONFIGMAP_MAX_BYTES = 1024 * 1024
# A name other objects extend (NAME-inputs, NAME-postgres-0, the pods' NAME-INDEX-xxxxx host names) stays
# within the 63 characters of a label and a host name.
MAX_NAME = 40
# Connections one worker holds open on the study database (Optuna's storage, its heartbeat beside the
# trial, the claims): 3 steady, 15 at the peak of 4 workers (docs/workers.md): sized by the peak.
CONNECTIONS_PER_WORKER = 4
# What else the database serves: a dashboard, psql, PostgreSQL's own reserved connections.
SPARE_CONNECTIONS = 20
POSTGRES_DEFAULT_MAX_CONNECTIONS = 100


@dataclasses.dataclass(frozen=True)
class FleetOptions:
    """The fleet's shape, each a `tune fleet` flag, checked when made."""

    workers: int
    gpus_per_worker: int
    name: str
    image: str
    base_image: str
    namespace: str | None = None
    db_secret: str = "tracetune-db"
    trace_pvc: str | None = None
    runs_pvc: str | None = None
    models_pvc: str = "models"
    cpu: str | None = None
    memory: str | None = None
    shm_gib: int = 8
    retries: int = 3
    with_postgres: bool = False
    postgres_disk: str = "20Gi"

    def __post_init__(self) -> None:
        if self.workers < 1:
            raise InputError(f"--workers must be >= 1, got {self.workers}")
        if self.gpus_per_worker < 0 or self.shm_gib < 1 or self.retries < 0:
            raise InputError("--gpus-per-worker and --retries must be >= 0, --shm-gib >= 1")
        if len(self.name) > MAX_NAME or not DNS_LABEL.match(self.name):
            raise InputError(f"--name {self.name!r} must be a DNS-1123 label of at most {MAX_NAME} characters "
                             f"(lowercase letters, digits and '-'): the ConfigMap, database and pods extend it")
        for flag, value in (("--namespace", self.namespace), ("--db-secret", self.db_secret),
                            ("--trace-pvc", self.trace_pvc), ("--runs-pvc", self.runs_pvc),
                            ("--models-pvc", self.models_pvc)):
            if value is not None and not DNS_LABEL.match(value):
                raise InputError(f"{flag} {value!r} must be a DNS-1123 name (lowercase letters, digits and '-')")
        for flag, quantity in (("--cpu", self.cpu), ("--memory", self.memory), ("--postgres-disk", self.postgres_disk)):
            check_quantity(flag, quantity)

    def requests(self, shared_memory: bool) -> dict[str, str]:
        """CPU and memory one worker requests: the flags, else the server's share as an export requests it
        (4 cores and 16Gi per GPU, /dev/shm counted in memory) plus 2 cores and 4Gi for the replay client
        and the quality probe, which run beside the server in the same pod."""
        gpus = max(self.gpus_per_worker, 1)
        shm = self.shm_gib if shared_memory else 0
        return {"cpu": self.cpu or str(SERVER_CORES_PER_GPU * gpus + 2),
                "memory": self.memory or f"{SERVER_MEMORY_GIB_PER_GPU * gpus + 4 + shm}Gi"}

    @property
    def max_connections(self) -> int:
        """The connections the study database must accept: every worker's, and spares."""
        return self.workers * CONNECTIONS_PER_WORKER + SPARE_CONNECTIONS


@dataclasses.dataclass(frozen=True)
class Storage:
    """The study's database as the workers reach it: `url` without a password (the Secret's `url` key);
    `stripped` when the URL given had one (left out of everything written)."""

    url: str
    stripped: bool = False


def study_storage(given: str | None, options: FleetOptions) -> Storage:
    """The storage the workers share: the given --storage (`worker_storage`), or with --with-postgres the
    database the manifests start (then no --storage is given)."""
    if options.with_postgres:
        if given is not None:
            raise InputError(f"--storage and --with-postgres: --with-postgres starts the study's database "
                             f"({postgres_url(options)}); leave --storage out, or drop --with-postgres")
        return Storage(postgres_url(options))
    if given is None:
        raise InputError("the study flags need --storage postgresql://USER@HOST:5432/DB (the database every "
                         "worker shares), or give --with-postgres to start one in the cluster")
    return worker_storage(given)


def worker_storage(given: str, *, flag: str = "--storage") -> Storage:
    """A database URL the workers reach: PostgreSQL (SQLite's file locks do not reach across hosts, and
    a pod has no file of this machine), its password (in the URL or its query) left out."""
    from sqlalchemy.engine import URL, make_url
    from sqlalchemy.exc import ArgumentError

    from tracetune.tuner.secrets import display_url, is_secret

    try:
        url = make_url(given)
    except ArgumentError:
        raise InputError(f"{flag} {display_url(given)}: not a database URL; write "
                         f"postgresql://USER@HOST:5432/DB") from None
    if url.get_backend_name() != "postgresql":
        raise InputError(f"{flag} {display_url(given)}: a fleet's workers share one PostgreSQL database "
                         f"(SQLite's file locks do not reach across hosts); write postgresql://USER@HOST:5432/DB")
    secret_query = [key for key in url.query if is_secret(key)]
    clean = URL.create(url.drivername, username=url.username, host=url.host, port=url.port, database=url.database,
                       query={k: v for k, v in url.query.items() if k not in secret_query})
    return Storage(clean.render_as_string(hide_password=False), stripped=bool(url.password or secret_query))


def postgres_name(options: FleetOptions) -> str:
    """The database's StatefulSet and Service."""
    return f"{options.name}-postgres"


def postgres_url(options: FleetOptions) -> str:
    """The URL of the database --with-postgres starts (user and database `tracetune`, no password)."""
    where = f".{options.namespace}" if options.namespace else ""
    return f"postgresql://tracetune@{postgres_name(options)}{where}:5432/tracetune"


def secret_command(storage: Storage, options: FleetOptions) -> str:
    """The kubectl command that makes the Secret the workers (and the database) read: the URL and the
    password, the password from the shell's environment so it stays out of the shell's history."""
    namespace = f" -n {options.namespace}" if options.namespace else ""
    password = '"$(openssl rand -hex 24)"' if options.with_postgres else '"$PGPASSWORD"'
    return (f"kubectl create secret generic {options.db_secret}{namespace} "
            f"--from-literal=url={shlex.quote(storage.url)} --from-literal=password={password}")


@dataclasses.dataclass(frozen=True)
class Inputs:
    """Where the pods read the trace (and the search space): `configmap` holds key -> text for the
    ConfigMap (the trace left out when it comes from the claim `trace_pvc`, as the file `trace_key` at
    its root); `why` says which was chosen."""

    trace_key: str
    space_key: str | None
    configmap: dict[str, str]
    trace_pvc: str | None
    trace_bytes: int
    why: str


def configmap_key(path: Path) -> str:
    """A file's name as a ConfigMap key ([-._a-zA-Z0-9], at most 253 characters)."""
    return re.sub(r"[^-._a-zA-Z0-9]", "_", path.name)[:253] or "file"


def configmap_bytes(data: dict[str, str]) -> int:
    """A ConfigMap's size as Kubernetes counts it against its 1 MiB: each key's length and value's bytes."""
    return sum(len(key) + len(value.encode()) for key, value in data.items())


def _text(path: Path, flag: str) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InputError(f"{flag} {path}: no such file") from None
    except UnicodeDecodeError:
        raise InputError(f"{flag} {path}: not UTF-8 text") from None
    except OSError as exc:
        raise InputError(f"{flag} {path}: cannot read it ({exc.strerror})") from None


def place_inputs(trace: Path, space: Path | None, options: FleetOptions) -> Inputs:
    """The trace in the ConfigMap when trace and space fit its 1 MiB, else on --trace-pvc (named by the
    user: an error naming the size when none is); --trace-pvc given, the trace is read from it anyway.
    The search space, small, always travels in the ConfigMap."""
    size = trace.stat().st_size if trace.is_file() else None
    if size is None:
        raise InputError(f"--trace {trace}: no such file")
    space_data = {configmap_key(space): _text(space, "--space")} if space is not None else {}
    trace_key = configmap_key(trace)
    if space is not None and trace_key in space_data:
        space_data = {f"space-{trace_key}": space_data[trace_key]}
    space_key = next(iter(space_data), None)
    mib = f"{size / 2**20:.2f} MiB"
    if options.trace_pvc is not None:  # the file keeps its own name on the claim
        return Inputs(trace.name, space_key, space_data, options.trace_pvc, size,
                      f"claim {options.trace_pvc}, {trace.name} at its root ({mib}, --trace-pvc)")
    data = {trace_key: _text(trace, "--trace"), **space_data}
    used = configmap_bytes(data)
    if used > CONFIGMAP_MAX_BYTES:
        raise InputError(f"--trace {trace} is {mib} ({used:,} bytes with the space) and a ConfigMap holds at most "
                         f"1 MiB ({CONFIGMAP_MAX_BYTES:,} bytes): copy it to a PersistentVolumeClaim the workers "
                         f"can read and name it with --trace-pvc CLAIM (the file {trace_key} at the claim's root)")
    return Inputs(trace_key, space_key, data, None, size,
                  f"ConfigMap {options.name}-inputs ({used:,} of its {CONFIGMAP_MAX_BYTES:,} bytes)")
