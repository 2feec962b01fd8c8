"""`tune fleet` as a user runs it: bad input is one line and exit 2, and the worker's command is the
user's study, read back by the main job's own parser."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from tests.fleet.conftest import ROOT, STORAGE, TRACE, write_trace
from tracetune.cli.main import _build_parser, main

OK = ["--trace", str(TRACE), "--storage", STORAGE]
# case -> (tune fleet's arguments, what the error line must say)
BAD = {
    "sqlite storage": (["--workers", "2", "--", "--trace", str(TRACE), "--storage", "sqlite:///runs/x/study.db"],
                       "--storage sqlite:///runs/x/study.db: a fleet's workers share one PostgreSQL database"),
    "no storage": (["--workers", "2", "--", "--trace", str(TRACE)], "the study flags need --storage postgresql://"),
    "workers < 1": (["--workers", "0", "--", *OK], "argument --workers: expected a whole number >= 1, got '0'"),
    "missing trace": (["--workers", "2", "--", "--trace", "no-such.jsonl", "--storage", STORAGE],
                      "no-such.jsonl: no such trace file"),
    "no trace": (["--workers", "2", "--", "--storage", STORAGE], "the study flags need --trace FILE"),
    "study flag before --": (["--workers", "2", "--trace", str(TRACE)], "--trace is not a flag of tune fleet"),
    "--gpus": (["--workers", "2", "--", *OK, "--gpus", "0,1"], "--gpus: each pod is one worker"),
    "unknown study flag": (["--workers", "2", "--", *OK, "--bogus"], "unrecognized arguments: --bogus"),
    "credential": (["--workers", "2", "--", *OK, "--engine-env", "HF_TOKEN=hf_abcdefghijkl"],
                   "--engine-env/--engine-arg HF_TOKEN: a credential would be written"),
    "two engines": (["--workers", "2", "--", *OK, "--engine", "vllm+llamacpp"], "a fleet's image runs one engine"),
    "no image": (["--workers", "2", "--", *OK, "--engine", "sim"], "--engine sim: it names no container image"),
    "storage and postgres": (["--workers", "2", "--with-postgres", "--", *OK], "--storage and --with-postgres"),
    "bad name": (["--workers", "2", "--name", "Bad_Name", "--", *OK], "--name 'Bad_Name' must be a DNS-1123 label"),
}


def tune(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tracetune", *args], capture_output=True, text=True, cwd=ROOT,
                          timeout=60)


def _fleet_exit(capsys, argv: list[str]) -> tuple[int, str]:
    """`tune fleet ARGV` run here: its exit code (argparse's included) and stderr."""
    try:
        code = main(["fleet", *argv])
    except SystemExit as exc:  # argparse's own usage errors
        code = int(exc.code or 0)
    return code, capsys.readouterr().err


@pytest.mark.parametrize("case", BAD)
def test_bad_input_is_one_line_and_exit_2(case, tmp_path, capsys):
    argv, says = BAD[case]
    code, err = _fleet_exit(capsys, ["--out", str(tmp_path / "out"), *argv])
    assert code == 2, err
    assert not (tmp_path / "out").exists()
    error = err.strip().splitlines()[-1]  # argparse's usage line comes before its error line
    assert says in error, err
    if case != "workers < 1":
        assert len(err.strip().splitlines()) == 1, err


def test_bad_input_as_a_user_runs_it_has_no_traceback(tmp_path):
    argv, says = BAD["sqlite storage"]
    out = tune("fleet", *argv)
    assert out.returncode == 2 and out.stderr.startswith(f"error: {says}") and len(out.stderr.splitlines()) == 1


def test_help_has_examples():
    out = tune("fleet", "--help")
    assert out.returncode == 0 and "examples:" in out.stdout and "--gpus-per-worker" in out.stdout


def _expand(arg: str, env: dict[str, str]) -> str:
    """A container argument as Kubernetes hands it to the program: `$(VAR)` of a variable the container
    defines expanded (any other left as written), `$$` a `$`."""
    return re.sub(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)",
                  lambda m: "$" if m[0] == "$$" else env.get(m[1], m[0]), arg)


def test_the_worker_command_round_trips_through_the_main_jobs_parser(fleet, tmp_path):
    space = tmp_path / "my space.yaml"
    space.write_text("name: mine\nparameters:\n  max_num_seqs: {low: 8, high: 64}\n")
    model = tmp_path / "llama"
    model.mkdir()
    study = ["--trace", str(TRACE), "--storage", STORAGE, "--study", "nightly", "--trials", "40", "--space",
             str(space), "--slo", "ttft:p99<1s,tpot:p99<50ms", "--try", '{"max_num_seqs": 32}', "--no-prune",
             "--seed=-3", "--prefix-caching", "--engine-arg=--swap-space=4", "--engine-env", "NCCL_DEBUG_FILE=$(TRACETUNE_HOME)/$x",
             "--model", str(model), "--heartbeat", "20"]
    run = fleet("--workers", "4", "--", *study)
    assert run.code == 0, run.stderr
    env = {e["name"]: e["value"] for e in run.worker["env"] if "value" in e} | {"TRACETUNE_STORAGE": STORAGE}
    assert "TRACETUNE_HOME" in env  # so an unescaped `$(TRACETUNE_HOME)` would change the value
    pod_args = [_expand(a, env) for a in run.worker["args"]]
    parser = _build_parser()
    given, pod = vars(parser.parse_args(study)), vars(parser.parse_args(pod_args))
    moved = {"trace": ("/etc/tracetune/inputs/traffic.jsonl",), "space": ("/etc/tracetune/inputs/my_space.yaml",),
             "run_dir": ("/tracetune/run",), "model": "/models/llama", "engine_type": "vllm"}
    for name, value in moved.items():
        assert str(pod.pop(name)) == (value[0] if isinstance(value, tuple) else value), name
        given.pop(name)
    assert pod == given  # every other flag, --storage and --study included, reads back the same
    configmap = run.kind("ConfigMap")["data"]
    assert configmap["my_space.yaml"] == space.read_text() and configmap["traffic.jsonl"] == TRACE.read_text()


def test_a_trace_the_main_job_refuses_is_refused_here(tmp_path, capsys):
    bad = write_trace(tmp_path / "bad.jsonl", 2, 10)
    bad.write_text(bad.read_text() + '{"timestamp": 0.1, "prompt": "late"}\n')
    code, err = _fleet_exit(capsys, ["--workers", "2", "--", "--trace", str(bad), "--storage", STORAGE])
    assert code == 2 and "bad.jsonl" in err
