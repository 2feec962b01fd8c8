"""`tune --trace FILE --gpus 0,1`: one study run by one worker per GPU (or group of GPUs) on this host.

Each worker is the same `tune` command in its own process, pinned to its GPUs with
CUDA_VISIBLE_DEVICES, with its own engine port, on the study's one storage (the default SQLite file,
or --storage): the claims that let workers on several hosts share a study (README, "Several
workers") keep two workers from measuring one configuration, and one of them measures vLLM's
defaults while the others wait for it. `0+1` joins GPUs into one worker (tensor parallel up to 2).
Each worker writes its log to RUN_DIR/worker-N.log; this process shows their progress, forwards
Ctrl-C and SIGTERM to them (each stops its engine and re-queues its trial), and prints the study's
results once all have finished.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from tracetune.errors import InputError


def parse_gpus(spec: str) -> list[str]:
    """`0,1` -> ["0", "1"] (two workers); `0+1,2+3` -> ["0,1", "2,3"] (two workers of two GPUs):
    each worker's CUDA_VISIBLE_DEVICES."""
    groups: list[str] = []
    seen: set[str] = set()
    for item in spec.split(","):
        ids = [i.strip() for i in item.split("+")]
        if not ids or not all(i.isdigit() for i in ids):
            raise InputError(f"--gpus {spec!r}: expected GPU indices separated by commas, one worker each, with + "
                             f"joining the GPUs of one worker, e.g. --gpus 0,1 or --gpus 0+1,2+3")
        taken = seen.intersection(ids)
        if taken:
            raise InputError(f"--gpus {spec!r}: GPU {sorted(taken)[0]} is given to two workers")
        seen.update(ids)
        groups.append(",".join(ids))
    return groups


def worker_argv(argv: Sequence[str], index: int) -> list[str]:
    """The command line of worker `index`: the user's, without --gpus, and with its own engine port
    when the user fixed one (--engine-port P: worker N uses P + N; otherwise each picks a free one)."""
    out, skip = [], False
    port = None
    for i, arg in enumerate(argv):
        if skip:
            skip = False
            continue
        if arg == "--gpus":
            skip = True
            continue
        if arg.startswith("--gpus="):
            continue
        if arg == "--engine-port" and i + 1 < len(argv):
            port, skip = int(argv[i + 1]), True
            continue
        if arg.startswith("--engine-port="):
            port = int(arg.split("=", 1)[1])
            continue
        out.append(arg)
    if port is not None:
        out += ["--engine-port", str(port + index)]
    return out


def last_line(path: Path) -> str:
    """The last non-empty line a worker wrote (progress bars redraw with carriage returns)."""
    try:
        with open(path, "rb") as f:
            f.seek(max(f.seek(0, os.SEEK_END) - 4096, 0))
            text = f.read().decode(errors="replace")
    except OSError:
        return ""
    lines = [part.strip() for line in text.splitlines() for part in line.split("\r") if part.strip()]
    return lines[-1][:160] if lines else ""


def run_workers(commands: Sequence[list[str]], envs: Sequence[dict[str, str]], logs: Sequence[Path], *,
                report: Callable[[str], None], every_s: float = 30.0) -> int:
    """Start one process per command (its environment, its log), report their progress every `every_s`,
    forward SIGINT/SIGTERM to all of them, and return the worst exit code (130 when interrupted)."""
    procs = []
    for command, env, log in zip(commands, envs, logs):
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "wb") as out:
            procs.append(subprocess.Popen(command, env={**os.environ, **env}, stdout=out, stderr=subprocess.STDOUT))
    interrupted = []

    def forward(signum, frame):
        interrupted.append(signum)
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)  # each worker stops its engine and re-queues its trial

    previous = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        last = time.monotonic()
        while any(p.poll() is None for p in procs):
            time.sleep(0.2)
            if time.monotonic() - last >= every_s:
                last = time.monotonic()
                report(" · ".join(f"worker {i}: {'done' if p.poll() is not None else last_line(log) or 'starting'}"
                                  for i, (p, log) in enumerate(zip(procs, logs))))
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    codes = [p.returncode for p in procs]
    return 130 if interrupted else max(codes, default=0)


def run_study_on_gpus(args, request, console) -> int:
    """The main job on several GPUs of this host: the workers, then the study's results."""
    from tracetune.engine_adapter.platform import Platform, host_gpus

    groups = parse_gpus(args.gpus)
    if request.platform is not Platform.CUDA:
        raise InputError(f"--gpus starts one worker per NVIDIA GPU, and this machine runs {request.engine.shown} "
                         f"on {request.platform.value}; several workers on CPU hosts share a study through --storage "
                         f"(README, \"Several workers\")")
    available = host_gpus()  # --gpus names the host's GPUs: each worker's CUDA_VISIBLE_DEVICES replaces the user's
    wanted = max(int(i) for g in groups for i in g.split(","))
    if wanted >= available:
        raise InputError(f"--gpus {args.gpus}: this machine has {available} GPU(s) (0..{available - 1})")
    commands = [[sys.executable, "-m", "tracetune", *worker_argv(args.argv, i)] for i in range(len(groups))]
    logs = [request.run_dir / f"worker-{i}.log" for i in range(len(groups))]
    for i, (gpus, log) in enumerate(zip(groups, logs)):
        console.print(f"worker {i}: GPU {gpus} · log {log}", highlight=False)
    code = run_workers(commands, [{"CUDA_VISIBLE_DEVICES": g} for g in groups], logs,
                       report=lambda line: console.print(line, highlight=False))
    if code == 130:
        console.print(f"\n[bold]interrupted[/]: every worker stopped its engine; completed trials are saved in "
                      f"{request.storage_shown}. Resume with the same command.", highlight=False)
        return code
    if code:
        console.print(f"[red]a worker failed (exit code {code})[/]: see {', '.join(map(str, logs))}")
        return code
    from tracetune.cli.job import make_tuner
    from tracetune.cli.results import report_results

    tuner, _ = make_tuner(request, console)
    report_results(tuner, console, request.run_dir)
    return 0
