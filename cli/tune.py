"""`tune --trace FILE ...`: the main job. Builds the study from flags, shows progress, prints the
Pareto front and writes best.json / pareto.json."""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path
from typing import TYPE_CHECKING

from tracetune.cli.job import TuneRequest, make_tuner

if TYPE_CHECKING:
    import optuna
    from rich.console import Console
    from rich.progress import Progress

    from tracetune.engine_adapter.kind import EngineConfig, EngineKind
    from tracetune.quality.gate import QualityGate
    from tracetune.replay.metrics import SLO
    from tracetune.replay.types import ReplayOptions
    from tracetune.search_spaces.space import SearchSpace
    from tracetune.tuner.plan import StudyPlan
    from tracetune.tuner.settings import StudySettings
    from tracetune.tuner.study import Tuner
    from tracetune.types import ParamValues

TUNE_EPILOG = """\
the main job:
  tune --trace examples/traffic.jsonl --trials 6 --eager --slo "ttft:p99<2s,tpot:p99<100ms"   # capacity at the SLO
  tune --trace traffic.jsonl --slo "ttft:p99<1s,tpot:p99<50ms" --gpu-hour-cost 3.5 --target-rate 40
  tune --trace traffic.jsonl --space my_space.yaml --slo "ttft:p99<500ms,tpot:p50<50ms" --max-quality-loss 0.05
  tune --trace traffic.jsonl --study nightly --storage postgresql://tuner@db/tracetune --trials 40
  tune --trace traffic.jsonl --study nightly          # run again: resumes the study, does not start over
  # each trial on vLLM or llama.cpp (search_spaces/cpu.yaml; the default on a CPU with llama.cpp built)
  tune --trace traffic.jsonl --engine vllm+llamacpp --trials 10 --slo "ttft:p99<2s,tpot:p99<100ms"
  tune --trace traffic.jsonl --engine llamacpp --parallel 8   # llama.cpp alone, 8 slots in every trial
  # draft models searched too: a small model of the family, and the model's own 8-bit checkpoint
  tune --trace t.jsonl --model /models/SmolLM2-1.7B --draft-model /models/SmolLM2-135M --draft-model derived:w8a8
  # one worker per GPU of this host, one study (0+1: a worker on two GPUs, for --tensor-parallel-size 2)
  tune --trace traffic.jsonl --gpus 0,1 --slo "ttft:p99<1s,tpot:p99<50ms" --trials 24
  # several workers (any hosts) on one study: same --study and --storage, one engine each
  tune --trace traffic.jsonl --study nightly --storage postgresql://tuner@db/tracetune --trials 40 --engine-port 8100
"""


