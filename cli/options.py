"""Options several commands share, defined once: `--trace` and `--slo` (the main job, `tune replay`,
`tune capacity`). Each command says what differs: whether the option is required, and its help."""

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
