"""What a run replays of the trace the user gave: `tune trace profile`, the profile's short form at the
start of `tune capacity` and `tune --trace`, and a warning when a first-N cut differs from the whole
trace."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rich.console import Console

    from tracetune.replay.trace import Trace
    from tracetune.replay.types import ReplayOptions

PROFILE_EPILOG = """\
examples:
  tune trace profile examples/traffic.jsonl
  tune trace profile traffic.jsonl --json profile.json

Prints the trace's duration and size, its arrival rates at 1 s, 10 s, 1 min and 10 min (p50, p90,
peak, peak over mean), burstiness (inter-arrival CV), input/output length quantiles, prefix reuse
and the rate over time (one mark per 1/60 of the trace). Inputs recorded as text count 4
characters a token (said so).
"""


def add_profile_parser(tsub: argparse._SubParsersAction) -> None:
    pp = tsub.add_parser("profile", help="what a trace looks like: rates, bursts, lengths, prefix reuse",
                         epilog=PROFILE_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    # Not `trace`: the root parser's --trace (the main job's) shares the namespace.
    pp.add_argument("profile_trace", type=Path, metavar="TRACE", help="a trace in the native format (JSONL)")
    pp.add_argument("--json", type=Path, metavar="FILE", help="also write the profile as JSON")


def profile_command(args: argparse.Namespace, console) -> int:
    from tracetune.files import refuse_overwrite, write_atomic
    from tracetune.replay.profile import profile
    from tracetune.replay.trace import load_trace

    if args.json is not None:
        refuse_overwrite(args.json, flag="--json", protected=[args.profile_trace])
    found = profile(load_trace(args.profile_trace))
    console.print(f"{args.profile_trace}", highlight=False)
    for line in found.lines():
        console.print("  " + line, highlight=False)
    if args.json is not None:
        write_atomic(args.json, json.dumps(found.as_dict(), indent=2))
        console.print(f"wrote {args.json}", highlight=False)
    return 0


def trace_report(trace: Trace, options: ReplayOptions, console: Console) -> dict[str, object]:
    """Print the trace's profile in one line; where --max-requests/--max-duration cut it, the cut's
    too, and a warning naming how it differs from the whole trace. Returns the whole trace's profile."""
    from tracetune.replay.profile import bounds_text, compare, profile, profile_records
    from tracetune.replay.send import kept

    whole = profile(trace)
    console.print(f"[dim]·[/] {whole.short()}", highlight=False)
    cut = kept(trace.records, options)
    if len(cut) < len(trace.records):
        part = profile_records(cut)
        differs = compare(part, whole)
        what = f"the first {len(cut)} requests ({part.duration_s:.3g} s)"
        if differs:
            console.print(f"[yellow]warning[/]: {what} chosen by --max-requests/--max-duration differ from the whole "
                          f"trace: {'; '.join(differs)} (alike means {bounds_text()}). A capacity measured on them "
                          f"stands for them, not for the trace; drop the flags to measure the whole trace's",
                          highlight=False)
        else:
            console.print(f"[dim]·[/] {what} chosen by --max-requests/--max-duration look like the whole trace "
                          f"({bounds_text()})", highlight=False)
    return whole.as_dict()
