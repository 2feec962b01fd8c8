"""`tune --trace FILE ...`: the main job. Builds the study from flags, shows progress, prints the
Pareto front and writes best.json / pareto.json."""

from __future__ import annotations

import argparse
import json
import math
import re
from pathlib import Path
from typing import Any

TUNE_EPILOG = """\
examples:
  tune --trace examples/traffic.jsonl --trials 6 --eager --slo "ttft:p99<2s,tpot:p99<100ms"   # capacity at the SLO
  tune --trace traffic.jsonl --slo "ttft:p99<1s,tpot:p99<50ms" --gpu-hour-cost 3.5 --target-rate 40
  tune --trace traffic.jsonl --space my_space.yaml --slo "ttft:p99<500ms,tpot:p50<50ms" --max-quality-loss 0.05
  tune --trace traffic.jsonl --study nightly --storage postgresql://tuner@db/tracetune --trials 40
  tune --trace traffic.jsonl --study nightly          # run again: resumes the study, does not start over
  # several workers (any hosts) on one study: same --study and --storage, one engine each
  tune --trace traffic.jsonl --study nightly --storage postgresql://tuner@db/tracetune --trials 40 --engine-port 8100
"""


def build_parser() -> argparse.ArgumentParser:
    from engine_adapter.cli_options import add_engine_options
    from replay.cli import add_client_options

    p = argparse.ArgumentParser(
        prog="tune", formatter_class=argparse.RawDescriptionHelpFormatter, epilog=TUNE_EPILOG,
        description="Search engine configurations for a recorded trace: Pareto front of latency, throughput "
                    "and quality. Subcommands: tune {model,engine,replay,trace,record} --help.")
    p.add_argument("--trace", required=True, type=Path, metavar="FILE", help="native JSONL trace")
    p.add_argument("--space", type=Path, metavar="FILE", help="search-space YAML (default: search_spaces/default.yaml)")
    p.add_argument("--trials", type=int, default=6, metavar="N", help="total trials in the study (default 6)")
    p.add_argument("--timeout", type=float, metavar="S", help="stop starting new trials after S seconds")
    p.add_argument("--study", metavar="NAME", help="study name (default: derived from the trace file name)")
    p.add_argument("--storage", metavar="URL", help="SQLAlchemy URL (default: sqlite in the run directory)")
    p.add_argument("--run-dir", type=Path, metavar="DIR", help="logs and outputs (default runs/STUDY)")
    p.add_argument("--slo", metavar="SPEC", help="constraints, e.g. 'ttft:p99<500ms,tpot:p50<50ms'")
    p.add_argument("--max-quality-loss", metavar="GATE",
                   help="quality gate, beyond the reference's own noise floor: kld:0.01 (KL divergence, nats/token), "
                        "ppl:+1%% (perplexity), top1:0.99 (top-1 agreement), or a number of nats (NLL increase "
                        "per token)")
    p.add_argument("--objectives", metavar="LIST",
                   help="default: ttft_p99,capacity,quality_loss with --slo (ttft_p99,output_tps,quality_loss "
                        "without); also goodput, request_tps, tpot_p50, e2e_p99, ...")
    p.add_argument("--attainment", type=float, default=0.95, metavar="F",
                   help="capacity: share of requests that must meet every --slo threshold at a load level "
                        "(default 0.95)")
    p.add_argument("--precision", type=float, default=0.05, metavar="F",
                   help="capacity: stop when the bracket [pass, fail] is within this ratio (default 0.05 = 5%%)")
    p.add_argument("--max-duration", type=float, metavar="S",
                   help="measure only the requests of the trace's first S seconds (after --time-scale)")
    p.add_argument("--gpu-hour-cost", type=float, metavar="USD",
                   help="price of one GPU hour: adds $ per 1M output (and input) tokens at capacity")
    p.add_argument("--target-rate", type=float, metavar="RPS",
                   help="requests/s of this traffic to serve: adds the replicas and GPUs each config needs")
    p.add_argument("--sampler", choices=["nsga2", "tpe", "gp", "random"], default="nsga2")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--engine", dest="engine_type", choices=["vllm", "openai"], default="vllm",
                   help="vllm (tracetune starts each config) or openai (a running endpoint: cannot be tuned)")
    p.add_argument("--probe-prompts", type=int, default=16, metavar="N",
                   help="quality probe size, prompts from the trace (default 16: intervals are over prompts)")
    p.add_argument("--probe-tokens", type=int, default=32, metavar="N",
                   help="tokens per probe continuation (default 32)")
    p.add_argument("--time-scale", type=float, default=1.0, metavar="F", help="multiply inter-arrival times by F")
    p.add_argument("--max-requests", type=int, metavar="N", help="measure at most N requests per trial")
    p.add_argument("--warmup", type=int, default=2, metavar="N", help="unmeasured warm-up requests per trial")
    p.add_argument("--request-timeout", type=float, default=600.0, metavar="S",
                   help="a request not finished after S seconds counts as failed (default 600)")
    add_client_options(p)
    p.add_argument("--heartbeat", type=int, default=30, metavar="S",
                   help="liveness mark in the study database every S seconds; a worker silent for 2*S is "
                        "considered dead and its trial is re-run (default 30)")
    p.add_argument("--engine-port", type=int, metavar="N",
                   help="port for this worker's engines (default: a free port)")
    p.add_argument("--api-key-env", metavar="NAME",
                   help="start engines that require the API key in environment variable NAME and send it "
                        "with every request (the key is never stored)")
    p.add_argument("--try", dest="try_first", action="append", default=[], metavar="JSON",
                   help="search-space values to try first, e.g. '{\"max_num_seqs\": 32}' (repeatable; "
                        "unset parameters are sampled)")
    add_engine_options(p)
    return p


