"""Options several commands share, defined once: `--trace` and `--slo` (the main job, `tune replay`,
`tune capacity`). Each command says what differs: whether the option is required, and its help.
Also the argparse types of numeric flags (`positive_int`, `nonnegative_int`, `port`, `positive_float`,
`nonnegative_float`, `share`, `ratio`, `precision`, all built on `number`), so every command refuses a nonsense
number the same way."""

from __future__ import annotations

import argparse
import dataclasses
import math
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar


def default_of(settings: type, field: str) -> object:
    """The default of dataclass `settings`' field `field` (e.g. `StudySettings.heartbeat_s`): a flag
    that fills a setting shows and takes the setting's own default, written in one place."""
    default: object = next(f.default for f in dataclasses.fields(settings) if f.name == field)
    if default is dataclasses.MISSING:
        raise TypeError(f"{settings.__name__}.{field} has no default")
    return default


def add_trace_option(parser: argparse.ArgumentParser, *, required: bool = False,
                     help: str = "native JSONL trace") -> None:
    """`--trace FILE`: the trace to replay, as a path."""
    parser.add_argument("--trace", type=Path, required=required, metavar="FILE", help=help)


def slo_spec(text: str) -> str:
    """`--slo`'s value, checked as the command line is read (kept as given; `replay.metrics.parse_slos`
    reads it where it is used): a spec it cannot read, or an empty one, is a usage error naming the flag, exit 2."""
    from tracetune.errors import InputError
    from tracetune.replay.metrics import parse_slos

    if not text.strip():  # would read as no SLO at all: leaving the flag out says that
        raise argparse.ArgumentTypeError("empty; write e.g. 'ttft:p99<2s,tpot:p99<100ms', or leave --slo out "
                                         "for no SLO")
    try:
        parse_slos(text, flag="--slo")
    except InputError as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix("--slo: ")) from None
    return text


def add_slo_option(parser: argparse.ArgumentParser, *, required: bool = False,
                   help: str = "per-request thresholds and percentile targets, e.g. "
                               "'ttft:p99<2s,tpot:p99<100ms'") -> None:
    """`--slo SPEC`: latency targets, e.g. `ttft:p99<500ms,tpot:p50<50ms`."""
    parser.add_argument("--slo", type=slo_spec, required=required, metavar="SPEC", help=help)


N = TypeVar("N", int, float)


# Numeric flags, checked as the command line is read: a value that can only fail later (0 requests, a
# port past 65535, a NaN timeout) is a usage error that names the flag (argparse prefixes
# "argument --FLAG:"), exit 2, before anything is read, started or written.
def number(text: str, kind: Callable[[str], N], what: str, ok: Callable[[N], bool]) -> N:
    """`text` read as `kind` (int or float; a float must be finite) for which `ok` holds, or a usage
    error saying what the flag takes: "expected WHAT, got 'TEXT'"."""
    try:
        value = kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
    if (kind is float and not math.isfinite(value)) or not ok(value):
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}")
    return value


def positive_int(text: str) -> int:
    """A count that must be at least 1 (--trials, --max-requests, --probe-prompts, ...)."""
    return number(text, int, "a whole number >= 1", lambda v: v >= 1)


def nonnegative_int(text: str) -> int:
    """A count that may be 0 (--warmup)."""
    return number(text, int, "a whole number >= 0", lambda v: v >= 0)


def port(text: str) -> int:
    """A TCP port a server can listen on: 1-65535."""
    return number(text, int, "a port number from 1 to 65535", lambda v: 1 <= v <= 65535)


def positive_float(text: str) -> float:
    """A finite number > 0 (seconds, rates, prices, scales): nan and inf are refused."""
    return number(text, float, "a finite number > 0", lambda v: v > 0)


def nonnegative_float(text: str) -> float:
    """A finite number >= 0 (0: no minimum)."""
    return number(text, float, "a finite number >= 0", lambda v: v >= 0)


def share(text: str) -> float:
    """A share in (0, 1], e.g. 0.95 for 95%."""
    return number(text, float, "a share in (0, 1], e.g. 0.95", lambda v: 0 < v <= 1)


def ratio(text: str) -> float:
    """A ratio in (0, 1), e.g. 0.05 for 5%."""
    return number(text, float, "a ratio in (0, 1), e.g. 0.05 for 5%", lambda v: 0 < v < 1)


# Below this, a capacity bracket is narrower than the noise of a load level's attainment: repeated
# levels disagree before the search gets there, so it never converges and spends its step budget.
MIN_PRECISION = 0.005


def precision(text: str) -> float:
    """--precision: a ratio in (0, 1) of at least `MIN_PRECISION` (0.5%)."""
    value = ratio(text)
    if value < MIN_PRECISION:
        raise argparse.ArgumentTypeError(
            f"{text!r} is below {MIN_PRECISION:g} ({MIN_PRECISION:.1%}): a capacity bracket that narrow is inside "
            f"the noise of a load level's attainment, so the search would never converge; give {MIN_PRECISION:g} "
            f"or more (default 0.05)")
    return value
