"""`tune dashboard` and `tune export`: argument parsing and the two commands (imports stay light)."""

from __future__ import annotations

import argparse
import ipaddress
import os
import signal
import subprocess
import sys
from pathlib import Path

from tracetune.dashboard import APP, ENV_STORAGE, ENV_STORAGE_PICKER, ENV_STUDY
from tracetune.dashboard.export_formats import FORMATS, STUDY_FORMATS, canonical, export_format

DASHBOARD_EPILOG = """\
examples:
  tune dashboard                                   # the study of the latest `tune --trace` run (runs/*/study.db)
  tune dashboard --storage sqlite:///runs/traffic/study.db --study traffic --port 8600
  tune dashboard --storage postgresql://tuner@db/tracetune --study nightly --host 0.0.0.0   # reachable from the network
  tune dashboard --no-storage-picker               # visitors cannot open other databases

The dashboard only reads the study (SQLite opened read-only; an empty or missing file is refused,
never created); it listens on 127.0.0.1 unless --host says otherwise (it has no login: anyone who
can reach the port can read the study). The sidebar's storage box, which opens any database the
server can reach, is off when --host is not a loopback address, and with --no-storage-picker.
"""

# ({defaults}: the default engine's reference, `EngineKind.defaults_label`)
EXPORT_EPILOG = """\
examples:
  tune export --best --format command
  tune export --storage sqlite:///runs/traffic/study.db --study traffic --trial 3 --format k8s -o deploy.yaml
  tune export --pick "max:output_tps where ttft_p99<500ms" --format compose -o compose.yaml
  tune export --pick "min:ttft_p99 where quality_loss<0.01 and output_tps>20" --format helm-values
  tune export --reference --format k8s             # {defaults}, when no trial beats them
  tune export --format pareto -o runs/traffic/     # the front and the verdict, as pareto.json

--pick chooses among the feasible trials on the Pareto front and {defaults} (ties go to the
defaults): max:METRIC or min:METRIC, then optionally 'where' and conditions joined by 'and'
(latencies in seconds, or with ms/s/us). stderr says the choice's quality cost (perplexity change,
KLD, top-1) and whether the study's quality gate holds it; the export's comments say the same.
Metrics: ttft/tpot/itl/e2e _mean/_p50/_p90/_p99, output_tps, request_tps, goodput, quality_loss,
error_rate, prefix_cache_hit_rate, spec_acceptance_rate, spec_natural_rate (acceptance with
natural stops).

Deployment formats (compose, k8s, helm-values) run the vllm/vllm-openai image (tag: the GPU vLLM
release, --engine-version; a study measured on CPU exports for the GPU release tracetune runs)
as `vllm serve MODEL ...` with vLLM's CUDA flags, port 8000, one GPU
(nvidia.com/gpu), the model directory mounted read-only at /models/<directory name> (compose: a bind
mount of the measured directory; k8s/helm: the PersistentVolumeClaim `models`), probes on /health;
comments give the command that copies each model there and the served name. k8s/helm request CPU
and memory (--cpu, --memory), size /dev/shm (--shm-gib) and carry GPU nodeSelector/tolerations.
A study measured on the CPU loses what only the CPU needed (--enforce-eager, its KV-cache size,
VLLM_CPU_* settings), said in a comment. A llama.cpp trial (of a llama.cpp study, or of a study
choosing between engines) runs llama-server in the ghcr.io/ggml-org/llama.cpp:server-b<N> image on
the CPU, its GGUF files mounted at /models/<file name>; comments say how to copy each file and how
to make a file tracetune made again. The study's database is only read. See docs/export.md.
Credential-like settings (API keys, tokens) are never exported. A config measured with random
weights (load_format dummy) is refused unless --allow-dummy-weights says it is meant.
"""


