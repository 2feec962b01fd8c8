"""Command-line flags for engine settings, shared by every `tune` subcommand that starts an engine.
The engine describes its flags (`EngineKind.flags`, e.g. `engine_adapter/vllm/settings.py`); this
module turns them into argparse options and parsed flags back into the engine's settings."""

from __future__ import annotations

import argparse
import os
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
    "toggle": {"action": argparse.BooleanOptionalAction}, "many": {"action": argparse._AppendAction, "default": []},
    "pairs": {"action": argparse._AppendAction, "default": []}, "drafts": {"action": argparse._AppendAction},
}


# Flags of different engines that set the same thing: the error for a flag the chosen engine does not
# understand names its equivalent there.
SAME_SETTING: tuple[frozenset[str], ...] = (
    frozenset({"--max-num-seqs", "--parallel"}),
    frozenset({"--max-num-batched-tokens", "--batch-size"}),
    frozenset({"--kv-cache-dtype", "--cache-type-k"}),
    frozenset({"--num-speculative-tokens", "--draft-max"}),
    frozenset({"--max-model-len", "--ctx-size"}),
    frozenset({"--quantization", "--weights"}),
)
# Where the parsed namespace keeps the engine flags given on the command line (their dests).
GIVEN = "engine_flags_given"


def _kind(kind: EngineKind | None) -> EngineKind:
    from tracetune.engine_adapter.registry import engine_kind

    return engine_kind() if kind is None else kind


def started_engines() -> list[EngineKind]:
    """Every engine tracetune starts itself (it has a command), in the registry's order (vLLM first)."""
    from tracetune.engine_adapter.registry import ENGINES, engine_kind

    return [kind for kind in map(engine_kind, ENGINES) if kind.command is not None]


def engines_shown() -> str:
    """The engines tracetune starts as `--help` lists them: each name, with what it is where its label says
    more than its name ("vllm, llamacpp or sim (simulated engine (for tests and benchmarks))")."""
    names = [kind.name if kind.shown.lower().replace(".", "") == kind.name else f"{kind.name} ({kind.shown})"
             for kind in started_engines()]
    return " or ".join(names) if len(names) < 3 else f"{', '.join(names[:-1])} or {names[-1]}"


def chosen_engine(args: argparse.Namespace) -> EngineKind:
    """The engine the command's --engine names (tracetune's default engine when none is given)."""
    from tracetune.engine_adapter.registry import engine_kind

    name = getattr(args, "engine", None)
    return engine_kind() if name is None else engine_kind(name)


def engine_name(text: str) -> str:
    """--engine of the main job: a registered engine, or engines joined by "+" (a choice, trial by trial)."""
    from tracetune.engine_adapter.registry import CHOICE_SEPARATOR, ENGINES

    parts = text.split(CHOICE_SEPARATOR)
    if unknown := [p for p in parts if p not in ENGINES]:
        raise argparse.ArgumentTypeError(f"unknown engine {unknown[0]!r}: choose {', '.join(ENGINES)}, or engines "
                                         f"joined by {CHOICE_SEPARATOR} (e.g. vllm+llamacpp)")
    return text


def add_engine_choice(parser: argparse.ArgumentParser | argparse._MutuallyExclusiveGroup) -> None:
    """--engine: which engine tracetune starts (one it starts itself)."""
    from tracetune.engine_adapter.registry import DEFAULT_ENGINE

    names = [kind.name for kind in started_engines()]
    parser.add_argument("--engine", choices=names, default=None,
                        help=f"start this engine: {engines_shown()} (default: {DEFAULT_ENGINE})")


def _keywords(flag: EngineFlag) -> dict[str, object]:
    keywords = dict(_READ[flag.value])
    for name in ("metavar", "help", "choices", "default"):
        if getattr(flag, name) is not None:
            keywords[name] = list(flag.choices or ()) if name == "choices" else getattr(flag, name)
    keywords["action"] = _marking(cast("type[argparse.Action]", keywords.get("action", argparse._StoreAction)))
    return keywords


def _marking(base: type[argparse.Action]) -> type[argparse.Action]:
    """The argparse action `base` also noting, in the namespace, that its flag was given."""

    class Given(base):  # type: ignore[valid-type, misc]
        def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: object,
                     option_string: str | None = None) -> None:
            super().__call__(parser, namespace, values, option_string)
            setattr(namespace, GIVEN, {*(getattr(namespace, GIVEN, None) or ()), self.dest})

    return Given


def add_engine_options(parser: argparse.ArgumentParser, kind: EngineKind | None = None) -> None:
    """Every engine's flags, one group per engine (`kind` alone when given), and `--start-timeout`. A
    flag string two engines declare is one option (the first engine's, its choices those of both)."""
    from tracetune.tuner.settings import StudySettings

    added: dict[str, argparse.Action] = {}
    for i, engine in enumerate([kind] if kind is not None else started_engines()):
        g = parser.add_argument_group(f"engine ({engine.shown}) settings",
                                      f"unset ones keep {engine.defaults_label}")
        for flag in engine.flags:
            if flag.flag in added:
                _join(added[flag.flag], flag, engine)
                continue
            added[flag.flag] = g.add_argument(flag.flag, **_keywords(flag))  # type: ignore[arg-type]
        if i == 0:
            timeout = default_of(StudySettings, "start_timeout_s")
            g.add_argument("--start-timeout", type=positive_float, default=timeout, metavar="S",
                           help=f"seconds to wait for the server to become healthy (default {timeout:.0f})")


