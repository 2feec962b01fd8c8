"""The engines tracetune can run and measure, by name. Adding an engine is a module that implements
`engine_adapter.base.Engine` (start, health, stream, metrics, stop, log tail, exit code) with a
pydantic model of its settings, and one entry in ENGINES; tests/engine_adapter/test_contract.py then
checks it like every other. Imports stay lazy: the engine watchdog (`engine_adapter._guard`) imports
this package and must start instantly, and `tune --help` must stay fast."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Callable

from tracetune.engine_adapter.base import Engine
from tracetune.errors import InputError


@dataclasses.dataclass(frozen=True)
class EngineKind:
    """One engine: its settings model, how to make one (not yet started) that logs under a run
    directory, and, for engines tracetune starts itself, the command a configuration runs (for
    `tune engine command` and exports). Only those can be tuned: the others are measured as they are."""

    name: str
    config_model: type
    make: Callable[..., Engine]  # make(run_dir, *, platform=None, port=None)
    command: Callable[..., tuple[list[str], dict[str, str]]] | None = None  # command(config, platform, *, host, port)
    # Search-space values -> settings (raises errors.Rejected with the reasons a combination cannot run):
    # translate(values, *, fixed, platform, model_dir, make_checkpoint, base)
    translate: Callable[..., Any] | None = None
    reference: Callable[..., Any] | None = None  # the engine's defaults: reference(*, fixed, model_dir, base)
    unrunnable: Callable[..., dict] | None = None  # choices a platform can never run: unrunnable(space, *, platform, ...)

    @property
    def tunable(self) -> bool:
        return self.translate is not None


def _vllm() -> EngineKind:
    from tracetune.engine_adapter.vllm.server import VLLMConfig, VLLMServer, build_command
    from tracetune.engine_adapter.vllm.translate import reference_config, to_engine_config, unrunnable_choices

    return EngineKind("vllm", VLLMConfig, VLLMServer, build_command, translate=to_engine_config,
                      reference=reference_config, unrunnable=unrunnable_choices)


def _openai() -> EngineKind:
    from tracetune.engine_adapter.openai_endpoint import OpenAIEndpoint, OpenAIEndpointConfig

    return EngineKind("openai", OpenAIEndpointConfig, lambda run_dir=None, **_: OpenAIEndpoint())


# name -> the function that builds its EngineKind
ENGINES: dict[str, Callable[[], EngineKind]] = {"vllm": _vllm, "openai": _openai}


def engine_kind(name: str = "vllm") -> EngineKind:
    if name not in ENGINES:
        raise InputError(f"unknown engine {name!r}; tracetune knows: {', '.join(sorted(ENGINES))}")
    return ENGINES[name]()


def make_engine(name: str, run_dir: Path | None = None, **kwargs: Any) -> Engine:
    """A not yet started engine of kind `name` that logs under `run_dir`."""
    return engine_kind(name).make(run_dir, **kwargs)
