"""`tune fleet`: Kubernetes manifests that run one study on a cluster, one worker per pod of an Indexed
Job, every worker the same `tune` command (the study's flags, given after `--`, read by the main job's
own parser) on one PostgreSQL database. The manifests and the worker image's Dockerfile are made by
`tracetune.fleet`; imports stay light until the command runs."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

from tracetune.cli.options import nonnegative_int, positive_int

if TYPE_CHECKING:
    from rich.console import Console

    from tracetune.fleet.build import Study

FLEET_EPILOG = """\
examples:
  # 8 workers of one GPU each on the team's database; the study's flags after --, as `tune` takes them
  tune fleet --workers 8 --out fleet/ --image registry.example.com/tracetune-worker:1 -- \\
      --trace traffic.jsonl --study nightly --trials 64 --slo "ttft:p99<1s,tpot:p99<50ms" \\
      --storage postgresql://tuner@db.internal:5432/tracetune --model /srv/models/llama-3.1-8b
  # 4 workers of 2 GPUs (tensor parallel searched), a PostgreSQL started in the cluster too
  tune fleet --workers 4 --gpus-per-worker 2 --with-postgres --namespace tuning --out fleet/ -- \\
      --trace traffic.jsonl --study tp --trials 24 --space tp.yaml
  # a trace over 1 MiB (a ConfigMap's limit) is read from a claim the user fills
  tune fleet --workers 16 --trace-pvc traces -- --trace big.jsonl --storage postgresql://tuner@db/tracetune