def add_parsers(sub: argparse._SubParsersAction) -> None:
    from tracetune.engine_adapter.registry import engine_kind

    defaults = engine_kind().defaults_label  # no study is known yet: the default engine's reference
    dash = sub.add_parser("dashboard", help="browse a study: Pareto front, trials, drill-down, compare, export",
                          epilog=DASHBOARD_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    dash.add_argument("--storage", metavar="URL",
                      help="study database (SQLAlchemy URL; default: the newest runs/*/study.db)")
    dash.add_argument("--study", metavar="NAME", help="study name (default: the only study in the storage)")
    dash.add_argument("--port", type=int, default=8501, metavar="N", help="default 8501")
    dash.add_argument("--host", default="127.0.0.1", metavar="ADDR",
                      help="address to listen on (default 127.0.0.1: this machine only)")
    dash.add_argument("--no-storage-picker", action="store_true",
                      help="hide the sidebar's storage box, so visitors see only this study (always hidden "
                           "when --host is not a loopback address)")

    exp = sub.add_parser("export", help="write a trial's config as a server command, compose service, "
                                        "Kubernetes manifests, Helm values or JSON; or the study's front",
                         epilog=EXPORT_EPILOG.format(defaults=defaults),
                         formatter_class=argparse.RawDescriptionHelpFormatter)
    exp.add_argument("--storage", metavar="URL", help="study database (default: the newest runs/*/study.db)")
    exp.add_argument("--study", metavar="NAME", help="study name (default: the only study in the storage)")
    which = exp.add_mutually_exclusive_group()
    which.add_argument("--trial", type=int, metavar="N", help="this trial number")
    which.add_argument("--best", action="store_true",
                       help="the front's best on the first objective to maximize (as best.json)")
    which.add_argument("--pick", metavar="EXPR", help="a rule over the front, e.g. 'max:output_tps where ttft_p99<0.5'")
    which.add_argument("--reference", action="store_true",
                       help=f"{defaults} as the study measured them (the answer when no trial beats them)")
    exp.add_argument("--format", required=True, choices=(*FORMATS, *STUDY_FORMATS), dest="fmt",
                     type=canonical,
                     help="a trial's (one of --trial, --best, --pick, --reference): command: the server's shell "
                          "command (vllm serve or llama-server; vllm-cmd is its earlier name); compose, k8s, "
                          "helm-values: a deployment; json: everything measured. The study's (no trial): "
                          "pareto: the front and the verdict (pareto.json); best: the front's best (best.json)")
    exp.add_argument("-o", "--output", type=Path, metavar="PATH", help="write here instead of stdout")
    exp.add_argument("--image", metavar="IMAGE",
                     help="container image (default: the engine's, vllm/vllm-openai:v<GPU vLLM release, see "
                          "--engine-version> or ghcr.io/ggml-org/llama.cpp:server-b<N>)")
    exp.add_argument("--engine-version", "--vllm-version", dest="engine_version", metavar="VERSION",
                     help="the GPU vLLM release the deployment runs (default: the one a GPU study measured with; "
                          "for a study measured on CPU, the GPU release tracetune runs); for a llama.cpp trial, "
                          "the server image's tag (default server-b<N>, the release tracetune "
                          "builds); --vllm-version is its earlier name")
    exp.add_argument("--allow-dummy-weights", action="store_true",
                     help="export a config measured with random weights (load_format dummy) anyway: its server "
                          "answers with noise (refused without this flag)")
    exp.add_argument("--port", type=int, default=8000, metavar="N", help="server port (default 8000)")
    exp.add_argument("--host", metavar="ADDR",
                     help="server listen address (default 0.0.0.0 in containers, 127.0.0.1 for --format command)")
    exp.add_argument("--gpus", type=int, default=1, metavar="N",
                     help="GPUs per replica (default 1; none for llama.cpp's CPU server image)")
    exp.add_argument("--replicas", type=int, default=1, metavar="N", help="k8s/helm replicas (default 1)")
    exp.add_argument("--name", metavar="NAME", help="deployment/service name (default tracetune-STUDY-tN)")
    exp.add_argument("--namespace", metavar="NS", help="k8s namespace (default: none, kubectl's current)")
    exp.add_argument("--models-pvc", default="models", metavar="CLAIM",
                     help="k8s/helm: PersistentVolumeClaim holding the model directories (default models)")
    exp.add_argument("--cpu", metavar="Q", help="k8s/helm: CPU request per replica (default 4 per GPU)")
    exp.add_argument("--memory", metavar="Q", help="k8s/helm: memory request per replica (default 16Gi per GPU "
                                                    "plus /dev/shm)")
    exp.add_argument("--shm-gib", type=int, default=8, metavar="N",
                     help="k8s/helm: size limit of /dev/shm (a memory-backed volume), GiB (default 8)")


def check_port_free(host: str, port: int) -> None:
    """Refuse a port something already listens on, before any URL is printed (it would serve that
    other program, e.g. another study's dashboard)."""
    import socket

    from tracetune.errors import InputError

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the server does: TIME_WAIT is no conflict
        try:
            sock.bind((host, port))
        except OSError as exc:
            raise InputError(f"--port {port}: cannot listen on {host}:{port} ({exc.strerror or exc}); another "
                             f"program (another dashboard?) has it: choose a free one with --port N") from None


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def storage_picker(host: str, switched_off: bool) -> bool:
    """Whether the sidebar offers its storage box: only on a loopback address, unless switched off
    (a visitor from the network could otherwise open any database the server can reach)."""
    return is_loopback(host) and not switched_off


def streamlit_argv(host: str, port: int) -> list[str]:
    return [sys.executable, "-m", "streamlit", "run", str(APP),
            "--server.address", host, "--server.port", str(port), "--server.headless", "true",
            "--browser.gatherUsageStats", "false", "--server.fileWatcherType", "none",
            "--server.runOnSave", "false", "--global.developmentMode", "false",
            "--client.toolbarMode", "minimal", "--theme.base", "light"]


def dashboard_command(args: argparse.Namespace, console) -> int:
    from tracetune.dashboard.storage import resolve_study, storage_url
    from tracetune.errors import InputError

    if not 0 < args.port < 65536:
        raise InputError(f"--port must be between 1 and 65535, got {args.port}")
    url = storage_url(args.storage)
    study = resolve_study(url, args.study)
    check_port_free(args.host, args.port)
    env = {**os.environ, ENV_STORAGE: url, ENV_STUDY: study,
           ENV_STORAGE_PICKER: "1" if storage_picker(args.host, args.no_storage_picker) else "0"}
    shown = "localhost" if is_loopback(args.host) else args.host
    console.print(f"dashboard for study [bold]{study}[/] ({url}): http://{shown}:{args.port}  (Ctrl-C stops it)",
                  highlight=False)
    if not is_loopback(args.host):
        console.print(f"[yellow]note[/]: listening on {args.host}: anyone who can reach port {args.port} can read "
                      f"this study (the dashboard has no login); the sidebar's storage box is off", highlight=False)
    proc = subprocess.Popen(streamlit_argv(args.host, args.port), env=env)

    def on_term(signum, frame):  # `kill PID` of tune stops the server too
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, on_term)
    try:
        return proc.wait()
    except KeyboardInterrupt:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        return 130
    finally:
        signal.signal(signal.SIGTERM, previous)


