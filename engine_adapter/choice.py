"""A choice of engines made trial by trial (`engine_kind("vllm+llamacpp")`): one `EngineKind` whose
search-space knob `engine` picks the engine each configuration runs on, beside every engine's own
knobs. The first engine is the study's reference (vLLM's defaults stay THE reference); what is
per configuration (its command, translation, settings read back, diff, draft check) goes to the engine
the configuration names (`EngineChoice.of`), and the engine it makes starts the right server for
each configuration it is given.

Settings each engine understands: search-space values and fixed settings by its knob table, command
line settings (`base`) by its settings model's fields; a knob two engines share is one knob."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Unpack

from tracetune.engine_adapter.kind import (
    CheckpointMaker,
    EngineConfig,
    EngineFlag,
    EngineKind,
    Knob,
    ParamView,
    Progress,
    SpaceView,
    Unrunnable,
)
from tracetune.errors import EngineError, InputError
from tracetune.types import Scalar

if TYPE_CHECKING:
    from tracetune.engine_adapter.base import Endpoint, Engine, OnTick, StartPhases
    from tracetune.engine_adapter.http_stream import Session
    from tracetune.engine_adapter.metrics import EngineMetrics
    from tracetune.engine_adapter.openai_client import StreamedCompletion, StreamRequest
    from tracetune.engine_adapter.platform import Platform

# The search-space parameter (and stored config field) naming the engine a configuration runs on.
ENGINE = "engine"
# A checkpoint scheme for one engine of a choice, as the choice's `make_checkpoint` takes it: "llamacpp:Q8_0".
SCHEME_SEPARATOR = ":"


@dataclasses.dataclass(frozen=True)
class EngineChoice(EngineKind):
    """A choice between `kinds` (the first: the reference engine), made by the `engine` knob."""

    kinds: tuple[EngineKind, ...] = ()

    @property
    def engines(self) -> tuple[EngineKind, ...]:
        return self.kinds

    def named(self, name: object) -> EngineKind:
        """The engine of the choice called `name`; an InputError naming the choices otherwise."""
        return _named(self.kinds, name)

    def of(self, config: EngineConfig) -> EngineKind:
        return _of(self.kinds, config)

    def load_config(self, data: Mapping[str, object]) -> EngineConfig:
        """Stored settings read back as the settings of the engine they name (`engine`; none: the first)."""
        kind = self.named(data.get(ENGINE, self.kinds[0].name))
        return kind.load_config(_for_model(kind, data))


def _named(kinds: Sequence[EngineKind], name: object) -> EngineKind:
    for kind in kinds:
        if kind.name == name:
            return kind
    raise InputError(f"engine {name!r} is not one of the engines chosen from: {', '.join(k.name for k in kinds)}")


def _of(kinds: Sequence[EngineKind], config: EngineConfig) -> EngineKind:
    for kind in kinds:
        if isinstance(config, kind.config_model):
            return kind
    raise TypeError(f"a choice of engines was handed {type(config).__name__}, the settings of none of them")


def _for_model(kind: EngineKind, data: Mapping[str, object]) -> dict[str, object]:
    """`data` without the `engine` field where the engine's settings model has none (vLLM's)."""
    return {k: v for k, v in data.items() if k != ENGINE or ENGINE in kind.config_model.model_fields}


def own_settings(kind: EngineKind, settings: Mapping[str, object] | None) -> dict[str, object]:
    """The search-space settings (values, fixed) of `settings` that `kind` understands: its knobs."""
    return {k: v for k, v in (settings or {}).items() if k in kind.knobs}


def own_fields(kind: EngineKind, settings: Mapping[str, object] | None) -> dict[str, object]:
    """The command-line settings (`base`) of `settings` that `kind`'s settings model has."""
    return {k: v for k, v in (settings or {}).items() if k in kind.config_model.model_fields and k != ENGINE}


