"""The `tune` command each worker pod runs: the main job's flags the user gave, as given, with what a
pod sees differently put in their place (the trace and space where the pod mounts them, the storage
from the Secret, the run folder on its volume, model paths on the models claim) and the study and
engine pinned, so that every worker runs the same study on the engine its image holds."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from tracetune.errors import InputError
from tracetune.k8s import dollars

# One option as given: its flag and its value (None for a switch such as --no-prune).
Option = tuple[str, str | None]


def options_of(argv: Sequence[str], takes_value: Mapping[str, bool]) -> list[Option]:
    """`argv` (the main job's flags, already accepted by its parser) as (flag, value) pairs, whether a
    value was given as `--flag value` or `--flag=value`; `takes_value` says which flags take one."""
    out: list[Option] = []
    i = 0
    while i < len(argv):
        flag, eq, inline = argv[i].partition("=")
        if flag not in takes_value:
            raise InputError(f"study flags: {argv[i]!r} is not an option of the main job (tune --help lists them)")
        if not takes_value[flag] or eq:
            out.append((flag, inline if eq else None))
            i += 1
        elif i + 1 < len(argv):
            out.append((flag, argv[i + 1]))
            i += 2
        else:
            raise InputError(f"study flags: {flag} needs a value")
    return out


def given(options: Sequence[Option], flag: str) -> list[str]:
    """Every value given to `flag`, in order (a repeatable flag may have several)."""
    return [value for name, value in options if name == flag and value is not None]


def worker_args(options: Sequence[Option], pinned: Mapping[str, str],
                moved: Callable[[str, str], str] = lambda flag, value: value) -> list[str]:
    """The pod's `tune` arguments: `options` in their order, each value `moved(flag, value)` (a model
    path on the models claim) and escaped as Kubernetes reads `$`, without the flags the fleet `pinned`;
    then the pinned ones (`--flag=value`, as written: they may name `$(VAR)` on purpose). Every value
    is one argument `--flag=value`, so a value that starts with `-` stays a value."""
    kept = [f if v is None else f"{f}={dollars(moved(f, v))}" for f, v in options if f not in pinned]
    return [*kept, *(f"{flag}={value}" for flag, value in pinned.items())]