def _join(action: argparse.Action, flag: EngineFlag, engine: EngineKind) -> None:
    """A shared flag takes the choices of every engine declaring it (each engine's settings check its own)
    and says what it means to each where they describe it differently."""
    if action.choices is not None and flag.choices is not None:
        action.choices = [*action.choices, *(c for c in flag.choices if c not in action.choices)]
    if flag.help and action.help and flag.help != action.help:
        action.help = f"{action.help}. {engine.shown}: {flag.help}"


def given_flags(args: argparse.Namespace, kind: EngineKind) -> list[EngineFlag]:
    """`kind`'s flags given on the command line (in a namespace argparse did not fill: those not at their
    default)."""
    given = getattr(args, GIVEN, None)
    if given is not None:
        return [f for f in kind.flags if f.dest in given]
    unset: dict[str, object] = {"many": [], "pairs": [], "drafts": None}
    return [f for f in kind.flags
            if getattr(args, f.dest, None) not in (None, unset.get(f.value, f.default), f.default)]


def check_engine_flags(args: argparse.Namespace, kind: EngineKind) -> None:
    """An InputError for a flag given that only another engine understands, naming that engine and the
    flag of `kind` that sets the same thing (where there is one)."""
    own = {f.flag for engine in kind.engines for f in engine.flags}
    for other in started_engines():
        for flag in given_flags(args, other):
            if flag.flag in own:
                continue
            same = [f for group in SAME_SETTING if flag.flag in group for f in sorted(group) if f in own]
            instead = f"; {kind.shown}'s equivalent is {same[0]}" if same else ""
            raise InputError(f"{flag.flag} is a {other.shown} setting, and this runs {kind.shown}, which does not "
                             f"understand it{instead} (--engine {other.name} runs {other.shown})")


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
    # A flag string another engine declares repeatable (vLLM's --draft-model) reads as one value here.
    one = flag.value == "drafts" or flag.value in ("text", "int", "float", "positive")
    if one and isinstance(value, list) and value:
        if len(value) > 1:
            raise InputError(f"{flag.flag} is given {len(value)} times: one engine serves one draft model "
                             f"(the main job, tune --trace, searches several)")
        return value[0]
    return value


def engine_config_from_args(args: argparse.Namespace, model_dir: Path, kind: EngineKind | None = None, *,
                            chosen: EngineKind | None = None) -> EngineConfig:
    """Build and validate `kind`'s settings from its parsed flags; errors name the flag. A flag given that
    only an engine other than `chosen` (default: `kind`) understands is an InputError, and so is a flag
    naming the trace file, or a file or value the engine refuses (`EngineKind.check_given`)."""
    from pydantic import ValidationError

    kind = _kind(kind)
    check_engine_flags(args, chosen or kind)
    given = given_flags(args, kind)
    _not_the_trace(args, given)
    fields: dict[str, object] = {"model": model_dir}
    for flag in kind.flags:
        if flag.field == "model":
            continue
        value = _value(flag, getattr(args, flag.dest))
        *parents, name = flag.field.split(".")
        target = fields
        for parent in parents:
            target = cast("dict[str, object]", target.setdefault(parent, {}))
        if value is not None:  # a flag left out: the engine's own default for its field
            target[name] = value
    try:
        config = kind.load_config(fields)
    except ValidationError as exc:
        raise InputError(validation_message(exc, flag_of_field(kind.flags))) from None
    if kind.check_given is not None:
        kind.check_given(config, frozenset(f.field for f in given))
    return config


def _not_the_trace(args: argparse.Namespace, given: list[EngineFlag]) -> None:
    """An InputError for an engine flag given the trace file (`--gguf traffic.jsonl`)."""
    trace = getattr(args, "trace", None)
    if trace is None or not Path(trace).is_file():
        return
    for flag in given:
        value = getattr(args, flag.dest, None)
        for one in value if isinstance(value, list) else [value]:
            if isinstance(one, str) and Path(one).is_file() and Path(one).samefile(trace):
                raise InputError(f"{flag.flag} {one}: is the trace file (--trace {trace}); name the file "
                                 f"{flag.flag} takes")


def resolve_engine_config(args: argparse.Namespace, progress: Progress = lambda message: None,
                          kind: EngineKind | None = None) -> EngineConfig:
    """The settings the flags describe, on the model they name (the bundled default if none), made
    ready to start (`EngineKind.prepare`: a draft model checked, a derived one made). `kind` (default:
    the engine --engine names) reads its own flags; the flags are checked first: a bad one, or one only
    another engine understands, is an error before any model is prepared."""
    from tracetune.engine_adapter.models import resolve_model

    kind = chosen_engine(args) if kind is None else kind
    # Every flag checked before a model is prepared; where --model names none, the bundled model's config
    # is not read yet (os.devnull holds none), so only the second check bounds --ctx-size by it.
    engine_config_from_args(args, Path(args.model or os.devnull), kind)
    model = resolve_model(args.model, progress) if kind.loads_model else Path(args.model or kind.name)
    config = engine_config_from_args(args, model, kind)
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