def choice_of(kinds: Sequence[EngineKind]) -> EngineChoice:
    """The choice between `kinds`, trial by trial; the first is the reference engine. An engine named
    twice, one that cannot be tuned, or a knob two engines define differently is an InputError."""
    kinds = tuple(kinds)
    names = [k.name for k in kinds]
    if len(kinds) < 2 or len(set(names)) != len(names):
        raise InputError(f"a choice of engines names two or more different engines, got {'+'.join(names)!r}")
    if untunable := [k.shown for k in kinds if not k.tunable]:
        raise InputError(f"{', '.join(untunable)} cannot be tuned, so it cannot be one of a choice of engines")
    first = kinds[0]
    parts = _Parts(kinds)
    return EngineChoice(
        name="+".join(names), config_model=first.config_model, make=parts.make, command=parts.command,
        translate=parts.translate, reference=parts.reference, unrunnable=parts.unrunnable, knobs=_knobs(kinds),
        relocate=parts.relocate, label=" or ".join(k.shown for k in kinds), flags=_flags(kinds),
        prepare=parts.prepare, check_drafts=parts.check_drafts, make_checkpoint=parts.make_checkpoint,
        api_key_env=first.api_key_env, given_api_key=parts.given_api_key, config_diff=parts.config_diff,
        image=first.image, image_version=first.image_version, kinds=kinds)


def _knobs(kinds: Sequence[EngineKind]) -> dict[str, Knob]:
    """`engine` and every engine's knobs, each marked with the engines that understand it. A name two
    engines share is one knob: both list the same values, or one leaves them to its settings model."""
    out: dict[str, Knob] = {ENGINE: Knob("the serving engine", tuple(k.name for k in kinds))}
    for kind in kinds:
        for name, knob in kind.knobs.items():
            if name == ENGINE:
                raise InputError(f"{kind.shown} has a knob called {ENGINE!r}, the one a choice of engines uses")
            known = out.get(name)
            if known is None:
                out[name] = dataclasses.replace(knob, engines=(kind.name,))
            elif None not in (known.values, knob.values) and known.values != knob.values:
                raise InputError(f"knob {name!r} means different things to {', '.join(known.engines)} "
                                 f"(values {known.values}) and {kind.shown} (values {knob.values}); one name, one knob")
            else:  # where one engine's settings model checks the values, the space does not
                values = None if None in (known.values, knob.values) else known.values
                out[name] = dataclasses.replace(known, values=values, engines=(*known.engines, kind.name))
    return out


def _flags(kinds: Sequence[EngineKind]) -> tuple[EngineFlag, ...]:
    """Every engine's flags, a flag string two engines declare listed once (the first engine's)."""
    seen: dict[str, EngineFlag] = {}
    for kind in kinds:
        for flag in kind.flags:
            seen.setdefault(flag.flag, flag)
    return tuple(seen.values())


@dataclasses.dataclass(frozen=True)
class _SpaceOf:
    """What one engine of a choice sees of a space: the parameters that exist for it (their `engine`
    condition dropped) and the fixed settings it understands."""

    fixed: Mapping[str, object]
    parameters: Mapping[str, ParamView]
    quantized_checkpoints: Mapping[int, Path]


def _space_of(space: SpaceView, kind: EngineKind) -> _SpaceOf:
    params: dict[str, ParamView] = {}
    engine_fixed = space.fixed.get(ENGINE)
    for name, param in space.parameters.items():
        when = dict(param.when or {})
        allowed = when.pop(ENGINE, None)
        if name == ENGINE or name not in kind.knobs or (allowed is not None and kind.name not in allowed):
            continue
        if engine_fixed is not None and engine_fixed != kind.name:
            continue
        params[name] = _without_engine_condition(param, when)
    return _SpaceOf(own_settings(kind, space.fixed), params, space.quantized_checkpoints)


def _without_engine_condition(param: ParamView, when: Mapping[str, Sequence[Scalar]]) -> ParamView:
    copy = getattr(param, "model_copy", None)  # a search space's own parameter (pydantic): everything else kept
    if copy is not None:
        view: ParamView = copy(update={"when": dict(when) or None})
        return view
    return _Param(param.choices, dict(when) or None)


@dataclasses.dataclass(frozen=True)
class _Param:
    choices: Sequence[Scalar] | None
    when: Mapping[str, Sequence[Scalar]] | None


