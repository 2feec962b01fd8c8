"""`tune replay` and `tune trace convert`: argument definitions (light) and their commands."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime as dt
import json
import math
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict

if TYPE_CHECKING:
    from tracetune.cli.run_files import Interrupt, RecordLog
    from tracetune.engine_adapter.base import Engine
    from tracetune.engine_adapter.kind import EngineConfig
    from tracetune.replay.metrics import SLO, Summary
    from tracetune.replay.synth import Tokenizer
    from tracetune.replay.trace import Trace
    from tracetune.replay.types import PreparedRequest, ReplayOptions, RequestRecord


REPLAY_EPILOG = """\
examples:
  tune replay --trace examples/traffic.jsonl --engine vllm --eager --prefix-caching
  tune replay --trace t.jsonl --endpoint http://127.0.0.1:8000 --rate-scale 2 --slo "ttft:p99<500ms,tpot:p50<50ms"
  tune replay --trace t.jsonl --engine vllm --mode closed --concurrency 16 --max-requests 200
  tune replay --trace t.jsonl --engine llamacpp --weights Q8_0 --parallel 8
  tune replay --trace busy.jsonl --endpoint http://10.0.0.5:8000 --client-procs 8   # a rate past one core
"""

CONVERT_EPILOG = """\
examples:
  tune trace convert --from mooncake examples/public_traces/mooncake_conversation_60.jsonl mooncake.jsonl --limit 200 --length-scale 0.1
  tune trace convert --from mooncake examples/public_traces/mooncake_conversation_60.jsonl spread.jsonl --length-scale 0.1 --spread-arrivals
  tune trace convert --from azure examples/public_traces/azure2023_conv_60.csv azure.jsonl --limit 500
  tune trace convert --from sharegpt examples/public_traces/sharegpt_v3_filtered_250.json sharegpt.jsonl --rate 2
