"""`tune capacity`: the highest load one configuration carries at the SLO, on an endpoint that is
already running or on a vLLM server tracetune starts (one engine for the whole search)."""

from __future__ import annotations

import argparse
import contextlib
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

CAPACITY_EPILOG = """\
examples:
  tune capacity --trace examples/traffic.jsonl --slo "ttft:p99<2s,tpot:p99<200ms" --eager --json cap.json
  tune capacity --trace t.jsonl --endpoint http://127.0.0.1:8000 --slo "ttft:p99<500ms" --attainment 0.99
  tune capacity --trace t.jsonl --slo "e2e:p90<10s" --max-num-seqs 64 --precision 0.1 --max-duration 60
  tune capacity --trace t.jsonl --slo "ttft:p95<1s,tpot:p95<50ms" --level-seconds 60 --precision 0.1

A request is good when it meets every threshold of --slo (errors are misses); a load level (the
trace's arrival times divided by k) passes when at least --attainment of its requests are good,
every percentile target holds, and the engine held it to the end: its last third meets
--attainment too, and neither the requests in flight nor TTFT are still rising. A level lasts at
least --level-seconds, --level-lifetimes request lifetimes and --level-requests requests; a
shorter trace is replayed end to end again (later passes' prompts tagged: no extra prefix-cache
hits). Capacity is the highest passing k, reported with its bracket.
"""


def add_capacity_options(parser: argparse.ArgumentParser) -> None:
    """How a capacity search judges a load level and when it stops (`tune capacity`, `tune --trace --slo`)."""
    from tracetune.replay.capacity import LEVEL_LIFETIMES, LEVEL_REQUESTS, LEVEL_SECONDS

    parser.add_argument("--attainment", type=float, default=0.95, metavar="F",
                        help="capacity: share of requests that must meet every --slo threshold at a passing load "
                             "level (default 0.95)")
    parser.add_argument("--precision", type=float, default=0.05, metavar="F",
                        help="capacity: stop when the bracket [pass, fail] is within this ratio (default 0.05 = 5%%)")
    parser.add_argument("--level-seconds", type=float, default=LEVEL_SECONDS, metavar="S",
                        help=f"capacity: a load level lasts at least S seconds, the trace replayed end to end again "
                             f"where it is shorter (default {LEVEL_SECONDS:g})")
    parser.add_argument("--level-lifetimes", type=float, default=LEVEL_LIFETIMES, metavar="K",
                        help=f"capacity: ... and at least K request lifetimes (the longest a median request may "
                             f"live within the SLO, or its measured median E2E; default {LEVEL_LIFETIMES:g})")
    parser.add_argument("--level-requests", type=int, default=LEVEL_REQUESTS, metavar="N",
                        help=f"capacity: ... and at least N requests (default {LEVEL_REQUESTS})")


def capacity_options(args: argparse.Namespace, slos: Sequence[Any], **more: Any) -> Any:
    """The capacity search's options from the shared flags (`add_capacity_options`)."""
    from tracetune.replay.capacity import CapacityOptions

    return CapacityOptions(slos=tuple(slos), attainment=args.attainment, precision=args.precision,
                           level_seconds=args.level_seconds, level_lifetimes=args.level_lifetimes,
                           level_requests=args.level_requests, **more)