def add_options(p: argparse.ArgumentParser) -> None:
    """The main job's options, on the root parser (`tune --help` lists them)."""
    from tracetune.cli.capacity import add_capacity_options
    from tracetune.cli.engine_options import add_engine_options
    from tracetune.cli.options import add_slo_option, add_trace_option, positive_float, positive_int
    from tracetune.engine_adapter.registry import engine_kind
    from tracetune.tuner.objectives import DEFAULT_SAMPLER, SAMPLERS

    add_trace_option(p, help="native JSONL trace: runs the main job")
    p.add_argument("--space", type=Path, metavar="FILE", help="search-space YAML (default: search_spaces/default.yaml)")
    p.add_argument("--trials", type=positive_int, default=6, metavar="N", help="total trials in the study (default 6)")
    p.add_argument("--timeout", type=positive_float, metavar="S", help="stop starting new trials after S seconds")
    p.add_argument("--no-presets", dest="presets", action="store_false",
                   help="no informed first trials (8-bit weights and KV cache; ngram speculation when the trace's "
                        "outputs copy their prompts): the sampler proposes every trial")
    p.add_argument("--warm-start", metavar="STUDY",
                   help="try first the configurations an earlier study on the same model and platform found best "
                        "(another trace or SLO), measured again here")
    p.add_argument("--warm-start-storage", metavar="URL", help="where that study is (default: this study's --storage)")
    p.add_argument("--patience", type=positive_int, metavar="N",
                   help=f"stop early once N measured trials in a row leave the front ({engine_kind().defaults_label} "
                        "included) unchanged; --trials stays the cap")
    p.add_argument("--no-prune", dest="prune", action="store_false",
                   help="search every trial and the reference to the end, probe every one (default: stop a search "
                        "at a load a config as good on the other objectives passes, or at the trace's rate for one "
                        "missing the SLOs or outside the quality gate there, stored as pruned; no probe of a trial "
                        "missing the SLOs at the trace's rate)")
    p.add_argument("--gpus", metavar="LIST",
                   help="run the study with one worker per GPU of this host, e.g. 0,1 (0+1: one worker on two GPUs, "
                        "for tensor parallel); each pinned with CUDA_VISIBLE_DEVICES, logs in RUN_DIR/worker-N.log")
    p.add_argument("--study", metavar="NAME", help="study name (default: derived from the trace file name)")
    p.add_argument("--storage", metavar="URL", help="SQLAlchemy URL (default: sqlite in the run directory)")
    p.add_argument("--run-dir", type=Path, metavar="DIR", help="logs and outputs (default runs/STUDY)")
    add_slo_option(p, help="constraints, e.g. 'ttft:p99<500ms,tpot:p50<50ms'")
    p.add_argument("--max-quality-loss", metavar="GATE",
                   help="quality gate, beyond the reference's own noise floor (default ppl:+1%%: a "
                        "configuration losing more is never recommended, and the verdict names its cost): "
                        "ppl:+1%% (perplexity), kld:0.01 (KL divergence, nats/token), top1:0.99 (top-1 "
                        "agreement), a number of nats (NLL increase per token), or none")
    p.add_argument("--objectives", metavar="LIST",
                   help="default: ttft_p99,capacity,quality_loss with --slo (ttft_p99,output_tps,quality_loss "
                        "without); also goodput, request_tps, tpot_p50, e2e_p99, ...")
    add_capacity_options(p)
    p.add_argument("--max-duration", type=positive_float, metavar="S",
                   help="measure only the requests of the trace's first S seconds (after --time-scale)")
    p.add_argument("--gpu-hour-cost", type=positive_float, metavar="USD",
                   help="price of one GPU hour: adds $ per 1M output (and input) tokens at capacity")
    p.add_argument("--target-rate", type=positive_float, metavar="RPS",
                   help="requests/s of this traffic to serve: adds the replicas and GPUs each config needs")
    p.add_argument("--sampler", choices=SAMPLERS, default=DEFAULT_SAMPLER,
                   help=f"how trials are proposed after the first ones (default {DEFAULT_SAMPLER}: it measured best in "
                        f"benchmarks/search_efficiency.py)")
    p.add_argument("--seed", type=int, default=0)
    from tracetune.cli.engine_options import engine_name, engines_shown

    p.add_argument("--engine", dest="engine_type", type=engine_name, default=None, metavar="NAME",
                   help=f"{engines_shown()} (tracetune starts each config), vllm+llamacpp (each trial on either, "
                        "the search space's `engine` choosing), or openai (a running endpoint: cannot be tuned). "
                        "Default: vllm+llamacpp over search_spaces/cpu.yaml on a CPU with llama.cpp installed "
                        "(no --space given), else vllm")
    _add_trial_options(p)
    add_engine_options(p)


