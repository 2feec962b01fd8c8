"""The engine seam as types: what one engine hands the tuner, the search space, the command line
and the exporter (`EngineKind`), each part a typed protocol. Engines register their kind in
`engine_adapter.registry`; callers receive a kind and never name an engine's modules.

Imports stay light (no engine module, no pydantic): the registry imports this module and the engine
watchdog imports the registry."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from pydantic import BaseModel

    from tracetune.engine_adapter.base import Engine
    from tracetune.engine_adapter.platform import Platform

# A bit width's scheme (e.g. "W4A16") -> the directory of a quantized checkpoint made for it.
CheckpointMaker = Callable[[str], Path]
# Categorical choices a platform can never run: {parameter: {choice: reason}}.
Unrunnable = dict[str, dict[Any, str]]


@dataclasses.dataclass(frozen=True)
class Knob:
    """One search-space knob an engine understands: what it sets, and, for a knob its settings
    model never sees (translation consumes it), the only values it takes (None: the model checks)."""

    description: str
    values: tuple[Any, ...] | None = None


# Search-space parameter name -> its knob.
Knobs = Mapping[str, Knob]


class ParamView(Protocol):
    """What an engine reads of one search-space parameter."""

    choices: list[Any] | None
    when: dict[str, list[Any]] | None


class SpaceView(Protocol):
    """What an engine reads of a search space (`search_spaces.space.SearchSpace` meets it)."""

    fixed: dict[str, Any]
    parameters: Mapping[str, ParamView]
    quantized_checkpoints: dict[int, Path]


class EngineFactory(Protocol):
    """A not yet started engine that logs under `run_dir`."""

    def __call__(self, run_dir: Path | None = None, *, platform: Platform | None = None,
                 port: int | None = None) -> Engine: ...


class CommandBuilder(Protocol):
    """The server argv for `config` on `platform` and the environment it needs (on top of the
    parent's); raises errors.InputError when the config cannot run there."""

    def __call__(self, config: Any, platform: Platform, *, host: str = "127.0.0.1", port: int = 8000,
                 python: str = ...) -> tuple[list[str], dict[str, str]]: ...


class Translator(Protocol):
    """Search-space values (on top of `base`, then `fixed`) -> the engine's settings for one trial;
    raises errors.Rejected with every reason the combination cannot run."""

    def __call__(self, values: dict[str, Any], *, fixed: dict[str, Any], platform: Platform, model_dir: Path,
                 quantized_checkpoints: dict[int, Path] | None = None,
                 make_checkpoint: CheckpointMaker | None = None, base: dict[str, Any] | None = None,
                 flags: frozenset[str] | None = None) -> BaseModel: ...


class Relocator(Protocol):
    """`config` with every model path the engine reads (the model, a draft model) replaced by
    `move(path)`, and the served model name kept as measured (exports mount models elsewhere)."""

    def __call__(self, config: Any, move: Callable[[str], str]) -> Any: ...


class ReferenceConfig(Protocol):
    """The engine's own defaults under the fixed settings: the study's quality and speed reference.
    Raises pydantic's ValidationError for fixed settings the engine's settings model refuses."""

    def __call__(self, *, fixed: dict[str, Any], model_dir: Path,
                 base: dict[str, Any] | None = None) -> BaseModel: ...


class UnrunnableCheck(Protocol):
    """The categorical choices of `space` that `platform` can never run, whatever the others are."""

    def __call__(self, space: SpaceView, *, platform: Platform, model_dir: Path,
                 flags: frozenset[str] | None = None, base: dict[str, Any] | None = None) -> Unrunnable: ...


@dataclasses.dataclass(frozen=True)
class EngineKind:
    """One engine: its settings model, how to make one, and, for engines tracetune starts itself,
    the command a configuration runs (for `tune engine command` and exports). Tunable engines also
    give their knob table, the translation of search-space values, their reference config and the
    choices a platform can never run; the others are measured as they are."""

    name: str
    config_model: type
    make: EngineFactory
    command: CommandBuilder | None = None
    translate: Translator | None = None
    reference: ReferenceConfig | None = None
    unrunnable: UnrunnableCheck | None = None
    knobs: Knobs = dataclasses.field(default_factory=dict)
    relocate: Relocator | None = None

    @property
    def tunable(self) -> bool:
        return self.translate is not None
