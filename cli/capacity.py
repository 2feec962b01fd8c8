"""`tune capacity`: the highest load one configuration carries at the SLO, on an endpoint that is
already running or on a vLLM server tracetune starts (one engine for the whole search)."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import math
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tracetune.capacity.levels import LevelRunner
    from tracetune.capacity.step import CapacityOptions, CapacityResult, Step
    from tracetune.cli.run_files import Interrupt, RecordLog
    from tracetune.engine_adapter.kind import EngineConfig, EngineKind
    from tracetune.replay.metrics import SLO
    from tracetune.replay.types import ReplayOptions, RequestRecord

CAPACITY_EPILOG = """\
examples:
  tune capacity --trace examples/traffic.jsonl --slo "ttft:p99<2s,tpot:p99<200ms" --eager --json cap.json
  tune capacity --trace t.jsonl --endpoint http://127.0.0.1:8000 --slo "ttft:p99<500ms" --attainment 0.99
  tune capacity --trace t.jsonl --slo "e2e:p90<10s" --max-num-seqs 64 --precision 0.1 --check-whole
  tune capacity --trace t.jsonl --slo "ttft:p95<1s,tpot:p95<50ms" --level-seconds 60 --precision 0.1
  tune capacity --trace t.jsonl --slo "ttft:p99<2s" --engine llamacpp --weights Q8_0