def _add_trial_options(p: argparse.ArgumentParser) -> None:
    """How each trial is measured: its quality probe, its replay, its worker."""
    from tracetune.cli.options import default_of, nonnegative_int, port, positive_float, positive_int
    from tracetune.cli.replay import add_client_options
    from tracetune.replay.types import ReplayOptions
    from tracetune.tuner.settings import StudySettings

    prompts, tokens = default_of(StudySettings, "probe_prompts"), default_of(StudySettings, "probe_tokens")
    p.add_argument("--probe-prompts", type=positive_int, default=prompts, metavar="N",
                   help="quality probe size: texts, each a trace prompt and a continuation the reference "
                        f"samples (default {prompts}, prompts repeated when the trace has fewer)")
    p.add_argument("--probe-tokens", type=positive_int, default=tokens, metavar="N",
                   help=f"tokens per probe continuation (default {tokens}; the probe scores ~60k tokens: +-0.3 "
                        "points of perplexity on the bundled model)")
    accepted = default_of(StudySettings, "acceptance_prompts")
    p.add_argument("--acceptance-prompts", type=nonnegative_int, default=accepted, metavar="N",
                   help="a speculative trial's draft acceptance measured again on N trace prompts, with natural "
                        f"stops and forced to the recorded length, one at a time (default {accepted}; 0: not)")
    p.add_argument("--time-scale", type=positive_float, default=default_of(ReplayOptions, "time_scale"), metavar="F",
                   help="multiply inter-arrival times by F")
    p.add_argument("--max-requests", type=positive_int, metavar="N", help="measure at most N requests per trial")
    p.add_argument("--warmup", type=nonnegative_int, default=2, metavar="N",
                   help="unmeasured warm-up requests per trial")
    request_timeout = default_of(ReplayOptions, "request_timeout_s")
    p.add_argument("--request-timeout", type=positive_float, default=request_timeout, metavar="S",
                   help=f"a request not finished after S seconds counts as failed (default {request_timeout:.0f})")
    add_client_options(p)
    heartbeat = default_of(StudySettings, "heartbeat_s")
    p.add_argument("--heartbeat", type=positive_int, default=heartbeat, metavar="S",
                   help="liveness mark in the study database every S seconds; a worker silent for 2*S is "
                        f"considered dead and its trial is re-run (default {heartbeat})")
    p.add_argument("--engine-port", type=port, metavar="N",
                   help="port for this worker's engines (default: a free port)")
    p.add_argument("--api-key-env", metavar="NAME",
                   help="start engines that require the API key in environment variable NAME and send it "
                        "with every request (the key is never stored)")
    p.add_argument("--try", dest="try_first", action="append", default=[], metavar="JSON",
                   help="search-space values to try first, e.g. '{\"max_num_seqs\": 32}' (repeatable; "
                        "unset parameters are sampled)")


def default_study_name(trace: Path) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", trace.stem) or "study"


def run(args: argparse.Namespace, console: Console) -> int:
    """The main job from the root parser's arguments: check them, build the study, run it with
    progress on the console, print and write the results."""
    _check_flags(args)
    request = build_request(args, console)
    if args.gpus:
        from tracetune.cli.workers import run_study_on_gpus

        return run_study_on_gpus(args, request, console)
    tuner, progress = make_tuner(request, console)
    if _run_study(tuner, progress, request, console) is None:
        return 130
    from tracetune.cli.results import report_results

    report_results(tuner, console, request.run_dir)
    return 0


def _check_flags(args: argparse.Namespace) -> None:
    from tracetune.engine_adapter.registry import engine_kind
    from tracetune.errors import InputError

    if args.engine_type is not None and not engine_kind(args.engine_type).tunable:
        raise InputError(f"--engine {args.engine_type} is an endpoint tracetune cannot reconfigure, so there is "
                         f"nothing to search; measure it with `tune replay --trace FILE --endpoint URL`")
    # Numeric flags are checked as they are read (their argparse types, cli/options.py).


def _with_drafts(space: SearchSpace, drafts: list[str], model_dir: Path, engine: EngineKind) -> SearchSpace:
    """The space searching also the --draft-model drafts; every draft model it names checked against
    the model (`EngineKind.check_drafts`: tokenizer and vocabulary; derived ones by name) before
    anything starts."""
    space = space.with_drafts(drafts)
    if engine.check_drafts is not None:
        engine.check_drafts(model_dir, space.draft_models())
    return space


def _tries(args: argparse.Namespace) -> list[ParamValues]:
    from tracetune.errors import InputError

    out = []
    for item in args.try_first:
        try:
            params = json.loads(item)
        except json.JSONDecodeError as exc:
            raise InputError(f"--try {item!r}: not valid JSON ({exc.msg})") from None
        if not isinstance(params, dict):
            raise InputError(f"--try {item!r}: expected a JSON object of search-space values")
        if nested := [k for k, v in params.items() if not isinstance(v, str | int | float | bool | None)]:
            raise InputError(f"--try {item!r}: {nested[0]} is not one value (a string, number, true/false or null)")
        out.append(params)
    return out


def study_plan(args: argparse.Namespace, console: Console) -> StudyPlan:
    """The study's rules (`tuner.plan.StudyPlan`) as the flags ask them, saying on the console what
    they decide."""
    from tracetune.tuner.plan import StudyPlan

    return StudyPlan(engine=args.engine_type, own_space=args.space is not None, objectives=args.objectives,
                     max_quality_loss=args.max_quality_loss, api_key_env=args.api_key_env,
                     say=lambda line: console.print(f"[dim]·[/] {line}", highlight=False))