"""  # noqa: E501 (literal example commands, printed verbatim by RawDescriptionHelpFormatter)


class EngineInfo(TypedDict, total=False):
    """What a replay records about the engine it measured (`serving_target`): a running endpoint's
    URL, or the engine tracetune started, its settings and the platform it ran on."""

    endpoint: str
    engine: str
    config: dict[str, object]
    platform: str


def add_target_options(parser: argparse.ArgumentParser) -> None:
    """What to measure: a running endpoint, or an engine tracetune starts (see `serving_target`)."""
    from tracetune.cli.checks import endpoint_url
    from tracetune.cli.engine_options import add_engine_choice

    target = parser.add_mutually_exclusive_group()
    target.add_argument("--endpoint", type=endpoint_url, metavar="URL",
                        help="an already running OpenAI-compatible server")
    add_engine_choice(target)
    parser.add_argument("--api-key-env", metavar="VAR", help="environment variable holding the endpoint's API key")
    parser.add_argument("--served-model", metavar="NAME",
                        help="model name to request from --endpoint (default: first listed)")
    parser.add_argument("--tokenizer", metavar="DIR", help="tokenizer for length-only traces with --endpoint")
    add_client_options(parser)


def client_procs_value(text: str) -> int | None:
    """--client-procs: a count >= 1, or 'auto' (None)."""
    if text == "auto":
        return None
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected 'auto' or a whole number >= 1, got {text!r}")
    return value


def add_client_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--client-procs", type=client_procs_value, default=None, metavar="N|auto",
                        help="processes that send the replay (default auto: one per 2,000 req/s of the trace's "
                             "peak rate, within the cores the engine leaves free)")


def engine_cores(args: argparse.Namespace, engine_info: EngineInfo, config: EngineConfig | None) -> int:
    """Cores the engine keeps busy on this machine: all of them for an engine on the CPU, its API
    server and one engine process per GPU on a GPU, one for a server on this machine's loopback
    address, none for a remote endpoint."""
    import urllib.parse

    from tracetune.replay.client_procs import engine_cores as started_engine_cores

    if args.endpoint:
        host = urllib.parse.urlsplit(args.endpoint).hostname or ""
        return 1 if host in ("127.0.0.1", "localhost", "::1") else 0
    return started_engine_cores(engine_info.get("platform", ""), config.gpus() if config is not None else 1)


def client_procs(args: argparse.Namespace, requests: Sequence[PreparedRequest], engine_info: EngineInfo,
                 config: EngineConfig | None) -> int:
    """The --client-procs to use for `requests`: as given, or chosen for their peak rate."""
    from tracetune.replay.client_procs import auto_client_procs

    if args.client_procs is not None:
        return args.client_procs
    return auto_client_procs(requests, engine_cores(args, engine_info, config))


def add_parsers(sub: argparse._SubParsersAction) -> None:
    from tracetune.cli.engine_options import add_engine_options
    from tracetune.cli.options import add_slo_option, add_trace_option, nonnegative_int, positive_float, positive_int
    from tracetune.cli.workload import add_profile_parser

    rp = sub.add_parser("replay", help="replay a trace against an engine and measure latency/throughput/goodput",
                        epilog=REPLAY_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_trace_option(rp, required=True)
    add_target_options(rp)
    rp.add_argument("--time-scale", type=positive_float, default=None, metavar="F",
                    help="multiply inter-arrival times by F (0.5 = twice the recorded rate)")
    rp.add_argument("--rate-scale", type=positive_float, default=None, metavar="R",
                    help="multiply the request rate by R")
    rp.add_argument("--max-requests", type=positive_int, metavar="N", help="measure at most N requests")
    rp.add_argument("--max-duration", type=positive_float, metavar="S",
                    help="only requests scheduled in the first S seconds")
    rp.add_argument("--warmup", type=nonnegative_int, default=2, metavar="N",
                    help="send the first N requests before measuring "
                         "(default 2; a cold engine's first request is slow)")
    rp.add_argument("--mode", choices=["open", "closed"], default="open")
    rp.add_argument("--concurrency", type=positive_int, default=1, metavar="N", help="closed-loop workers")
    rp.add_argument("--max-output-tokens", type=positive_int, metavar="N", help="cap each request's output length")
    rp.add_argument("--no-ignore-eos", action="store_true",
                    help="let requests stop at EOS (lengths then differ from the trace)")
    rp.add_argument("--request-timeout", type=positive_float, default=600.0, metavar="S",
                    help="seconds one request may take before it counts as failed (default 600)")
    add_slo_option(rp, help="e.g. 'ttft:p99<500ms,tpot:p50<50ms' (goodput counts requests meeting all)")
    rp.add_argument("--out", type=Path, metavar="DIR",
                    help="results directory (default runs/replay-TIMESTAMP; one holding an earlier run's "
                         "results is kept, and DIR-2 beside it used)")
    rp.add_argument("--keep-text", action="store_true", help="store each response's text in requests.jsonl")
    add_engine_options(rp)
    from tracetune.replay.trace_formats import FORMATS as TRACE_FORMATS

    tp = sub.add_parser("trace", help="trace utilities")
    tsub = tp.add_subparsers(dest="trace_command", metavar="ACTION", required=True)
    add_profile_parser(tsub)
    cv = tsub.add_parser("convert", help="convert a public trace to the native format",
                         epilog=CONVERT_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    cv.add_argument("--from", dest="fmt", required=True, choices=TRACE_FORMATS)
    cv.add_argument("input", type=Path)
    cv.add_argument("output", type=Path)
    cv.add_argument("--model", metavar="DIR", help="model whose tokenizer counts tokens (default: bundled)")
    cv.add_argument("--limit", type=positive_int, metavar="N", help="first N requests only")
    cv.add_argument("--length-scale", type=positive_float, default=1.0, metavar="F",
                    help="multiply input lengths (and Mooncake block size) by F, e.g. to fit a small model")
    cv.add_argument("--max-input-tokens", type=positive_int, metavar="N",
                    help="context limit for inputs (default: model context minus --max-output-tokens or 1024)")
    cv.add_argument("--overlong", choices=["truncate", "drop", "scale", "error"], default="truncate",
                    help="what to do with inputs over the limit (scale: shrink all lengths so the longest fits)")
    cv.add_argument("--max-output-tokens", type=positive_int, metavar="N", help="cap output lengths")
    cv.add_argument("--rate", type=positive_float, default=1.0, help="sharegpt: Poisson arrival rate, requests/s")
    cv.add_argument("--output-length", type=positive_int, default=128,
                    help="sharegpt: output tokens when no reply is recorded")
    cv.add_argument("--spread-arrivals", action="store_true",
                    help="arrival times recorded on a coarse grid (Mooncake: 3 s): spread each instant's requests "
                         "uniformly over the step instead of sending them as one burst (seeded by --seed)")
    cv.add_argument("--seed", type=int, default=0)


def _tokenizer(model_dir: Path | None) -> Tokenizer:
    from typing import cast

    from transformers import AutoTokenizer

    # transformers' tokenizers have the `replay.synth.Tokenizer` methods; their stubs do not say so.
    return cast("Tokenizer", AutoTokenizer.from_pretrained(str(model_dir)))


def _context_length(model_dir: Path) -> int:
    config = json.loads((model_dir / "config.json").read_text())
    for key in ("max_position_embeddings", "max_sequence_length", "n_positions", "seq_length"):
        if isinstance(config.get(key), int):
            return config[key]
    return 4096


def convert_command(args: argparse.Namespace, console) -> int:
    from tracetune.engine_adapter.models import resolve_model
    from tracetune.files import refuse_overwrite
    from tracetune.replay.importers import convert, read_requests
    from tracetune.replay.trace import write_trace

    # The output is checked (not the input, a database, a link, a folder or a device) and the input
    # read and validated before the model and its tokenizer load: bad input fails fast.
    refuse_overwrite(args.output, flag="OUTPUT", protected=[args.input])
    # (Reading does not use the input-token limit, which needs the model's context length.)
    read = read_requests(args.fmt, args.input, _options(args, args.max_input_tokens or 2**62))
    model_dir = resolve_model(args.model, lambda m: console.print(f"[dim]·[/] {m}"))
    options = _options(args, args.max_input_tokens or _context_length(model_dir) - (args.max_output_tokens or 1024))
    with console.status(f"converting {args.input} ({args.fmt})…"):
        records, report = convert(args.fmt, args.input, _tokenizer(model_dir), options, read=read)
        write_trace(records, args.output, protected=[args.input])
    for line in report.lines():
        console.print(line, highlight=False)
    console.print(f"wrote {args.output}")
    return 0


def _options(args: argparse.Namespace, max_input_tokens: int):
    from tracetune.replay.importers import ConvertOptions

    return ConvertOptions(max_input_tokens=max_input_tokens, overlong=args.overlong, limit=args.limit,
                          length_scale=args.length_scale, max_output_tokens=args.max_output_tokens,
                          rate=args.rate, output_length=args.output_length, seed=args.seed,
                          spread_arrivals=args.spread_arrivals)


def _fmt_ms(x: float) -> str:
    return "-" if x is None or math.isnan(x) else f"{x * 1000:.1f}"


def overload_warning(summary) -> str:
    """Why a replay measured its client rather than the engine, and what to do about it."""
    why = []
    if summary.schedule_lag and summary.schedule_lag["p99"] > summary.lag_bound_s:
        why.append(f"schedule lag p99 {summary.schedule_lag['p99'] * 1000:.1f} ms > "
                   f"{summary.lag_bound_s * 1000:.0f} ms")
    if summary.client_errors:
        why.append(f"{summary.client_errors} requests failed on this machine "
                   f"(e.g. {next((e for e in summary.error_examples if 'this machine' in e), 'see requests.jsonl')})")
    if summary.connection_waits:
        why.append(f"{summary.connection_waits} requests waited for a connection: this process may hold "
                   f"{summary.connection_limit} (its open-file limit; raise the hard limit, e.g. `ulimit -Hn 65536` "
                   f"as root, or spread the load with --client-procs)")
    return ("[bold yellow]warning: client overloaded[/] (" + "; ".join(why) + "): this replay measured the client, "
            "not the engine. Give the client more cores (--client-procs N), or a lower rate.")


def print_summary(summary: Summary, console) -> None:
    from rich.table import Table

    from tracetune.replay.metrics import METRICS, STATS

    table = Table(title=f"replay: {summary.succeeded}/{summary.requests} ok in {summary.duration_s:.1f}s")
    table.add_column("ms")
    for stat in STATS:
        table.add_column(stat, justify="right")
    for metric in METRICS:
        row = [metric.upper()]
        for stat in STATS:
            e = summary.latency[metric][stat]
            row.append(f"{_fmt_ms(e.value)} [dim][{_fmt_ms(e.low)}, {_fmt_ms(e.high)}][/]")
        table.add_row(*row)
    console.print(table)
    r, o = summary.request_throughput_rps, summary.output_throughput_tps
    console.print(f"throughput {r.value:.3f} req/s [{r.low:.3f}, {r.high:.3f}] · output {o.value:.1f} tok/s "
                  f"[{o.low:.1f}, {o.high:.1f}] · errors {summary.errors} ({summary.error_rate:.1%})"
                  + (f" · client errors {summary.client_errors}" if summary.client_errors else ""), highlight=False)
    if summary.goodput_rps is not None:
        g = summary.goodput_rps
        met = ", ".join(f"{k} {'met' if v else 'MISSED'}" for k, v in summary.slo_met.items())
        console.print(f"goodput {g.value:.3f} req/s [{g.low:.3f}, {g.high:.3f}] "
                      f"({summary.slo_attainment:.1%} of requests meet every SLO) · {met}", highlight=False)
    lag = summary.schedule_lag
    if lag:
        console.print(f"schedule lag p50 {lag['p50'] * 1000:.2f} ms · p99 {lag['p99'] * 1000:.2f} ms · "
                      f"max {lag['max'] * 1000:.2f} ms", highlight=False)
    if summary.client_overloaded:
        console.print(overload_warning(summary), highlight=False)
    if summary.engine:
        from tracetune.engine_adapter.metrics import EngineMetrics

        counters = EngineMetrics.from_dict(summary.engine)
        hit, acc = counters.prefix_cache_hit_rate, counters.spec_decode_acceptance_rate
        console.print(
            f"engine: prefix-cache hit rate {'-' if math.isnan(hit) else f'{hit:.1%}'} "
            f"({counters.prefix_cache_hits:.0f}/{counters.prefix_cache_queries:.0f} tokens) · speculative acceptance "
            f"{'-' if math.isnan(acc) else f'{acc:.1%}'} · preemptions {counters.preemptions:.0f}", highlight=False)
    for example in summary.error_examples:
        from rich.markup import escape  # the example quotes the server's answer: its brackets are text

        console.print(f"[red]error example:[/] {escape(example)}", highlight=False, markup=True)


@contextlib.contextmanager
def serving_target(args: argparse.Namespace, config: EngineConfig | None, out_dir: Path,
                   console) -> Iterator[tuple[Engine, Path | None, EngineInfo]]:
    """The engine to measure: `--endpoint URL` (already running) or the --engine server (vLLM unless
    named) started here (and always stopped). Yields (engine, tokenizer directory or None, what to record about it)."""
    engine = None
    try:
        if args.endpoint:
            from tracetune.engine_adapter.registry import engine_kind

            kind = engine_kind("openai")
            engine = kind.make()
            engine.start(kind.load_config({"base_url": args.endpoint, "model": args.served_model,
                                           "api_key_env": args.api_key_env}))
            engine.wait_healthy(60)
            yield engine, (Path(args.tokenizer) if args.tokenizer else None), {"endpoint": args.endpoint}
        else:
            from tracetune.cli.engine_options import chosen_engine

            assert config is not None, "prepare_run reads the settings of an engine started here"
            kind = chosen_engine(args)
            platform = kind.platform()
            engine = kind.make(out_dir, platform=platform)
            with console.status(f"starting {kind.shown}…") as status:
                t0 = time.perf_counter()
                engine.launch(config, args.start_timeout, on_tick=lambda s: status.update(
                    f"starting {kind.shown}… {s:.0f}s (log: {engine.log_path})"))
            console.print(f"{kind.shown} healthy after {time.perf_counter() - t0:.1f}s (log: {engine.log_path})")
            yield engine, Path(str(config.model_dump()["model"])), {
                "engine": kind.name, "config": json.loads(config.model_dump_json()), "platform": platform.value}
    finally:
        if engine is not None:
            engine.stop()


def prepare_run(args: argparse.Namespace, options: ReplayOptions, console) -> tuple[Trace, EngineConfig | None, Path]:
    """Checks every input before anything starts or is created: (trace, engine config or None,
    results dir: `--out`, or a new one beside it where it holds an earlier run's results)."""
    from tracetune.cli.checks import check_listening, check_tokenizer_dir
    from tracetune.cli.run_files import fresh_out_dir
    from tracetune.errors import InputError
    from tracetune.replay.trace import load_trace

    trace = load_trace(args.trace)
    needs_tokens = any(r.input_length is not None for r in trace.records)
    if args.endpoint and needs_tokens and not args.tokenizer:
        raise InputError(f"{args.trace} has length-only requests: pass --tokenizer DIR (the served model's "
                         f"tokenizer) so prompts of the right token counts can be made")
    if args.tokenizer:
        check_tokenizer_dir(args.tokenizer)
    config = None
    if args.endpoint:  # a wrong host or port is named now, not after a minute of health checks
        check_listening(args.endpoint)
    else:  # a bad --model or engine flag fails here, before the results directory exists
        from tracetune.cli.engine_options import resolve_engine_config

        config = resolve_engine_config(args, lambda m: console.print(f"[dim]·[/] {m}"))
    out_dir = args.out or Path("runs") / f"{args.command}-{dt.datetime.now().strftime('%Y%m%d-%H%M%S')}"
    return trace, config, fresh_out_dir(out_dir, console)


def prepared_requests(trace: Trace, options: ReplayOptions, tokenizer_dir: Path | None, console, *,
                      flag: str = "--tokenizer") -> list[PreparedRequest]:
    """The trace's requests with their text (prompts synthesised for length-only requests, with the
    tokenizer in `tokenizer_dir`, which `flag` named: one that does not load is an `InputError`)."""
    from tracetune.errors import InputError
    from tracetune.replay.send import prepare

    synthesizer = None
    if any(r.input_length is not None for r in trace.records):
        from tracetune.replay.synth import PromptSynthesizer

        with console.status("synthesising prompts for length-only requests…"):
            try:
                tokenizer = _tokenizer(tokenizer_dir)
            except Exception as exc:  # transformers raises many kinds for a folder that is not a tokenizer
                why = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
                raise InputError(f"{flag} {tokenizer_dir}: no tokenizer loads from it ({why}); name the served "
                                 f"model's folder") from None
            synthesizer = PromptSynthesizer(tokenizer)
    return prepare(trace, options, synthesizer)


def engine_with_metrics(engine: Engine) -> Engine | None:
    """`engine` if it serves Prometheus metrics (for its counters), else None."""
    try:
        engine.metrics()
        return engine
    except Exception:  # an endpoint without /metrics: measure without engine counters
        return None


def replay_command(args: argparse.Namespace, console) -> int:
    """`tune replay`: every request's record is on disk as it finishes; Ctrl-C or SIGTERM stops
    sending and keeps what finished, with a partial summary marked interrupted (exit 130 / 143)."""
    from tracetune.cli.run_files import interruptible

    run = ReplayRun()
    with interruptible() as caught:
        try:
            return _replay(args, console, run)
        except KeyboardInterrupt:
            run.interrupted(caught, console)
            return caught.exit_code
        finally:
            run.close()


@dataclasses.dataclass
class ReplayRun:
    """What a replay has so far: its records (on disk as they come), and summary.json's fields."""

    log: RecordLog | None = None  # once the results folder is known
    payload: dict[str, object] = dataclasses.field(default_factory=dict)  # set when sending starts
    options: ReplayOptions | None = None
    slos: Sequence[SLO] = ()

    def close(self) -> None:
        if self.log is not None:
            self.log.close()

    def write_summary(self, summary: Summary | None, **more: object) -> Path:
        from tracetune.cli.run_files import SUMMARY_FILE
        from tracetune.files import write_atomic

        assert self.log is not None, "a summary is written once the records' folder is known"
        path = self.log.path.with_name(SUMMARY_FILE)
        data = {**self.payload, **more, "summary": None if summary is None else summary.as_dict()}
        write_atomic(path, json.dumps(data, indent=2, default=str))
        return path

    def interrupted(self, caught: Interrupt, console) -> None:
        """Keep what an interrupted replay measured: its records are on disk; add a partial summary."""
        self.close()
        if not self.payload or self.log is None or self.options is None:
            console.print(f"\ninterrupted ({caught.name}) before any request was sent; nothing was written",
                          highlight=False)
            return
        records = sorted(self.log.records, key=lambda r: r.index)
        summary = None
        with contextlib.suppress(Exception):  # the records matter more than a summary of them
            summary = summarize_records(records, self.options, self.slos) if records else None
        path = self.write_summary(summary, interrupted=True, requests_finished=len(records))
        kept = f"the {len(records)} requests that finished are in {self.log.path}, and" if records else \
            "no request had finished;"
        console.print(f"\ninterrupted ({caught.name}): {kept} a partial summary marked interrupted is in {path}",
                      highlight=False)


def summarize_records(records: Sequence[RequestRecord], options: ReplayOptions, slos: Sequence[SLO]) -> Summary:
    """The summary of the records an interrupted replay kept, over the time they span."""
    from tracetune.replay.metrics import summarize
    from tracetune.replay.types import ReplayResult

    duration = max(r.send_s + r.e2e_s for r in records)
    return summarize(ReplayResult(records=list(records), duration_s=duration, options=options,
                                  sent=len(records), planned=len(records)), slos)


def _replay(args: argparse.Namespace, console, run: ReplayRun) -> int:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from tracetune.cli.run_files import RECORDS_FILE, RecordLog
    from tracetune.errors import InputError, TuneError
    from tracetune.replay.metrics import parse_slos, summarize
    from tracetune.replay.send import replay
    from tracetune.replay.types import ReplayOptions

    run.slos = slos = parse_slos(args.slo)
    if args.time_scale is not None and args.rate_scale is not None:
        raise InputError("give --time-scale or --rate-scale, not both")
    time_scale = args.time_scale if args.time_scale is not None else 1.0 / (args.rate_scale or 1.0)
    run.options = options = ReplayOptions(
        time_scale=time_scale, max_requests=args.max_requests, max_duration_s=args.max_duration,
        warmup_requests=args.warmup, mode=args.mode, concurrency=args.concurrency, ignore_eos=not args.no_ignore_eos,
        max_output_tokens=args.max_output_tokens, request_timeout_s=args.request_timeout, keep_text=args.keep_text)
    trace, config, out_dir = prepare_run(args, options, console)
    run.log = RecordLog(out_dir / RECORDS_FILE)
    with serving_target(args, config, out_dir, console) as (engine, tokenizer_dir, engine_info):
        requests = prepared_requests(trace, options, tokenizer_dir, console,
                                     flag="--tokenizer" if args.endpoint else "--model")
        measured = max(len(requests) - options.warmup_requests, 0)
        procs = client_procs(args, requests[options.warmup_requests:], engine_info, config)
        with Progress(TextColumn("[bold]replay"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[info]}"),
                      TimeElapsedColumn(), console=console, transient=False, refresh_per_second=4) as progress:
            task = progress.add_task("replay", total=measured, info="warming up")

            def on_progress(done: int, total: int, in_flight: int) -> None:
                progress.update(task, completed=done, info=f"in flight {in_flight}")

            run.payload = {"trace": str(args.trace), **engine_info,
                           "options": vars(options) | {"slo": args.slo, "client_procs": procs}}
            endpoint = engine.endpoint
            assert endpoint is not None, "serving_target yields a started engine"
            result = replay(endpoint.base_url, endpoint.model, requests, options,
                            engine=engine_with_metrics(engine), headers=endpoint.headers or None,
                            on_progress=on_progress, client_procs=procs, on_record=run.log)
    if run.log is not None:
        run.log.finish_in_trace_order()
    try:
        summary = summarize(result, slos)
    except Exception as exc:  # a bug, or a value no one foresaw: the records are on disk all the same
        raise TuneError(f"the replay's summary failed ({type(exc).__name__}: {exc}); the {len(result.records)} "
                        f"measured requests are kept in {run.log.path}") from exc
    path = run.write_summary(summary)
    print_summary(summary, console)
    console.print(f"wrote {path} and {run.log.path}")
    from tracetune.replay.metrics import endpoint_warning

    if (warning := endpoint_warning(summary)) is not None:
        console.print(f"error: {warning}", style="bold red", markup=False, highlight=False)
        return 1
    return 0