class _Parts:
    """The choice's parts, each sending a configuration to the engine it names."""

    def __init__(self, kinds: tuple[EngineKind, ...]) -> None:
        self.kinds = kinds
        self.first = kinds[0]

    def _named(self, name: object) -> EngineKind:
        return _named(self.kinds, name)

    def _of(self, config: EngineConfig) -> EngineKind:
        return _of(self.kinds, config)

    def make(self, run_dir: Path | None = None, *, platform: Platform | None = None,
             port: int | None = None, env: Mapping[str, str] | None = None) -> Engine:
        return ChosenEngine(self._of, run_dir, platform=platform, port=port, env=env)

    def command(self, config: EngineConfig, platform: Platform, *, host: str = "127.0.0.1", port: int = 8000,
                python: str | None = None) -> tuple[list[str], dict[str, str]]:
        kind = self._of(config)
        if kind.command is None:
            raise InputError(f"{kind.shown} runs no command of tracetune's")
        if python is None:  # the engine's own default interpreter
            return kind.command(config, platform, host=host, port=port)
        return kind.command(config, platform, host=host, port=port, python=python)

    def translate(self, values: Mapping[str, object], *, fixed: Mapping[str, object], platform: Platform,
                  model_dir: Path, quantized_checkpoints: Mapping[int, Path] | None = None,
                  make_checkpoint: CheckpointMaker | None = None, base: Mapping[str, object] | None = None,
                  flags: frozenset[str] | None = None) -> EngineConfig:
        """`values` translated by the engine they name (`engine`, else the fixed one, else the first)."""
        kind = self._named(values.get(ENGINE, fixed.get(ENGINE, self.first.name)))
        assert kind.translate is not None, "every engine of a choice is tunable (choice_of checks)"
        maker = None if make_checkpoint is None or kind is self.first else \
            (lambda scheme: make_checkpoint(f"{kind.name}{SCHEME_SEPARATOR}{scheme}"))
        return kind.translate(own_settings(kind, values), fixed=own_settings(kind, fixed), platform=platform,
                              model_dir=model_dir, quantized_checkpoints=quantized_checkpoints,
                              make_checkpoint=maker or make_checkpoint, base=own_fields(kind, base), flags=flags)

    def reference(self, *, fixed: Mapping[str, object], model_dir: Path,
                  base: Mapping[str, object] | None = None) -> EngineConfig:
        """The first engine's defaults: the study's one reference."""
        return defaults_of(self.first, fixed=fixed, model_dir=model_dir, base=base)

    def unrunnable(self, space: SpaceView, *, platform: Platform, model_dir: Path,
                   flags: frozenset[str] | None = None, base: Mapping[str, object] | None = None) -> Unrunnable:
        """Engines this machine cannot run (`EngineKind.available`), and each engine's choices it can
        never run, where the parameter exists for that engine alone (a choice another engine runs stays)."""
        out: Unrunnable = {}
        offered = _offered(space)
        for kind in self.kinds:
            if kind.name in offered and (why := kind.missing()):
                out.setdefault(ENGINE, {})[kind.name] = why
        runnable = [k for k in self.kinds if k.name in offered and k.name not in out.get(ENGINE, {})]
        views = {k.name: _space_of(space, k) for k in runnable}
        found = {k.name: (k.unrunnable(views[k.name], platform=platform, model_dir=model_dir, flags=flags,
                                       base=own_fields(k, base)) if k.unrunnable else {}) for k in runnable}
        for name, param in space.parameters.items():
            judged = [k for k in runnable if name in views[k.name].parameters]
            for choice in param.choices or []:
                reasons = [found[k.name].get(name, {}).get(choice) for k in judged]
                if judged and all(reasons):
                    out.setdefault(name, {})[choice] = "; ".join(dict.fromkeys(r for r in reasons if r))
        return out

    def relocate(self, config: EngineConfig, move: Callable[[str], str]) -> EngineConfig:
        kind = self._of(config)
        if kind.relocate is None:
            raise InputError(f"{kind.shown} has no model paths tracetune can move")
        return kind.relocate(config, move)

    def prepare(self, config: EngineConfig, progress: Progress) -> EngineConfig:
        kind = self._of(config)
        return config if kind.prepare is None else kind.prepare(config, progress)

    def check_drafts(self, model_dir: Path, drafts: Iterable[str | Path]) -> None:
        """Every draft checked by each engine that searches draft models."""
        drafts = list(drafts)
        for kind in self.kinds:
            if kind.check_drafts is not None and "draft_model" in kind.knobs:
                kind.check_drafts(model_dir, drafts)

    def make_checkpoint(self, model_dir: Path, scheme: str, progress: Progress) -> Path:
        """The checkpoint `scheme` names: "llamacpp:Q8_0" one of that engine's, a bare scheme the first's."""
        name, sep, rest = scheme.partition(SCHEME_SEPARATOR)
        named = next((k for k in self.kinds if sep and k.name == name), None)
        kind, scheme = (named, rest) if named is not None else (self.first, scheme)
        if kind.make_checkpoint is None:
            raise InputError(f"{kind.shown} makes no checkpoints ({scheme})")
        return kind.make_checkpoint(model_dir, scheme, progress)

    def given_api_key(self, config: EngineConfig) -> str | None:
        kind = self._of(config)
        return None if kind.given_api_key is None else kind.given_api_key(config)

    def config_diff(self, config: Mapping[str, object], reference: Mapping[str, object]) -> dict[str, object]:
        """How `config` reads against `reference`: its engine's own diff on the same engine; on another,
        `engine` and its diff against that engine's own defaults."""
        kind = self._named(config.get(ENGINE, self.first.name))
        if kind.name == reference.get(ENGINE, self.first.name):
            return kind.config_diff(config, reference)
        return {ENGINE: kind.name, **kind.config_diff(config, stored_defaults(kind, config))}