def build_request(args: argparse.Namespace, console: Console) -> TuneRequest:
    """Every input read and checked before anything is started or written."""
    import os

    from tracetune.cli.engine_options import drafts_given, passed_through
    from tracetune.cli.job import check_resume, check_storage, check_warm_start, stored_study_attrs
    from tracetune.engine_adapter.models import resolve_model, sha256_file
    from tracetune.engine_adapter.registry import DEFAULT_ENGINE, engine_kind
    from tracetune.quality.gate import DEFAULT_GATE, parse_gate
    from tracetune.replay.metrics import parse_slos
    from tracetune.replay.trace import load_trace
    from tracetune.search_spaces.space import default_space, load_space
    from tracetune.tuner.objectives import parse_objectives
    from tracetune.tuner.secrets import display_url, secret_values

    slos = parse_slos(args.slo)
    gate = parse_gate(args.max_quality_loss or DEFAULT_GATE)
    enqueue = _tries(args)
    objectives = parse_objectives(args.objectives, has_slo=bool(slos))
    trace = load_trace(args.trace)
    from tracetune.cli.workload import trace_report

    trace_profile = trace_report(trace, _replay_options(args), console)
    study_name = args.study or default_study_name(args.trace)
    run_dir = args.run_dir or Path("runs") / study_name
    storage = _storage_url(args.storage, run_dir)
    tables = check_storage(storage, run_dir)  # before the run folder is made or a model prepared
    if args.warm_start:  # the earlier study, read-only, as early
        check_warm_start(_warm_start_url(args, storage), args.warm_start, run_dir,
                         flag="--warm-start-storage" if args.warm_start_storage else "--storage")
    platform = engine_kind(args.engine_type or DEFAULT_ENGINE).platform()  # where the named engine runs
    plan = study_plan(args, console)
    stored = stored_study_attrs(storage, study_name, tables)
    engine = plan.choose_engine(platform, stored)
    space = load_space(args.space or default_space(engine), engine)
    model_dir = resolve_model(args.model, lambda m: console.print(f"[dim]·[/] {m}")) if engine.loads_model \
        else Path(args.model or engine.name)  # a simulator loads no model: a name (or a tokenizer's folder)
    base_config, base = _base(args, model_dir, engine)
    space = _with_drafts(space, drafts_given(args, engine), model_dir, engine)
    random_weights = "dummy" in (base.get("load_format"), space.fixed.get("load_format"))
    gate, objectives = plan.quality_rules(gate, objectives, space, random_weights=random_weights)
    api_key = plan.api_key(engine, base_config, os.environ)
    # Keys, tokens and passwords given to the tuner (engine environment, engine arguments, the
    # storage URL, the environment tracetune runs in) are scrubbed from everything stored.
    engine_env, engine_args = passed_through(args, engine)
    secrets = secret_values(env=engine_env, process_env=dict(os.environ), args=engine_args,
                            urls=[storage], extra=[api_key.value] if api_key.value else [])
    settings = _settings(args, study_name=study_name, storage=storage, objectives=objectives, slos=slos, gate=gate,
                         enqueue=enqueue, secrets=secrets, api_key=api_key.value, trace_sha256=sha256_file(args.trace))
    settings.trace_profile, settings.engine_env = trace_profile, dict(api_key.env)
    space = plan.runnable_space(space, engine, platform=platform, model_dir=model_dir, base=base,
                                tries=settings.enqueue)
    request = TuneRequest(settings=settings, trace=trace, space=space, model_dir=model_dir, platform=platform,
                          run_dir=run_dir, base=base, storage_shown=display_url(storage), engine=engine)
    check_resume(request, stored, console)
    return request