def _default_study_name(trace: Path) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", trace.stem) or "study"


def _fmt(name: str, value: float) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if name == "capacity":
        return f"{value:.3g} req/s"
    if name.endswith(("_p50", "_p90", "_p99", "_mean")):
        return f"{value * 1000:.0f} ms"
    if name == "quality_loss":
        return f"{value:+.4f}"
    return f"{value:.2f}"


def main(argv: list[str], console) -> int:
    from engine_adapter.errors import InputError

    args = build_parser().parse_args(argv)
    if args.engine_type == "openai":
        raise InputError("--engine openai is an endpoint tracetune cannot reconfigure, so there is nothing to "
                         "search; measure it with `tune replay --trace FILE --endpoint URL`")
    if args.trials < 1:
        raise InputError(f"--trials must be >= 1, got {args.trials}")
    if args.heartbeat < 1:
        raise InputError(f"--heartbeat must be >= 1 second, got {args.heartbeat}")
    if not args.request_timeout > 0:
        raise InputError(f"--request-timeout must be > 0, got {args.request_timeout}")
    for flag, value in (("--gpu-hour-cost", args.gpu_hour_cost), ("--target-rate", args.target_rate),
                        ("--max-duration", args.max_duration)):
        if value is not None and not value > 0:
            raise InputError(f"{flag} must be > 0, got {value}")
    import os

    api_key = None
    if args.api_key_env:
        api_key = os.environ.get(args.api_key_env)
        if not api_key:
            raise InputError(f"--api-key-env {args.api_key_env}: that environment variable is not set or empty")
        # vLLM reads its key from VLLM_API_KEY: through the environment it never appears in the
        # server's command line, the engine config or the study database.
        os.environ["VLLM_API_KEY"] = api_key

    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from engine_adapter.cli_options import engine_config_from_args
    from engine_adapter.models import resolve_model
    from engine_adapter.platform import detect_platform
    from replay.metrics import parse_slos
    from tuner.quality import parse_gate
    from replay.runner import ReplayOptions
    from replay.trace import load_trace
    from search_spaces.space import DEFAULT_SPACE, load_space
    from tuner.storage import display_url, secret_values
    from tuner.study import StudySettings, Tuner, parse_objectives

    slos = parse_slos(args.slo)
    gate = parse_gate(args.max_quality_loss)
    enqueue = []
    for item in args.try_first:
        try:
            params = json.loads(item)
        except json.JSONDecodeError as exc:
            raise InputError(f"--try {item!r}: not valid JSON ({exc.msg})") from None
        if not isinstance(params, dict):
            raise InputError(f"--try {item!r}: expected a JSON object of search-space values")
        enqueue.append(params)
    objectives = parse_objectives(args.objectives, has_slo=bool(slos))
    trace = load_trace(args.trace)
    space = load_space(args.space or DEFAULT_SPACE)
    study_name = args.study or _default_study_name(args.trace)
    run_dir = args.run_dir or Path("runs") / study_name
    storage = args.storage or f"sqlite:///{(run_dir / 'study.db').resolve()}"
    platform = detect_platform()
    model_dir = resolve_model(args.model, lambda m: console.print(f"[dim]·[/] {m}"))
    # Engine flags given on the command line are the base every trial starts from.
    base_config = engine_config_from_args(args, model_dir)
    base = {k: v for k, v in base_config.model_dump(exclude_defaults=True).items()
            if k not in ("model", "speculative")}
    if api_key is None:
        # A key passed straight to vLLM (--engine-arg=--api-key=...) is needed by our requests too.
        extra = list(base_config.extra_args)
        for i, arg in enumerate(extra):
            if arg == "--api-key" and i + 1 < len(extra):
                api_key = extra[i + 1]
            elif arg.startswith("--api-key="):
                api_key = arg.split("=", 1)[1]
    replay_options = ReplayOptions(time_scale=args.time_scale, max_requests=args.max_requests,
                                   max_duration_s=args.max_duration, warmup_requests=args.warmup,
                                   request_timeout_s=args.request_timeout)
    capacity_options = None
    if "capacity" in objectives:
        from replay.capacity import CapacityOptions

        capacity_options = CapacityOptions(slos=tuple(slos), attainment=args.attainment, precision=args.precision)
    # Keys, tokens and passwords given to the tuner (engine environment, engine arguments, the
    # storage URL, the environment tracetune runs in) are scrubbed from everything stored.
    secrets = secret_values(env=base_config.env, process_env=dict(os.environ), args=base_config.extra_args,
                            urls=[storage],
                            extra=[api_key] if api_key else [])
    settings = StudySettings(study_name=study_name, storage_url=storage, trials=args.trials, objectives=objectives,
                             slos=slos, max_quality_loss=gate, sampler=args.sampler,
                             seed=args.seed, replay=replay_options, capacity=capacity_options,
                             economics={k: v for k, v in (("gpu_hour_cost", args.gpu_hour_cost),
                                                          ("target_rate", args.target_rate)) if v is not None},
                             probe_prompts=args.probe_prompts,
                             probe_tokens=args.probe_tokens, start_timeout_s=args.start_timeout,
                             timeout_s=args.timeout, enqueue=enqueue, heartbeat_s=args.heartbeat,
                             engine_port=args.engine_port, secrets=secrets, api_key=api_key,
                             client_procs=args.client_procs)
    shown_storage = display_url(storage)
    synthesizer = None
    if any(r.input_length is not None for r in trace.records):
        from transformers import AutoTokenizer

        from replay.synth import PromptSynthesizer
        synthesizer = PromptSynthesizer(AutoTokenizer.from_pretrained(str(model_dir)))

    progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                        TextColumn("{task.fields[info]}"), TimeElapsedColumn(), console=console)
    replay_task = None

    def on_replay_progress(done: int, total: int, in_flight: int) -> None:
        if replay_task is not None:
            progress.update(replay_task, completed=done, total=total, info=f"in flight {in_flight}")

    def report(event: str, **f: Any) -> None:
        nonlocal replay_task
        if event == "study":
            console.print(f"study [bold]{f['name']}[/] · storage {shown_storage} · platform {platform.value} · "
                          f"{f['done']} trials done, {f['remaining']} to run")
        elif event == "reference_start":
            console.print("[bold]reference[/] (unquantized, auto KV cache, no speculation): measuring")
        elif event == "reference_reused":
            console.print("reference: reusing the study's stored reference continuations")
        elif event == "reference_done":
            s = f["summary"]
            console.print(f"reference: TTFT p99 {_fmt('ttft_p99', s.latency['ttft']['p99'].value)} · "
                          f"{s.output_throughput_tps.value:.1f} tok/s at the trace's rate")
        elif event == "client_overloaded":
            console.print(f"  {f['label']}: [yellow]client overloaded[/] (schedule lag p99 {f['lag_p99_s'] * 1000:.0f} ms):"
                          f" measured again with {f['procs']} client processes", highlight=False)
        elif event == "capacity_step":
            console.print("  " + f["step"].line(f["label"]), highlight=False)
        elif event == "capacity_done":
            console.print(f"  {f['label']}: {f['capacity'].headline()}", highlight=False)
        elif event == "trial_start":
            diff = {k: v for k, v in f["values"].items()}
            console.print(f"\n[bold]trial {f['number']}[/] {diff}")
        elif event == "engine_starting":
            replay_task = progress.add_task(f"  {f['label']}: engine starting", total=None, info="")
        elif event == "engine_ready" and replay_task is not None:
            progress.update(replay_task, description=f"  {f['label']}: replay (engine up in {f['startup_s']:.0f}s)")
        elif event == "quality" and replay_task is not None:
            progress.update(replay_task, info="quality probe")
        elif event == "quality_reused":
            console.print(f"  {f['label']}: quality as measured for trial {f['trial']} (same weights, precisions, "
                          f"kernels and decoding path)", highlight=False)
        elif event == "probe_noisy":
            console.print(f"  {f['label']}: [yellow]quality probe too noisy[/]: lossless by construction, yet measured "
                          f"beyond the reference's noise floor (KLD {f['kld'].value:.4f}); the gate does not count it "
                          f"against this configuration", highlight=False)
        elif event == "trial_done":
            obj = " · ".join(f"{k} {_fmt(k, v)}" for k, v in f["objectives"].items())
            feas = "feasible" if all(c <= 0 for c in f["constraints"]) else "[yellow]violates constraints[/]"
            console.print(f"  trial {f['number']}: {obj} · {feas} · {f['wall_s']:.0f}s "
                          f"(engine start {f['startup_s']:.0f}s)")
        elif event == "trial_failed":
            console.print(f"  trial {f['number']}: [red]{f['status']}[/] (infeasible) · {f['reason'][:300]}",
                          highlight=False)
        elif event == "duplicate":
            console.print(f"  trial {f['number']}: same configuration as trial {f['original']}: result reused, "
                          f"no engine started")
        elif event == "waiting":
            who = f" (worker {f['owner']})" if f.get("owner") else ""
            console.print(f"  waiting for {f['what']}{who}: another worker is measuring it")
        elif event == "timeout":
            console.print(f"[yellow]--timeout {f['limit_s']:g} s reached[/]: no new trial started; {f['done']} of "
                          f"{f['trials']} trials done. Run the same command to go on.", highlight=False)
        elif event == "recovered":
            console.print(f"  trials {f['trials']} belonged to a worker that is gone: marked failed and queued again")
        if event in ("trial_done", "trial_failed") and replay_task is not None:
            progress.remove_task(replay_task)
            replay_task = None

    # Choices this platform can never run are removed up front, with the reason, rather than
    # rejected trial after trial.
    from search_spaces.translate import unrunnable_choices

    never = unrunnable_choices(space, platform=platform, model_dir=model_dir, base=base)
    for name, choices in never.items():
        for choice, reason in choices.items():
            console.print(f"[dim]·[/] search space: {name}={choice} removed on this {platform.value} machine: {reason}",
                          highlight=False)
    if never:
        space = space.without({name: list(choices) for name, choices in never.items()})
    # An engine flag given on the command line (e.g. --eager) holds for the whole study.
    space, pinned = space.pinned(base)
    for name in pinned:
        console.print(f"[dim]·[/] search space: {name}={base[name]} for every trial (set on the command line)",
                      highlight=False)
    unknown = sorted({k for params in enqueue for k in params} - set(space.parameters))
    if unknown:
        raise InputError(f"--try names {unknown}, which are not parameters of the search space {space.name!r}")
    for params in enqueue:
        for name, value in params.items():
            choices = space.parameters[name].choices
            if choices is not None and value not in choices:
                why = never.get(name, {}).get(value)
                raise InputError(f"--try {name}={value!r}: not a choice of the search space {space.name!r}"
                                 + (f" on this {platform.value} machine ({why})" if why else f"; choose from {choices}"))

    def make_checkpoint(scheme: str) -> Path:
        from engine_adapter.quantize import quantized_checkpoint
        return quantized_checkpoint(model_dir, scheme, lambda m: console.print(f"  [dim]·[/] {m}"))

    run_dir.mkdir(parents=True, exist_ok=True)  # only once every input has been checked
    tuner = Tuner(settings, trace=trace, space=space, model_dir=model_dir, platform=platform, run_dir=run_dir,
                  base=base, make_checkpoint=make_checkpoint, synthesizer=synthesizer, report=report,
                  on_replay_progress=on_replay_progress)
    import signal

    def on_sigterm(signum, frame):
        # SIGTERM (a scheduler, `kill`) stops as cleanly as Ctrl-C: engines stopped, trial re-queued.
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, on_sigterm)
    try:
        with progress:
            study = tuner.run()
    except KeyboardInterrupt:
        console.print(f"\n[bold]interrupted[/]: every engine was stopped; completed trials are saved in "
                      f"{shown_storage}. Resume with the same command (study {study_name!r}); the interrupted "
                      f"trial runs again.", highlight=False)
        return 130
    finally:
        signal.signal(signal.SIGTERM, previous)

    report_results(tuner, study, args, console, run_dir)
    return 0