def export_command(args: argparse.Namespace, console) -> int:
    from rich.console import Console

    from tracetune.dashboard.data import load_study
    from tracetune.dashboard.export import ExportOptions, export
    from tracetune.dashboard.export.notes import choice_notes
    from tracetune.dashboard.export.pick import best_rule, parse_pick, select_trial
    from tracetune.dashboard.storage import storage_url
    from tracetune.errors import InputError

    options = ExportOptions(image=args.image, port=args.port, host=args.host, gpus=args.gpus, name=args.name,
                            namespace=args.namespace, models_pvc=args.models_pvc, replicas=args.replicas,
                            engine_version=args.engine_version, allow_dummy_weights=args.allow_dummy_weights,
                            cpu=args.cpu, memory=args.memory, shm_gib=args.shm_gib)
    url = storage_url(args.storage)
    fmt = export_format(args.fmt)
    chosen = args.trial is not None or args.best or args.pick is not None or args.reference
    if chosen == (fmt.scope == "study"):
        raise InputError(f"--format {fmt.name} writes the whole study: leave out --trial, --best, --pick and "
                         f"--reference" if chosen else f"--format {fmt.name} exports one trial: add --trial N, "
                         f"--best, --pick EXPR or --reference")
    out = None if args.output is None else export_target(args.output, fmt.file_name, url)
    study = load_study(url, args.study)
    if fmt.scope == "study":
        return _write_export(fmt.write(study, None, options), out, f"study {study.name}, {fmt.name}", console)
    trial = select_trial(study, trial=args.trial, best=args.best or False, pick=args.pick, reference=args.reference)
    options.chosen_by = best_rule(study) if args.best else parse_pick(args.pick) if args.pick else None
    text = export(study, trial, args.fmt, options)
    notes = Console(stderr=True, highlight=False)  # stdout may be the export itself
    if args.pick and trial.is_reference:
        notes.print(f"--pick {options.chosen_by}: {study.reference_name} meet it and no trial on the front does "
                    f"better; exporting the defaults")
    for line in choice_notes(study, trial, options.chosen_by):
        notes.print(line, markup=False)
    return _write_export(text, out, f"study {study.name}, trial {trial.number}, {args.fmt}", console)


def _write_export(text: str, out: Path | None, what: str, console) -> int:
    """An export to stdout, or to `out` (said on the console, with `what` it holds)."""
    from tracetune.files import write_atomic

    if out is None:
        sys.stdout.write(text)
        return 0
    write_atomic(out, text)
    console.print(f"wrote {out} ({what})", highlight=False)
    return 0


def export_target(output: Path, file_name: str, url: str) -> Path:
    """The file `tune export -o OUTPUT` writes (`file_name` inside OUTPUT when it is a folder), or an
    `InputError` before anything is read when writing there would destroy the study's database (or
    its journal), another database, or something that is not a regular file."""
    from tracetune.dashboard.storage import sqlite_path
    from tracetune.files import database_files, refuse_overwrite

    db = sqlite_path(url)
    out = output / file_name if output.is_dir() else output
    return refuse_overwrite(out, flag="-o", protected=database_files(db) if db is not None else ())