A request is good when it meets every threshold of --slo (errors are misses); a load level (the
trace's arrival times divided by k) passes when at least --attainment of its requests are good,
every percentile target holds, and the engine held it to the end: its last third meets
--attainment too, and neither the requests in flight nor TTFT are still rising. A level lasts at
least --level-seconds, --level-lifetimes request lifetimes and --level-requests requests; a
shorter trace is replayed end to end again (later passes' prompts tagged: no extra prefix-cache
hits). A trace longer than 4 windows is not replayed whole at every level: a level replays its
busiest window and others by load until they decide whether the whole trace would pass (said per
level; --whole-trace replays all of it). Capacity is the highest passing k, with its bracket.
"""


def add_capacity_options(parser: argparse.ArgumentParser) -> None:
    """How a capacity search judges a load level and when it stops (`tune capacity`, `tune --trace --slo`)."""
    from tracetune.capacity.step import LEVEL_LIFETIMES, LEVEL_REQUESTS, LEVEL_SECONDS, SEARCH_RULES
    from tracetune.cli.options import nonnegative_float, nonnegative_int, precision, share

    parser.add_argument("--attainment", type=share, default=0.95, metavar="F",
                        help="capacity: share of requests that must meet every --slo threshold at a passing load "
                             "level (default 0.95)")
    parser.add_argument("--precision", type=precision, default=0.05, metavar="F",
                        help="capacity: stop when the bracket [pass, fail] is within this ratio (default 0.05 = 5%%; "
                             "at least 0.005)")
    parser.add_argument("--level-seconds", type=nonnegative_float, default=LEVEL_SECONDS, metavar="S",
                        help=f"capacity: a load level lasts at least S seconds, the trace replayed end to end again "
                             f"where it is shorter (default {LEVEL_SECONDS:g})")
    parser.add_argument("--level-lifetimes", type=nonnegative_float, default=LEVEL_LIFETIMES, metavar="K",
                        help=f"capacity: ... and at least K request lifetimes (the longest a median request may "
                             f"live within the SLO, or its measured median E2E; default {LEVEL_LIFETIMES:g})")
    parser.add_argument("--level-requests", type=nonnegative_int, default=LEVEL_REQUESTS, metavar="N",
                        help=f"capacity: ... and at least N requests (default {LEVEL_REQUESTS})")
    parser.add_argument("--whole-trace", action="store_true",
                        help="capacity: replay the whole trace at every load level (a one-hour trace costs an "
                             "hour a level) instead of the windows that decide it, the default for a trace longer "
                             "than 4 windows (docs/capacity.md, 'A long trace')")
    parser.add_argument("--search-rules", choices=SEARCH_RULES, default=SEARCH_RULES[0],
                        help="capacity: 'guided' (default) places each level where the levels measured so far say "
                             "the SLO is crossed and repeats only marginal bracket ends; 'classic' doubles, bisects "
                             "and repeats both ends (docs/capacity.md)")
    parser.add_argument("--machine-check", choices=("on", "off"), default="on",
                        help="capacity: 'on' (default) accounts this machine's cores over each level; a level "
                             "failed while other work took the engine's cores is measured again once the machine "
                             "is quiet, never counted as the configuration's failure (docs/capacity.md)")


def capacity_options(args: argparse.Namespace, slos: Sequence[SLO]) -> CapacityOptions:
    """The capacity search's options from the shared flags (`add_capacity_options`); the rest as the
    search's defaults (`dataclasses.replace` sets them)."""
    from tracetune.capacity.step import CapacityOptions

    return CapacityOptions(slos=tuple(slos), attainment=args.attainment, precision=args.precision,
                           level_seconds=args.level_seconds, level_lifetimes=args.level_lifetimes,
                           level_requests=args.level_requests, whole_trace=args.whole_trace,
                           rules=args.search_rules, machine_check=args.machine_check == "on")


def add_parser(sub: argparse._SubParsersAction) -> None:
    from tracetune.cli.engine_options import add_engine_options
    from tracetune.cli.options import add_slo_option, add_trace_option, nonnegative_int, positive_float, positive_int
    from tracetune.cli.replay import add_target_options

    cp = sub.add_parser("capacity", help="highest request rate a configuration serves within the SLO",
                        epilog=CAPACITY_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_trace_option(cp, required=True)
    add_slo_option(cp, required=True)
    add_capacity_options(cp)
    cp.add_argument("--start-scale", type=positive_float, default=1.0, metavar="K",
                    help="first load level, as a multiple of the trace's rate (default 1)")
    cp.add_argument("--max-scale", type=positive_float, default=256.0, metavar="K",
                    help="highest level tried (default 256)")
    cp.add_argument("--min-scale", type=positive_float, default=0.125, metavar="K",
                    help="lowest level tried (default 0.125); a config failing there has capacity 0")
    cp.add_argument("--max-requests", type=positive_int, metavar="N",
                    help="measure only the trace's first N requests (warned where they differ from the whole)")
    cp.add_argument("--max-duration", type=positive_float, metavar="S",
                    help="measure only the trace's first S seconds (its own time; warned where they differ from the "
                         "whole). Default: the whole trace, a long one by the windows that decide it")
    cp.add_argument("--check-whole", action="store_true",
                    help="after the search, replay the whole trace once at the capacity found and say whether it "
                         "held, with what it cost")
    cp.add_argument("--warmup", type=nonnegative_int, default=2, metavar="N",
                    help="requests sent once before the first level, unmeasured (default 2)")
    cp.add_argument("--no-repeat", action="store_true", help="do not confirm the highest passing level")
    cp.add_argument("--no-abandon", action="store_true", help="replay every level to the end")
    cp.add_argument("--max-output-tokens", type=positive_int, metavar="N", help="cap each request's output length")
    cp.add_argument("--request-timeout", type=positive_float, default=600.0, metavar="S",
                    help="seconds one request may take before it counts as failed (default 600)")
    add_target_options(cp)
    cp.add_argument("--json", type=Path, metavar="FILE",
                    help="write the result (every level) as JSON; interrupted: the levels done, marked so")
    cp.add_argument("--out", type=Path, metavar="DIR",
                    help="every request's record (requests.jsonl, with its load level) and engine logs "
                         "(default runs/capacity-TIMESTAMP; one holding an earlier run's is kept, DIR-2 used)")
    add_engine_options(cp)


def capacity_command(args: argparse.Namespace, console) -> int:
    """`tune capacity`: each request's record is on disk as it finishes; Ctrl-C or SIGTERM stops the
    search and keeps the levels done (in --json, marked interrupted): exit 130 / 143."""
    from tracetune.cli.run_files import interruptible

    run = CapacityRun()
    with interruptible() as caught:
        try:
            return _capacity(args, console, run)
        except KeyboardInterrupt:
            run.interrupted(args, caught, console)
            return caught.exit_code
        finally:
            if run.log is not None:
                run.log.close()


@dataclasses.dataclass
class CapacityRun:
    """What a capacity search has so far: its records (on disk as they come) and the levels done."""

    log: RecordLog | None = None  # once the results folder is known
    runner: LevelRunner | None = None  # once the search starts
    payload: dict[str, object] = dataclasses.field(default_factory=dict)

    def record(self, scale: float, record: RequestRecord) -> None:
        """One request's record, with its load level (the search's n-th replay) and scale."""
        assert self.log is not None and self.runner is not None, "records come once the search runs"
        self.log(record, level=len(self.runner.measured) + 1, scale=scale)

    def interrupted(self, args: argparse.Namespace, caught: Interrupt, console) -> None:
        """Keep what an interrupted search measured: the records are on disk; the levels done go to --json."""
        if self.log is not None:
            self.log.close()
        if self.runner is None or self.log is None:
            console.print(f"\ninterrupted ({caught.name}) before the search started; nothing was written",
                          highlight=False)
            return
        steps = [step.as_dict() for step, _ in self.runner.measured]
        kept = [f"{len(steps)} load levels done", f"the {len(self.log.records)} requests' records in {self.log.path}"]
        if args.json is not None:
            write_json(args.json, {**self.payload, "interrupted": True, "steps": steps})
            kept.append(f"the levels in {args.json} (marked interrupted)")
        console.print(f"\ninterrupted ({caught.name}): kept " + "; ".join(kept), highlight=False)


def write_json(path: Path, payload: Mapping[str, object]) -> None:
    from tracetune.files import write_atomic

    write_atomic(path, json.dumps(payload, indent=2, default=str))


def _capacity(args: argparse.Namespace, console, run: CapacityRun) -> int:
    from tracetune.capacity.levels import LevelRunner, machine_watch, settle
    from tracetune.cli.replay import engine_cores, prepare_run, prepared_requests, serving_target
    from tracetune.cli.run_files import RECORDS_FILE, RecordLog
    from tracetune.cli.workload import trace_report
    from tracetune.engine_adapter.registry import DEFAULT_ENGINE, engine_kind
    from tracetune.errors import InputError
    from tracetune.files import refuse_overwrite
    from tracetune.replay.metrics import parse_slos
    from tracetune.replay.types import ReplayOptions

    options = dataclasses.replace(capacity_options(args, parse_slos(args.slo)), start_scale=args.start_scale,
                                  max_scale=args.max_scale, min_scale=args.min_scale, confirm=not args.no_repeat,
                                  abandon=not args.no_abandon)
    replay_options = ReplayOptions(max_requests=args.max_requests, max_duration_s=args.max_duration,
                                   warmup_requests=args.warmup, max_output_tokens=args.max_output_tokens,
                                   request_timeout_s=args.request_timeout)
    if args.json is not None:
        refuse_overwrite(args.json, flag="--json", protected=[args.trace])
    trace, config, out_dir = prepare_run(args, replay_options, console)
    trace_profile = trace_report(trace, replay_options, console)
    run.log = RecordLog(out_dir / RECORDS_FILE)
    with serving_target(args, config, out_dir, console) as (engine, tokenizer_dir, engine_info):
        everything = prepared_requests(trace, replay_options, tokenizer_dir, console,
                                       flag="--tokenizer" if args.endpoint else "--model")
        n_warm = min(args.warmup, len(everything))
        if len(everything) - n_warm < 2:
            raise InputError(f"{args.trace}: a capacity search needs at least 2 measured requests; lower --warmup "
                             f"or raise --max-requests")
        # Levels start drained (where the engine reports its queue); on a server started here
        # also with an empty prefix cache.
        ours = bool(engine_info.get("engine"))

        def before_level() -> None:
            settle(engine, reset_prefix_cache=ours)

        kind = engine_kind(engine_info.get("engine") or DEFAULT_ENGINE)
        shown = engine_info.get("endpoint") or kind.shown
        console.print(f"searching the capacity of {shown} at SLO {args.slo} "
                      f"(attainment >= {options.attainment:.0%}, precision {options.precision:.0%})", highlight=False)
        endpoint = engine.endpoint
        assert endpoint is not None, "serving_target yields a started engine"
        cores = engine_cores(args, engine_info, config)
        with _level_progress(console) as (on_progress, on_level, progress_print):
            run.runner = runner = LevelRunner(
                endpoint.base_url, endpoint.model, everything[n_warm:], replay_options, options,
                warmup=everything[:n_warm], engine=None, headers=endpoint.headers or None,
                before_level=before_level, on_level=on_level, on_progress=on_progress, on_record=run.record,
                client_procs=args.client_procs, engine_cores=cores,
                watch=machine_watch(options, engine.process_group() if ours else None, cores,
                                    watched=kind.watch_machine))
            run.payload = {"trace": str(args.trace), **engine_info, "slo": args.slo,
                           "attainment_target": options.attainment, "precision": options.precision}
            progress_print(runner.describe())
            result = runner.search(gpus=config.gpus() if config is not None else 1)
            _explain(result, runner, kind, config)
            check = whole_trace_check(runner, result, progress_print) if args.check_whole else None
    console.print(f"[bold]{result.headline()}[/]", highlight=False)
    if result.failure_text():
        console.print(f"  {result.failure_text()}", highlight=False)
    if check is not None:
        console.print(check.line("whole-trace check"), highlight=False)
    if args.json is not None:
        write_json(args.json, {"trace": str(args.trace), **engine_info, **result.as_dict(),
                               "trace_profile": trace_profile,
                               "whole_trace_check": None if check is None else check.as_dict()})
        console.print(f"wrote {args.json} and {run.log.path}")
    else:
        console.print(f"wrote {run.log.path}")
    return _endpoint_checked(args, run, replay_options, console)


def _explain(result: CapacityResult, runner: LevelRunner, kind: EngineKind, config: EngineConfig | None) -> None:
    """Each failed level's cause (`capacity.causes`), from its records and the configuration's slots
    as its engine states them (none for an endpoint tracetune did not start)."""
    from tracetune.capacity.causes import explain_steps

    slots = kind.slots(config) if config is not None and kind.slots is not None else None
    levels = [(step.scale, step.repeat, replayed.records) for step, replayed in runner.measured]
    causes = explain_steps([s.as_dict() for s in result.steps], levels, runner.options.slos, slots=slots)
    for step, found in zip(result.steps, causes):
        step.cause = found or step.cause


def _endpoint_checked(args: argparse.Namespace, run: CapacityRun, replay_options: ReplayOptions, console) -> int:
    """1, saying so as `tune replay` does, when most answers of --endpoint were not OpenAI streams."""
    from tracetune.replay.metrics import endpoint_warning, summarize
    from tracetune.replay.types import ReplayResult

    if not args.endpoint or run.runner is None or run.log is None:
        return 0
    seconds = math.fsum(step.duration_s for step, _ in run.runner.measured)
    warning = endpoint_warning(summarize(ReplayResult(run.log.records, seconds, replay_options)))
    if warning is None:
        return 0
    console.print(f"error: {warning}", style="bold red", markup=False, highlight=False)
    return 1


def whole_trace_check(runner: LevelRunner, result: CapacityResult, say: Callable[[str], None]) -> Step | None:
    """The whole trace replayed once at the capacity found (its Step), or None when none was found."""
    if not result.capacity_scale:
        say("whole-trace check: no capacity to check")
        return None
    runner.options = dataclasses.replace(runner.options, whole_trace=True)
    say(f"whole-trace check: the whole trace at {result.capacity_scale:.3g}x ...")
    return runner.level(result.capacity_scale, abandon=False)


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