def add_parser(sub: argparse._SubParsersAction) -> None:
    from tracetune.cli.engine_options import add_engine_options
    from tracetune.cli.options import add_slo_option, add_trace_option
    from tracetune.cli.replay import add_target_options

    cp = sub.add_parser("capacity", help="highest request rate a configuration serves within the SLO",
                        epilog=CAPACITY_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_trace_option(cp, required=True)
    add_slo_option(cp, required=True)
    add_capacity_options(cp)
    cp.add_argument("--start-scale", type=float, default=1.0, metavar="K",
                    help="first load level, as a multiple of the trace's rate (default 1)")
    cp.add_argument("--max-scale", type=float, default=256.0, metavar="K", help="highest level tried (default 256)")
    cp.add_argument("--min-scale", type=float, default=0.125, metavar="K",
                    help="lowest level tried (default 0.125); a config failing there has capacity 0")
    cp.add_argument("--max-requests", type=int, metavar="N", help="at most N requests of the trace per level")
    cp.add_argument("--max-duration", type=float, default=60.0, metavar="S",
                    help="replay the first S seconds of the trace (its own time) at every level (default 60)")
    cp.add_argument("--warmup", type=int, default=2, metavar="N",
                    help="requests sent once before the first level, unmeasured (default 2)")
    cp.add_argument("--no-repeat", action="store_true", help="do not confirm the highest passing level")
    cp.add_argument("--no-abandon", action="store_true", help="replay every level to the end")
    cp.add_argument("--max-output-tokens", type=int, metavar="N", help="cap each request's output length")
    cp.add_argument("--request-timeout", type=float, default=600.0, metavar="S")
    add_target_options(cp)
    cp.add_argument("--json", type=Path, metavar="FILE", help="write the result (every level) as JSON")
    cp.add_argument("--out", type=Path, metavar="DIR", help="engine logs (default runs/capacity-TIMESTAMP)")
    add_engine_options(cp)


def capacity_command(args: argparse.Namespace, console) -> int:
    from tracetune.cli.replay import prepare_run, prepared_requests
    from tracetune.errors import InputError
    from tracetune.replay.levels import LevelRunner, settle
    from tracetune.replay.metrics import parse_slos
    from tracetune.replay.types import ReplayOptions

    options = capacity_options(args, parse_slos(args.slo), start_scale=args.start_scale, max_scale=args.max_scale,
                               min_scale=args.min_scale, confirm=not args.no_repeat, abandon=not args.no_abandon)
    if args.max_duration is not None and not args.max_duration > 0:
        raise InputError(f"--max-duration must be > 0, got {args.max_duration}")
    replay_options = ReplayOptions(max_requests=args.max_requests, max_duration_s=args.max_duration,
                                   warmup_requests=args.warmup, max_output_tokens=args.max_output_tokens,
                                   request_timeout_s=args.request_timeout)
    trace, config, out_dir = prepare_run(args, replay_options, console)
    if args.json is not None and args.json.is_dir():
        raise InputError(f"--json {args.json}: is a directory; name a file")
    out_dir.mkdir(parents=True, exist_ok=True)
    from tracetune.cli.replay import engine_cores, serving_target

    with serving_target(args, config, out_dir, console) as (engine, tokenizer_dir, engine_info):
        everything = prepared_requests(trace, replay_options, tokenizer_dir, console)
        n_warm = min(args.warmup, len(everything))
        if len(everything) - n_warm < 2:
            raise InputError(f"{args.trace}: a capacity search needs at least 2 measured requests; lower --warmup "
                             f"or raise --max-requests")
        # Levels start drained (where the engine reports its queue); on a server started here
        # also with an empty prefix cache.
        ours = bool(engine_info.get("engine"))

        def before_level() -> None:
            settle(engine, reset_prefix_cache=ours)

        console.print(f"searching the capacity of {engine_info.get('endpoint') or 'vLLM'} at SLO {args.slo} "
                      f"(attainment >= {options.attainment:.0%}, precision {options.precision:.0%})", highlight=False)
        with _level_progress(console) as (on_progress, on_level, progress_print):
            runner = LevelRunner(engine.endpoint.base_url, engine.endpoint.model, everything[n_warm:],
                                 replay_options, options, warmup=everything[:n_warm], engine=None,
                                 headers=engine.endpoint.headers or None, before_level=before_level,
                                 on_level=on_level, on_progress=on_progress, client_procs=args.client_procs,
                                 engine_cores=engine_cores(args, engine_info, config))
            progress_print(runner.describe())
            result = runner.search(gpus=config.gpus() if config is not None else 1)
    console.print(f"[bold]{result.headline()}[/]", highlight=False)
    payload = {"trace": str(args.trace), **engine_info, **result.as_dict()}
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(payload, indent=2, default=str))
        console.print(f"wrote {args.json}")
    return 0


@contextlib.contextmanager
def _level_progress(console):
    """A live bar for the level being replayed, and a line per level once it is judged."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(TextColumn("  load level"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[info]}"),
                  TimeElapsedColumn(), console=console, transient=True, refresh_per_second=4) as progress:
        task = progress.add_task("level", total=None, info="")

        def on_progress(done: int, total: int, in_flight: int) -> None:
            progress.update(task, completed=done, total=total, info=f"in flight {in_flight}")

        def on_level(step) -> None:
            progress.console.print("  " + step.line(), highlight=False)
            progress.reset(task, total=None, info="")

        yield on_progress, on_level, lambda text: progress.console.print("  " + text, highlight=False)
