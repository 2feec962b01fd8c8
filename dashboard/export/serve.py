"""The server a deployment runs: the trial's engine (`exported_engine`; in a study choosing between
engines, the one that ran the trial), its command line for one trial (`serve_spec`), the image and
release it runs in, and what a measurement needed that a deployment must not inherit.

Everything engine-specific comes from the engine's kind: the flags from its command builder
(`EngineKind.command`) for the platform its image runs on, the model paths from `relocate`, the image
and its default release from `image` and `image_version`, and how a deployment runs the server
(program, image entrypoint, tag, what only a measurement set) from `deployment`. What only a CPU
measurement needed is left out for a GPU deployment, saying so. Credential-like settings are
dropped, their names kept."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Mapping
from pathlib import PurePosixPath

from tracetune.dashboard.data import StudyView
from tracetune.dashboard.export.options import ExportOptions
from tracetune.engine_adapter.kind import Deployment, EngineConfig, EngineKind
from tracetune.errors import InputError
from tracetune.tuner.secrets import is_secret, strip_secret_args
from tracetune.types import JsonDict

CONTAINER_MODELS_DIR = "/models"


@dataclasses.dataclass(frozen=True)
class Exported:
    """The engine that ran one trial (`kind`; the study's own, or the one a choice of engines chose),
    how the study reads the trial's stored settings back (`load`), and how a deployment runs it."""

    kind: EngineKind
    load: Callable[[Mapping[str, object]], EngineConfig]
    deployment: Deployment

    @property
    def shown(self) -> str:
        return self.kind.shown


def study_kind(study: StudyView) -> EngineKind:
    """The engine (or choice of engines) the study ran."""
    from tracetune.engine_adapter.registry import engine_kind

    return engine_kind(study.engine) if study.engine else engine_kind()


def exported_engine(study: StudyView, options: ExportOptions, config: Mapping[str, object] | None = None) -> Exported:
    """The engine that ran a trial stored as `config` (none: the study's first engine), refused with
    an InputError (exit 2) when tracetune cannot deploy it: no command line of its own (an endpoint it
    only measures), no deployment, or no image to run."""
    ran = study_kind(study)
    # a choice of engines: the one the trial ran on (its stored settings name it)
    kind = ran.of(ran.load_config(config)) if config is not None and len(ran.engines) > 1 else ran.engines[0]
    if kind.command is None or kind.relocate is None or kind.deployment is None:
        raise InputError(f"study {study.name!r} measured the {kind.shown} engine, which tracetune does not start "
                         f"itself: there is no server command to export")
    if kind.image is None and not options.image:
        raise InputError(f"the {kind.shown} engine names no container image: give one with --image to export "
                         f"study {study.name!r}")
    return Exported(kind, ran.load_config, kind.deployment)


def release(study: StudyView, options: ExportOptions, engine: Exported) -> str:
    """The engine release the export runs: --engine-version, else the one the study measured with where
    it recorded it and the image runs on the platform measured (a CPU study's version says nothing
    about a GPU image), else the release tracetune runs (`EngineKind.image_version`)."""
    if options.engine_version:
        return options.engine_version.lstrip("v")
    if engine.deployment.records_version and study.platform == engine.deployment.platform and study.vllm_version:
        return study.vllm_version
    if engine.kind.image_version is None:
        raise InputError(f"the {engine.shown} engine names no release to deploy: give one with --engine-version")
    return engine.kind.image_version


def image_of(study: StudyView, options: ExportOptions, config: Mapping[str, object] | None = None) -> str | None:
    """--image, else the image (`EngineKind.image`) of the engine that ran `config` (none: the study's
    first engine), tagged with its release as the engine tags images; None when the engine has none."""
    if options.image:
        return options.image
    engine = exported_engine(study, options, config)
    image = engine.kind.image
    return f"{image}:{engine.deployment.tag.format(version=release(study, options, engine))}" if image else None


@dataclasses.dataclass
class ServeSpec:
    """The server for one trial: the arguments after its program (`deployment.program` in a shell,
    `deployment.entrypoint` in its image), environment, and host paths to mount."""

    args: list[str]
    env: dict[str, str]
    mounts: dict[str, str]            # host path -> container path
    dropped: list[str]                # names of secret-looking settings left out
    platform_only: list[str] = dataclasses.field(default_factory=list)  # measuring-platform settings left out
    models: list[str] = dataclasses.field(default_factory=list)  # host model paths (model, draft)
    served_name: str = ""             # the name clients request
    engine: Exported | None = None    # the engine that ran the trial, and how its server is deployed
    remade: list[str] = dataclasses.field(default_factory=list)  # how files tracetune made are made again

    @property
    def deployment(self) -> Deployment | None:
        return None if self.engine is None else self.engine.deployment


def serve_spec(config: JsonDict, options: ExportOptions, *, container: bool, measured_on: str = "cuda",
               engine: Exported) -> ServeSpec:
    """The engine's server for `config` on the platform its image runs on, as the arguments of its
    program (a config `measured_on` the CPU for a GPU image loses what only the CPU needed:
    `Deployment.cpu_only`).

    In a container the model (and a draft model) are mounted at /models/<file or directory name>;
    the served model name stays the one measured, so clients need no change.
    """
    from tracetune.engine_adapter.platform import Platform

    deployment = engine.deployment
    dropped: list[str] = []
    data = json.loads(json.dumps(config))
    data["extra_args"] = strip_secret_args(list(data.get("extra_args") or []), dropped)
    cpu_only = deployment.cpu_only if measured_on == "cpu" and deployment.platform != "cpu" else None
    platform_only = cpu_only(data) if cpu_only is not None else []
    env_in = dict(data.get("env") or {})
    data["env"] = {}
    models: list[str] = []  # every model path the engine reads (the model, a draft model), in its order
    mounts: dict[str, str] = {}

    def mount(host: str) -> str:
        models.append(host)
        if not container:
            return host
        target = str(PurePosixPath(CONTAINER_MODELS_DIR) / PurePosixPath(host.rstrip("/")).name)
        mounts[host] = target
        return target

    measured = engine.load(data)
    assert engine.kind.command is not None and engine.kind.relocate is not None  # `exported_engine` checks
    cfg = engine.kind.relocate(measured, mount)
    host = options.host or ("0.0.0.0" if container else "127.0.0.1")
    argv, env = engine.kind.command(cfg if container else measured, Platform(deployment.platform), host=host,
                                    port=options.port, python="python")
    args = server_args(argv, deployment)
    # The name clients request: the one the command serves, else the model directory's (the engine's default).
    flag = deployment.name_flag
    served_name = args[args.index(flag) + 1] if flag in args else PurePosixPath(models[0].rstrip("/")).name
    out_env = {k: v for k, v in env.items() if k not in deployment.measurement_env}
    for key, value in env_in.items():
        if is_secret(key, value):
            dropped.append(key)
        elif key not in deployment.measurement_env:
            out_env[key] = value
    remade = deployment.remake(measured) if deployment.remake else []
    return ServeSpec(args=args, env=dict(sorted(out_env.items())), mounts=mounts, dropped=dropped,
                     platform_only=platform_only, models=models, served_name=served_name, engine=engine,
                     remade=remade)


def server_args(argv: list[str], deployment: Deployment) -> list[str]:
    """The command builder's argv as the deployed program's arguments: its launcher and the flags only a
    measurement passes left out, the model first where the program takes it positionally."""
    rest, args = argv[deployment.launcher:], []
    i = 0
    while i < len(rest):
        skip = deployment.measurement_args.get(rest[i])
        if skip is None:
            args.append(rest[i])
        i += 1 + (skip or 0)
    flag = deployment.positional_model
    if flag is None:
        return args
    i = args.index(flag)
    model = args[i + 1]
    if model.startswith("-"):  # a relative path that would read as a flag
        model = "./" + model
    return [model, *args[:i], *args[i + 2:]]
