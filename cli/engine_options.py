"""Command-line flags for engine settings, shared by every `tune` subcommand that starts an engine.
The engine describes its flags (`EngineKind.flags`, e.g. `engine_adapter/vllm/settings.py`); this
module turns them into argparse options and parsed flags back into the engine's settings."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, cast

from tracetune.cli.options import default_of, positive_float
from tracetune.errors import InputError

if TYPE_CHECKING:
    from pydantic import ValidationError

    from tracetune.engine_adapter.kind import EngineConfig, EngineFlag, EngineKind, FlagValue, Progress

# How each kind of flag value is read (argparse keywords; "help", "metavar", "choices" and "default"
# come from the flag).
_READ: dict[FlagValue, dict[str, object]] = {
    "text": {}, "int": {"type": int}, "float": {"type": float}, "positive": {"type": positive_float},
    "toggle": {"action": argparse.BooleanOptionalAction}, "many": {"action": "append", "default": []},
    "pairs": {"action": "append", "default": []}, "drafts": {"action": "append"},
}


def _kind(kind: EngineKind | None) -> EngineKind:
    from tracetune.engine_adapter.registry import engine_kind

    return engine_kind() if kind is None else kind


def _keywords(flag: EngineFlag) -> dict[str, object]:
    keywords = dict(_READ[flag.value])
    for name in ("metavar", "help", "choices", "default"):
        if getattr(flag, name) is not None:
            keywords[name] = list(flag.choices or ()) if name == "choices" else getattr(flag, name)
    return keywords


def add_engine_options(parser: argparse.ArgumentParser, kind: EngineKind | None = None) -> None:
    """`kind`'s flags (default: tracetune's default engine) and `--start-timeout`, as one group."""
    from tracetune.tuner.settings import StudySettings

    kind = _kind(kind)
    g = parser.add_argument_group(f"engine ({kind.shown}) settings; unset ones keep {kind.shown}'s defaults")
    for flag in kind.flags:
        g.add_argument(flag.flag, **_keywords(flag))  # type: ignore[arg-type]
    timeout = default_of(StudySettings, "start_timeout_s")
    g.add_argument("--start-timeout", type=positive_float, default=timeout, metavar="S",
                   help=f"seconds to wait for the server to become healthy (default {timeout:.0f})")


def _parse_env(items: list[str]) -> dict[str, str]:
    env = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise InputError(f"--engine-env expects KEY=VALUE, got {item!r}")
        env[key] = value
    return env


def flag_of_field(flags: Sequence[EngineFlag]) -> dict[str, str]:
    """Settings field -> the flag that sets it, so validation errors name what the user typed; a
    nested model's own errors name the first flag inside it."""
    out: dict[str, str] = {}
    for flag in flags:
        out[flag.field] = flag.flag
        out.setdefault(flag.field.split(".")[0], flag.flag)
    return out


def validation_message(exc: ValidationError, flag_of_field: dict[str, str]) -> str:
    lines = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err["loc"])
        where = flag_of_field.get(loc) or flag_of_field.get(loc.split(".")[0]) or loc or "engine settings"
        lines.append(f"{where}: {err['msg']}")
    return "Invalid engine settings:\n  " + "\n  ".join(lines)


def _value(flag: EngineFlag, value: object) -> object:
    """A parsed flag's value as its settings field takes it."""
    if flag.value == "pairs":
        return _parse_env(cast("list[str]", value))
    if flag.value == "drafts" and isinstance(value, list) and value:
        if len(value) > 1:
            raise InputError(f"{flag.flag} is given {len(value)} times: one engine serves one draft model "
                             f"(the main job, tune --trace, searches several)")
        return value[0]
    return value


def engine_config_from_args(args: argparse.Namespace, model_dir: Path, kind: EngineKind | None = None) -> EngineConfig:
    """Build and validate `kind`'s settings from its parsed flags; errors name the flag."""
    from pydantic import ValidationError

    kind = _kind(kind)
    fields: dict[str, object] = {"model": model_dir}
    for flag in kind.flags:
        if flag.field == "model":
            continue
        value = _value(flag, getattr(args, flag.dest))
        *parents, name = flag.field.split(".")
        target = fields
        for parent in parents:
            target = cast("dict[str, object]", target.setdefault(parent, {}))
        if value is not None or not parents:
            target[name] = value
    try:
        return kind.load_config(fields)
    except ValidationError as exc:
        raise InputError(validation_message(exc, flag_of_field(kind.flags))) from None


def resolve_engine_config(args: argparse.Namespace, progress: Progress = lambda message: None,
                          kind: EngineKind | None = None) -> EngineConfig:
    """The settings the flags describe, on the model they name (the bundled default if none), made
    ready to start (`EngineKind.prepare`: a draft model checked, a derived one made). The flags are
    checked first: a bad one is an error before any model is prepared."""
    from tracetune.engine_adapter.models import resolve_model

    kind = _kind(kind)
    engine_config_from_args(args, Path(args.model or "."), kind)
    config = engine_config_from_args(args, resolve_model(args.model, progress), kind)
    return config if kind.prepare is None else kind.prepare(config, progress)


def without_drafts(args: argparse.Namespace, kind: EngineKind | None = None) -> argparse.Namespace:
    """`args` with no draft models given: the main job's base settings, which search the drafts instead."""
    return argparse.Namespace(**{**vars(args), **{f.dest: None for f in _kind(kind).flags if f.value == "drafts"}})


def drafts_given(args: argparse.Namespace, kind: EngineKind | None = None) -> list[str]:
    """The draft models the flags name (repeatable), for the main job to search."""
    return [d for f in _kind(kind).flags if f.value == "drafts" for d in getattr(args, f.dest) or []]



def passed_through(args: argparse.Namespace, kind: EngineKind | None = None) -> tuple[dict[str, str], list[str]]:
    """The environment and the arguments the flags hand the server verbatim (`--engine-env`,
    `--engine-arg`): where a key or a token given to the engine would be."""
    env: dict[str, str] = {}
    extra: list[str] = []
    for flag in _kind(kind).flags:
        if flag.value == "pairs":
            env.update(_parse_env(getattr(args, flag.dest) or []))
        elif flag.value == "many":
            extra += getattr(args, flag.dest) or []
    return env, extra
