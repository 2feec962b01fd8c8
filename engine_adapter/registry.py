"""The engines tracetune can run and measure, by name. Adding an engine is a module that implements
`engine_adapter.base.Engine` (start, health, stream, metrics, stop, log tail, exit code) with a
pydantic model of its settings, its `EngineKind` (`engine_adapter.kind`: the typed parts callers
receive) and one entry in ENGINES; tests/engine_adapter/test_contract.py then checks it like every
other. Imports stay lazy: the engine watchdog (`engine_adapter._guard`) imports
this package and must start instantly, and `tune --help` must stay fast."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, cast

from tracetune.engine_adapter.kind import EngineKind
from tracetune.errors import EngineError, InputError

if TYPE_CHECKING:
    from tracetune.engine_adapter.base import Engine
    from tracetune.engine_adapter.platform import Platform
    from tracetune.engine_adapter.scoring import Scorer

__all__ = ["CPU_CHOICE", "DEFAULT_ENGINE", "ENGINES", "EngineKind", "engine_kind", "make_engine", "scorer"]

# The engine tracetune starts and tunes when none is named.
DEFAULT_ENGINE = "vllm"
# What the main job tunes on a CPU where each of its engines is installed (`tuner.plan.StudyPlan`).
CPU_CHOICE = "vllm+llamacpp"


def _vllm() -> EngineKind:
    from tracetune.engine_adapter.platform import GPU_VLLM_VERSION
    from tracetune.engine_adapter.vllm.deploy import DEPLOYMENT
    from tracetune.engine_adapter.vllm.draft import check_drafts
    from tracetune.engine_adapter.vllm.presets import DEFAULT_LIKE, presets
    from tracetune.engine_adapter.vllm.quantize import quantized_checkpoint
    from tracetune.engine_adapter.vllm.server import VLLMConfig, build_command, make_server, relocated
    from tracetune.engine_adapter.vllm.settings import FLAGS, KNOBS, config_diff
    from tracetune.engine_adapter.vllm.translate import (
        given_api_key,
        prepared,
        reference_config,
        to_engine_config,
        unrunnable_choices,
    )

    return EngineKind("vllm", VLLMConfig, make_server, build_command, translate=to_engine_config,
                      reference=reference_config, unrunnable=unrunnable_choices, knobs=KNOBS, relocate=relocated,
                      label="vLLM", flags=FLAGS, prepare=prepared, check_drafts=check_drafts,
                      make_checkpoint=quantized_checkpoint, api_key_env="VLLM_API_KEY", given_api_key=given_api_key,
                      config_diff=config_diff, image="vllm/vllm-openai", image_version=GPU_VLLM_VERSION,
                      deployment=DEPLOYMENT, slots=lambda c: cast(VLLMConfig, c).max_num_seqs,
                      default_like=DEFAULT_LIKE, presets=presets)


def _llamacpp() -> EngineKind:
    from tracetune.engine_adapter.llamacpp import kind

    return kind()


def _sim() -> EngineKind:
    from tracetune.engine_adapter.sim import kind

    return kind()


def _openai() -> EngineKind:
    from tracetune.engine_adapter.openai_endpoint import OpenAIEndpointConfig

    return EngineKind("openai", OpenAIEndpointConfig, _make_openai, label="OpenAI-compatible endpoint")


def _make_openai(run_dir: Path | None = None, *, platform: Platform | None = None, port: int | None = None,
                 env: Mapping[str, str] | None = None) -> Engine:
    """A running endpoint needs no run directory, platform, port or environment of its own."""
    from tracetune.engine_adapter.openai_endpoint import OpenAIEndpoint

    return OpenAIEndpoint()


# name -> the function that builds its EngineKind
ENGINES: dict[str, Callable[[], EngineKind]] = {"vllm": _vllm, "llamacpp": _llamacpp, "openai": _openai,
                                                 "sim": _sim}
# Engines one study may choose between, trial by trial ("vllm+llamacpp": `engine_adapter.choice`).
CHOICE_SEPARATOR = "+"


def engine_kind(name: str = DEFAULT_ENGINE) -> EngineKind:
    """The registered engine `name` (tracetune's default engine when none is named), or for
    "a+b" the choice between engines a and b, made trial by trial (`engine_adapter.choice`)."""
    if CHOICE_SEPARATOR in name:
        from tracetune.engine_adapter.choice import choice_of

        return choice_of([engine_kind(part) for part in name.split(CHOICE_SEPARATOR)])
    if name not in ENGINES:
        raise InputError(f"unknown engine {name!r}; tracetune knows: {', '.join(sorted(ENGINES))}")
    return ENGINES[name]()


def make_engine(name: str, run_dir: Path | None = None, *, platform: Platform | None = None,
                port: int | None = None) -> Engine:
    """A not yet started engine of kind `name` that logs under `run_dir`."""
    return engine_kind(name).make(run_dir, platform=platform, port=port)


def scorer(name: str) -> Scorer:
    """The scorer of an engine's dialect (`Engine.scoring`, `engine_adapter.scoring`)."""
    from tracetune.engine_adapter.llamacpp.scoring import ForcedTokens
    from tracetune.engine_adapter.scoring import FORCED_TOKENS, PROMPT_LOGPROBS
    from tracetune.engine_adapter.vllm.scoring import PromptLogprobs

    known: dict[str, Scorer] = {PROMPT_LOGPROBS: PromptLogprobs(), FORCED_TOKENS: ForcedTokens()}
    if name not in known:
        raise EngineError(f"no quality scorer for {name!r}; known: {', '.join(known)}")
    return known[name]