def _row(label: Any, values: dict[str, float], result: dict, ref_config: dict, args) -> dict:
    """One candidate of the final table: the reference or a trial, with what it was measured."""
    from tuner.front import economics
    from tuner.study import config_diff

    config = result.get("config") or {}
    summary = result.get("summary") or {}
    diff = {} if label == "reference" else config_diff(config, ref_config) if config else {}
    if "model" in diff and "weight_bits" in (result.get("values") or {}):
        # a quantized checkpoint's path says less than the search-space value that made it
        diff = {"weight_bits": result["values"]["weight_bits"], **{k: v for k, v in diff.items() if k != "model"}}
    return {"trial": label, "values": values, "config": config, "differs_from_reference": diff, "summary": summary,
            "quality": result.get("quality") or {}, "capacity": summary.get("capacity"),
            "economics": economics(summary.get("capacity"), gpu_hour_cost=args.gpu_hour_cost,
                                   target_rate=args.target_rate)}


def report_results(tuner, study, args, console, run_dir: Path) -> None:
    """The front (vLLM's defaults competing like any trial), the verdict in plain words, failures
    grouped by reason, and best.json / pareto.json."""
    from tuner.front import REFERENCE, Candidate, decide
    from tuner.study import OBJECTIVES, pareto_trials

    name, objectives = tuner.s.study_name, tuner.s.objectives
    directions = [OBJECTIVES[o] for o in objectives]
    reference = tuner.store.reference(name)
    ref_config = reference["config"] if reference else {}
    if tuner.reference_values is None and reference and reference.get("summary"):
        tuner._set_reference_values(reference["summary"])
    results = {r["trial_number"]: r for r in tuner.store.trials(name)}
    trials = {t.number: t for t in pareto_trials(study)}
    ref_candidate = None
    if tuner.reference_values is not None:
        ref_candidate = Candidate(REFERENCE, tuple(tuner.reference_values))
    decision = decide([Candidate(n, tuple(t.values)) for n, t in sorted(trials.items())], ref_candidate,
                      objectives, directions)
    rows = []
    for c in decision.front:
        result = {"config": ref_config, "summary": reference.get("summary"), "quality": None} \
            if c.label == REFERENCE else results.get(c.label, {})
        rows.append(_row(c.label, dict(zip(objectives, c.values)), result, ref_config, args))
    console.print(_front_table(rows, objectives, name, len(study.trials), args))
    _print_quality_floor(reference, results, console)
    console.print(f"[bold]verdict[/]: {decision.verdict()}", highlight=False)
    if decision.dominated_by_reference:
        console.print(f"  vLLM's defaults beat trials {', '.join(map(str, decision.dominated_by_reference))} on every "
                      f"objective: they are not on the front.", highlight=False)
    _print_failures(study, console)
    (run_dir / "pareto.json").write_text(json.dumps({"study": name, "objectives": objectives, "trials": rows,
                                                     "verdict": decision.verdict()}, indent=2, default=str))
    if decision.best is None:
        console.print("no feasible measured trial yet: nothing on the front.")
        return
    best = next(r for r in rows if r["trial"] == decision.best.label)
    best = {**best, "verdict": decision.verdict(), "by": decision.by,
            "reference_is_best": decision.reference_is_best}
    (run_dir / "best.json").write_text(json.dumps(best, indent=2, default=str))
    which = "vLLM's defaults (the reference)" if decision.reference_is_best else f"trial {best['trial']}"
    console.print(f"best by {decision.by} on the front: {which} · wrote {run_dir / 'best.json'} and "
                  f"{run_dir / 'pareto.json'}", highlight=False)


