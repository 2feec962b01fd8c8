"""Options several commands share, defined once: `--trace` and `--slo` (the main job, `tune replay`,
`tune capacity`). Each command says what differs: whether the option is required, and its help.
Also the argparse types of numeric flags (`positive_int`, `nonnegative_int`, `port`, `positive_float`),
so every command refuses a nonsense number the same way."""

from __future__ import annotations

import argparse
from pathlib import Path


def add_trace_option(parser: argparse.ArgumentParser, *, required: bool = False,
                     help: str = "native JSONL trace") -> None:
    """`--trace FILE`: the trace to replay, as a path."""
    parser.add_argument("--trace", type=Path, required=required, metavar="FILE", help=help)


def slo_spec(text: str) -> str:
    """`--slo`'s value, checked as the command line is read (kept as given; `replay.metrics.parse_slos`
    reads it where it is used): a spec it cannot read is a usage error naming the flag, exit 2."""
    from tracetune.errors import InputError
    from tracetune.replay.metrics import parse_slos

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


# Numeric flags, checked as the command line is read: a value that can only fail later (0 requests, a
# port past 65535, a NaN timeout) is a usage error that names the flag (argparse prefixes
# "argument --FLAG:"), exit 2, before anything is read, started or written.
def _parsed(text: str, kind: type, what: str) -> int | float:
    try:
        return kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None


def positive_int(text: str) -> int:
    """A count that must be at least 1 (--trials, --max-requests, --probe-prompts, ...)."""
    value = _parsed(text, int, "a whole number >= 1")
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, got {text!r}")
    return value


def nonnegative_int(text: str) -> int:
    """A count that may be 0 (--warmup)."""
    value = _parsed(text, int, "a whole number >= 0")
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 0, got {text!r}")
    return value


def port(text: str) -> int:
    """A TCP port a server can listen on: 1-65535."""
    value = _parsed(text, int, "a port number from 1 to 65535")
    if not 1 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"expected a port number from 1 to 65535, got {text!r}")
    return value


def positive_float(text: str) -> float:
    """A finite number > 0 (seconds, rates, prices, scales): nan and inf are refused."""
    import math

    value = _parsed(text, float, "a number > 0")
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"expected a finite number > 0, got {text!r}")
    return value