def _base(args: argparse.Namespace, model_dir: Path, engine: EngineKind) -> tuple[EngineConfig, dict[str, object]]:
    """The engine settings the flags give every trial: each engine's read from its own flags (a choice of
    engines: the first engine's value where two share a setting), and the first engine's config."""
    from tracetune.cli.engine_options import engine_config_from_args, passed_through, without_drafts
    from tracetune.errors import InputError

    if len(engine.engines) > 1 and any(any(passed_through(args, kind)) for kind in engine.engines):
        names = " or ".join(f"--engine {kind.name}" for kind in engine.engines)
        raise InputError(f"--engine-arg and --engine-env go to one engine's server verbatim, and this study chooses "
                         f"between {engine.shown}, whose servers take different arguments: give {names} to "
                         f"tune one engine with them")
    # --draft-model (repeatable) joins the space's draft models; the base takes no draft of its own
    configs = [engine_config_from_args(without_drafts(args, engine), model_dir, kind, chosen=engine)
               for kind in engine.engines]
    base: dict[str, object] = {}
    for config in reversed(configs):
        base.update({k: v for k, v in config.model_dump(exclude_defaults=True).items()
                     if k not in ("model", "speculative", "engine")})
    return configs[0], base


def _storage_url(given: str | None, run_dir: Path) -> str:
    """--storage as a SQLAlchemy URL: a plain path is a SQLite file (as `tune export` and `tune
    dashboard` take it); none given, the run folder's study.db."""
    if given is None:
        given = str(run_dir / "study.db")
    return given if "://" in given else f"sqlite:///{Path(given).resolve()}"


def _warm_start_url(args: argparse.Namespace, storage: str) -> str:
    """--warm-start-storage as a SQLAlchemy URL (a plain path is a SQLite file); none given, `storage`."""
    return storage if args.warm_start_storage is None else _storage_url(args.warm_start_storage, Path())


def _replay_options(args: argparse.Namespace) -> ReplayOptions:
    """What the main job replays of the trace (--time-scale, --max-requests, --max-duration, --warmup)."""
    from tracetune.replay.types import ReplayOptions

    return ReplayOptions(time_scale=args.time_scale, max_requests=args.max_requests, max_duration_s=args.max_duration,
                         warmup_requests=args.warmup, request_timeout_s=args.request_timeout)


def _settings(args: argparse.Namespace, *, study_name: str, storage: str, objectives: list[str], slos: list[SLO],
              gate: QualityGate | float | None, enqueue: list[ParamValues], secrets: list[str],
              api_key: str | None, trace_sha256: str) -> StudySettings:
    from tracetune.tuner.objectives import Needs, needs
    from tracetune.tuner.settings import StudySettings

    replay_options = _replay_options(args)
    capacity_options = None
    if needs(objectives, Needs.CAPACITY):
        from tracetune.cli.capacity import capacity_options as options_of

        capacity_options = options_of(args, slos)
    economics = {k: v for k, v in (("gpu_hour_cost", args.gpu_hour_cost), ("target_rate", args.target_rate))
                 if v is not None}
    return StudySettings(study_name=study_name, storage_url=storage, trials=args.trials, objectives=objectives,
                         slos=slos, max_quality_loss=gate, sampler=args.sampler, seed=args.seed, replay=replay_options,
                         capacity=capacity_options, economics=economics, probe_prompts=args.probe_prompts,
                         patience=args.patience, presets=args.presets, prune=args.prune,
                         warm_start=(_warm_start_url(args, storage), args.warm_start) if args.warm_start else None,
                         probe_tokens=args.probe_tokens, acceptance_prompts=args.acceptance_prompts,
                         start_timeout_s=args.start_timeout, timeout_s=args.timeout,
                         enqueue=enqueue, heartbeat_s=args.heartbeat, engine_port=args.engine_port, secrets=secrets,
                         api_key=api_key, client_procs=args.client_procs, trace_sha256=trace_sha256)


def _run_study(tuner: Tuner, progress: Progress, request: TuneRequest, console: Console) -> optuna.Study | None:
    """Run the study; SIGTERM (a scheduler, `kill`) stops as cleanly as Ctrl-C: engines stopped,
    the trial re-queued. None when interrupted."""
    import signal

    def on_sigterm(signum, frame):
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, on_sigterm)
    try:
        with progress:
            return tuner.run()
    except KeyboardInterrupt:
        console.print(f"\n[bold]interrupted[/]: every engine was stopped; completed trials are saved in "
                      f"{request.storage_shown}. Resume with the same command (study "
                      f"{request.settings.study_name!r}); the interrupted trial runs again.", highlight=False)
        return None
    finally:
        signal.signal(signal.SIGTERM, previous)