def _front_table(rows: list[dict], objectives: list[str], name: str, n_trials: int, args):
    from rich.table import Table

    from tuner.quality import units_text

    has_capacity = any(r["capacity"] for r in rows)
    on_front = sum(r["trial"] != "reference" for r in rows)
    table = Table(title=f"Pareto front of study {name} ({on_front} of {n_trials} trials + vLLM's defaults)")
    table.add_column("trial", justify="right")
    table.add_column("differs from reference", overflow="fold")
    for objective in objectives:
        table.add_column(objective, justify="right")
    if has_capacity:
        table.add_column("capacity bracket", justify="right")
    if args.gpu_hour_cost is not None:
        table.add_column("$/1M out tok", justify="right")
    if args.target_rate is not None:
        table.add_column(f"GPUs for {args.target_rate:g} req/s", justify="right")
    has_units = any((r["quality"] or {}).get("kld") for r in rows)
    if has_units:
        table.add_column("quality vs reference", justify="right")
    for r in rows:
        cells = []
        for objective in objectives:
            value = r["values"][objective]
            # (capacity's interval is its bracket, a column of its own)
            ci = None if objective == "capacity" or (r["trial"] == "reference" and objective == "quality_loss") \
                else _ci_of(objective, r["summary"], r["quality"])
            cells.append(_fmt(objective, value) + (f" [dim][{_fmt(objective, ci[0])}, {_fmt(objective, ci[1])}][/]" if ci else ""))
        if has_capacity:
            cells.append(_bracket(r["capacity"]))
        econ = r["economics"]
        if args.gpu_hour_cost is not None:
            cells.append(f"{econ.get('usd_per_1m_output_tokens', math.nan):.3g}")
        if args.target_rate is not None:
            cells.append(f"{econ.get('gpus_total', math.nan):g}")
        if has_units:
            cells.append(units_text(r["quality"]) if r["trial"] != "reference" else "-")
        label = "ref" if r["trial"] == "reference" else str(r["trial"])
        diff = "(vLLM's defaults)" if r["trial"] == "reference" else \
            ", ".join(f"{k}={v}" for k, v in r["differs_from_reference"].items() if k != "model") or "(none)"
        table.add_row(label, diff, *cells)
    return table