Each pod is one worker: the same `tune` command on the same study. The fleet
replaces what a pod sees differently (the trace and --space where the pod
mounts them, --storage from the Secret, --run-dir on its volume, model paths
on --models-pvc) and pins --study and --engine. The database URL and password
come from a Secret (printed: how to make it with kubectl); nothing secret is
written. --out also writes the worker image's Dockerfile: the engine's image
(vllm/vllm-openai:v<release>) with tracetune installed. Watch with
`tune dashboard --storage URL --study NAME` (read-only). See docs/workers.md.
"""


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Add the `fleet` subcommand to a subparsers object."""
    fp = sub.add_parser("fleet", prog="tune fleet",
                        help="write Kubernetes manifests that run a study on a cluster: one worker per pod, one "
                             "PostgreSQL study",
                        usage="tune fleet --workers N [options] -- STUDY FLAGS\n"
                              "       (STUDY FLAGS: as tune --trace FILE ... takes them)",
                        epilog=FLEET_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    fp.add_argument("--workers", type=positive_int, required=True, metavar="N",
                    help="pods (workers) running at once: the Job's parallelism and completions")
    fp.add_argument("--gpus-per-worker", type=nonnegative_int, metavar="G",
                    help="nvidia.com/gpu per pod (default 1 for a GPU engine's image, 0 otherwise)")
    fp.add_argument("-o", "--out", type=Path, metavar="DIR",
                    help="write fleet.yaml, Dockerfile and Dockerfile.dockerignore here (default: the manifests "
                         "to stdout)")
    fp.add_argument("--name", metavar="NAME", help="the Job's name, prefix of the others (default tracetune-STUDY)")
    fp.add_argument("--namespace", metavar="NS", help="namespace of every object (default: kubectl's current)")
    fp.add_argument("--image", metavar="IMAGE",
                    help="the worker image the pods run, as pushed (default tracetune-worker:VERSION-ENGINE-TAG, "
                         "which the Dockerfile builds)")
    fp.add_argument("--base-image", metavar="IMAGE",
                    help="what the Dockerfile builds FROM (default: the engine's image, vllm/vllm-openai:v<release>)")
    fp.add_argument("--db-secret", default="tracetune-db", metavar="NAME",
                    help="the Secret holding the study database's url and password (default tracetune-db)")
    fp.add_argument("--trace-pvc", metavar="CLAIM",
                    help="read the trace from this claim (the file at its root) instead of a ConfigMap; needed "
                         "past 1 MiB")
    fp.add_argument("--runs-pvc", metavar="CLAIM",
                    help="keep each worker's run folder on this ReadWriteMany claim (default: the pod's emptyDir)")
    fp.add_argument("--models-pvc", default="models", metavar="CLAIM",
                    help="claim holding the model folders --model names, mounted at /models (default models)")
    fp.add_argument("--cpu", metavar="Q", help="CPU request per worker (default 4 per GPU + 2)")
    fp.add_argument("--memory", metavar="Q", help="memory request per worker (default 16Gi per GPU + 4Gi + /dev/shm)")
    fp.add_argument("--shm-gib", type=positive_int, default=8, metavar="N", help="/dev/shm size, GiB (default 8)")
    fp.add_argument("--retries", type=nonnegative_int, default=3, metavar="N",
                    help="times a failed worker is started again (backoffLimitPerIndex; a preempted or evicted "
                         "pod is replaced without counting; default 3)")
    fp.add_argument("--with-postgres", action="store_true",
                    help="also a PostgreSQL StatefulSet and Service for the study (no --storage then)")
    fp.add_argument("--postgres-disk", default="20Gi", metavar="Q", help="its volume's size (default 20Gi)")
    fp.add_argument("study_flags", nargs=argparse.REMAINDER, metavar="-- STUDY FLAGS",
                    help="the main job's flags, as `tune --trace FILE ...` takes them (tune --help)")
    fp.set_defaults(fleet_flags=frozenset(f for action in fp._actions for f in action.option_strings))


def _misplaced(argv: list[str], fleet_flags: frozenset[str]) -> None:
    """An InputError for a study flag given before `--` (the root parser would take it, or drop it)."""
    from tracetune.errors import InputError

    start = argv.index("fleet") + 1 if "fleet" in argv else 0
    end = argv.index("--") if "--" in argv else len(argv)
    for token in argv[start:end]:
        flag = token.partition("=")[0]
        if flag.startswith("-") and flag not in fleet_flags:
            raise InputError(f"{flag} is not a flag of tune fleet; the study's flags go after `--`: "
                             f"tune fleet --workers N -- --trace FILE --storage URL ...")


class _StudyParser(argparse.ArgumentParser):
    """The main job's parser whose errors are the fleet's InputError (exit 2, one line)."""

    def error(self, message: str) -> NoReturn:
        from tracetune.errors import InputError

        raise InputError(f"study flags (after --): {message}")


def study_parser() -> argparse.ArgumentParser:
    """A parser of the main job's flags, built by the main job's own option builder."""
    from tracetune.cli import tune

    parser = _StudyParser(prog="tune", allow_abbrev=False, add_help=False)
    tune.add_options(parser)
    return parser


def read_study(argv: list[str]) -> Study:
    """The study the flags describe, checked as the main job checks them as it reads them (the flags'
    values, the trace, the space, the engine's own flags)."""
    from tracetune.cli.engine_options import check_engine_flags
    from tracetune.cli.tune import default_study_name
    from tracetune.engine_adapter.registry import DEFAULT_ENGINE, engine_kind
    from tracetune.errors import InputError
    from tracetune.fleet.build import Study
    from tracetune.fleet.command import options_of
    from tracetune.replay.trace import load_trace
    from tracetune.search_spaces.space import load_space

    argv = argv[1:] if argv[:1] == ["--"] else argv
    parser = study_parser()
    args = parser.parse_args(argv)
    if args.trace is None:
        raise InputError("the study flags need --trace FILE: tune fleet --workers N -- --trace FILE --storage URL ...")
    load_trace(args.trace)  # a trace no worker could read fails here, not in every pod
    engine = engine_kind(args.engine_type or DEFAULT_ENGINE)
    if len(engine.engines) > 1 or not engine.tunable:
        raise InputError(f"--engine {engine.name}: a fleet's image runs one engine that tracetune tunes; give "
                         f"--engine {' or --engine '.join(k.name for k in engine.engines if k.tunable)}")
    check_engine_flags(args, engine)
    if args.space is not None:
        load_space(args.space, engine)
    takes_value = {flag: action.nargs != 0 for action in parser._actions for flag in action.option_strings}
    return Study(name=args.study or default_study_name(args.trace), trace=args.trace, space=args.space,
                 storage=args.storage, engine=engine, trials=args.trials, options=options_of(argv, takes_value))


def fleet_command(args: argparse.Namespace, console: Console) -> int:
    """Check the study's flags, build the fleet, write it (a folder, or the manifests to stdout) and say
    what was chosen and what to run next (on stderr: stdout may be the manifests)."""
    import sys

    from rich.console import Console

    from tracetune import __version__
    from tracetune.fleet.build import MANIFESTS, build_fleet, default_gpus
    from tracetune.fleet.image import base_image, worker_image
    from tracetune.fleet.plan import MAX_NAME, FleetOptions
    from tracetune.k8s import k8s_name

    _misplaced(list(getattr(args, "argv", [])), args.fleet_flags)
    study = read_study(list(args.study_flags))
    base = base_image(study.engine, args.base_image)
    gpus = default_gpus(study.engine) if args.gpus_per_worker is None else args.gpus_per_worker
    options = FleetOptions(
        workers=args.workers, gpus_per_worker=gpus, name=args.name or k8s_name(f"tracetune-{study.name}", MAX_NAME),
        image=args.image or worker_image(study.engine, base, __version__), base_image=base,
        namespace=args.namespace, db_secret=args.db_secret, trace_pvc=args.trace_pvc, runs_pvc=args.runs_pvc,
        models_pvc=args.models_pvc, cpu=args.cpu, memory=args.memory, shm_gib=args.shm_gib, retries=args.retries,
        with_postgres=args.with_postgres, postgres_disk=args.postgres_disk)
    fleet = build_fleet(study, options, base=base, out=args.out)
    notes = Console(stderr=True, highlight=False)
    if args.out is None:
        sys.stdout.write(fleet.files[MANIFESTS])
    else:
        _write(args.out, fleet.files, protected=[study.trace, *([study.space] if study.space else [])])
        notes.print(f"wrote {', '.join(str(args.out / name) for name in fleet.files)}", soft_wrap=True)
    for line in fleet.chosen:
        notes.print(f"[dim]·[/] {line}")
    notes.print("next:")
    for i, step in enumerate(fleet.steps, 1):
        notes.print(f"  {i}. {step}", soft_wrap=True)
    return 0


def _write(out: Path, files: dict[str, str], *, protected: list[Path]) -> None:
    """Each file into the folder `out` (made when missing), whole or not at all."""
    from tracetune.errors import InputError
    from tracetune.files import refuse_overwrite, write_atomic

    if out.exists() and not out.is_dir():
        raise InputError(f"--out {out}: is a file; name a folder (made when missing)")
    for name, text in files.items():
        write_atomic(refuse_overwrite(out / name, flag="--out", protected=protected), text)