def defaults_of(kind: EngineKind, *, fixed: Mapping[str, object], model_dir: Path,
                base: Mapping[str, object] | None = None) -> EngineConfig:
    """`kind`'s own defaults under the fixed and command-line settings it understands."""
    assert kind.reference is not None, "every engine of a choice is tunable (choice_of checks)"
    return kind.reference(fixed=own_settings(kind, fixed), model_dir=model_dir, base=own_fields(kind, base))


def stored_defaults(kind: EngineKind, config: Mapping[str, object]) -> dict[str, object]:
    """`kind`'s defaults on the model `config` names, as stored JSON (what its diff compares against)."""
    data = {k: v for k, v in config.items() if k in ("model", ENGINE)}
    try:
        defaults: dict[str, object] = json.loads(kind.load_config(data).model_dump_json())
    except Exception:  # pydantic's ValidationError: settings without a model of this engine's shape
        return {}
    return defaults


def _offered(space: SpaceView) -> set[object]:
    """The engines a space offers: its `engine` parameter's choices, or its fixed engine."""
    param = space.parameters.get(ENGINE)
    if param is not None:
        return set(param.choices or ())
    return {space.fixed[ENGINE]} if ENGINE in space.fixed else set()


class ChosenEngine:
    """An engine of a choice, made when a configuration is given: it starts the engine the
    configuration names, and everything else goes to the one running (before any start: nothing)."""

    managed = True

    def __init__(self, kind_of: Callable[[EngineConfig], EngineKind], run_dir: Path | None = None, *,
                 platform: Platform | None = None, port: int | None = None,
                 env: Mapping[str, str] | None = None) -> None:
        self._kind_of, self._run_dir, self._platform, self._port = kind_of, run_dir, platform, port
        self._env = env
        self.running: Engine | None = None
        self.name = "engine"  # the running engine's, once one is made
        self.quality_probe = False
        self.scoring = "prompt_logprobs"

    def _for(self, config: EngineConfig) -> Engine:
        """The engine `config` runs on, made now (one already running is stopped first)."""
        self.stop()
        self.running = self._kind_of(config).make(self._run_dir, platform=self._platform, port=self._port,
                                                  env=self._env)
        self.name, self.quality_probe = self.running.name, self.running.quality_probe
        self.scoring = self.running.scoring
        return self.running

    def _started(self) -> Engine:
        if self.running is None:
            raise EngineError("the engine is not started; call start() first")
        return self.running

    @property
    def endpoint(self) -> Endpoint | None:
        return None if self.running is None else self.running.endpoint

    @endpoint.setter
    def endpoint(self, value: Endpoint | None) -> None:
        self._started().endpoint = value

    def start(self, config: EngineConfig) -> Endpoint:
        return self._for(config).start(config)

    def launch(self, config: EngineConfig, timeout_s: float, on_tick: OnTick | None = None) -> float:
        return self._for(config).launch(config, timeout_s, on_tick)

    def wait_healthy(self, timeout_s: float, on_tick: OnTick | None = None) -> float:
        return self._started().wait_healthy(timeout_s, on_tick)

    def health(self) -> bool:
        return self.running is not None and self.running.health()

    def log_tail(self) -> str:
        return "" if self.running is None else self.running.log_tail()

    @property
    def log_path(self) -> Path | None:
        return None if self.running is None else self.running.log_path

    def start_phases(self) -> StartPhases:
        return {} if self.running is None else self.running.start_phases()

    def exit_code(self) -> int | None:
        return None if self.running is None else self.running.exit_code()

    def process_group(self) -> int | None:
        return None if self.running is None else self.running.process_group()

    async def stream(self, session: Session, **request: Unpack[StreamRequest]) -> StreamedCompletion:
        return await self._started().stream(session, **request)

    def metrics(self) -> EngineMetrics:
        return self._started().metrics()

    def reset_prefix_cache(self) -> None:
        self._started().reset_prefix_cache()

    def stop(self) -> None:
        if self.running is not None:
            self.running.stop()