def _print_quality_floor(reference: dict | None, results: dict[int, dict], console) -> None:
    """The probe's noise floor and the study's self-check on it (lossless configurations within it)."""
    from tuner.quality import floor_text, self_check

    floor = floor_text((reference or {}).get("probe"))
    check = self_check([(n, r.get("quality")) for n, r in sorted(results.items())])
    for line in (floor, check):
        if line:
            console.print(("[yellow]" + line + "[/]") if "too noisy" in line else line, highlight=False)


def _bracket(capacity: dict | None) -> str:
    from replay.capacity import bracket_text, caveats

    return " · ".join([bracket_text(capacity), *caveats(capacity)]) if capacity else "-"


def _print_failures(study, console) -> None:
    from tuner.front import group_failures

    failed = [t for t in study.trials if t.user_attrs.get("status") in ("rejected", "engine_failed", "failed",
                                                                         "unmeasurable")
              or (t.user_attrs.get("status") == "measured" and t.user_attrs.get("failure_reason"))]
    causes = group_failures([(t.number, t.user_attrs["status"], t.user_attrs.get("failure_reason", "")[:300])
                             for t in failed])
    for status, reason, numbers in causes:
        console.print(f"  {status} x{len(numbers)} (trials {', '.join(map(str, numbers[:8]))}"
                      f"{', ...' if len(numbers) > 8 else ''}): {reason}", highlight=False)


def _ci_of(name: str, summary: dict, quality: dict):
    if name == "quality_loss" and quality:
        q = quality["nll_delta_per_token"]
        return q["ci_low"], q["ci_high"]
    for metric in ("ttft", "tpot", "itl", "e2e"):
        if name.startswith(metric + "_") and summary:
            e = summary["latency_s"][metric][name.split("_", 1)[1]]
            return e["ci_low"], e["ci_high"]
    key = {"output_tps": "output_throughput_tps", "request_tps": "request_throughput_rps", "goodput": "goodput_rps"}.get(name)
    if key and summary.get(key):
        return summary[key]["ci_low"], summary[key]["ci_high"]
    return None
