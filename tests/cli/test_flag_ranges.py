"""The main job's numeric flags and --storage refused as the command line is read, before anything is
made: exit 2, one message naming the flag and what it takes, no traceback, no run folder."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.reliability.scripted import fake_model
from tracetune.cli.main import _build_parser, main

TRACE = '{"timestamp": 0, "prompt": "Hello", "output_length": 4}\n'

# (flag, value, what the message says it takes)
BAD_VALUES = [
    ("--max-requests", "0", "a whole number >= 1"),
    ("--probe-prompts", "0", "a whole number >= 1"),
    ("--probe-tokens", "-3", "a whole number >= 1"),
    ("--trials", "0", "a whole number >= 1"),
    ("--patience", "0", "a whole number >= 1"),
    ("--heartbeat", "0", "a whole number >= 1"),
    ("--warmup", "-1", "a whole number >= 0"),
    ("--trials", "2.5", "a whole number >= 1"),
    ("--engine-port", "70000", "a port number from 1 to 65535"),
    ("--engine-port", "0", "a port number from 1 to 65535"),
    ("--engine-port", "-1", "a port number from 1 to 65535"),
    ("--timeout", "nan", "a finite number > 0"),
    ("--timeout", "0", "a finite number > 0"),
    ("--timeout", "soon", "a finite number > 0"),
    ("--request-timeout", "nan", "a finite number > 0"),
    ("--request-timeout", "inf", "a finite number > 0"),
    ("--request-timeout", "-5", "a finite number > 0"),
    ("--time-scale", "nan", "a finite number > 0"),
    ("--max-duration", "inf", "a finite number > 0"),
    ("--gpu-hour-cost", "nan", "a finite number > 0"),
    ("--target-rate", "-1", "a finite number > 0"),
    ("--start-timeout", "nan", "a finite number > 0"),
    ("--kv-cache-gib", "inf", "a finite number > 0"),
    ("--seed", "x", "invalid int value"),
]


@pytest.mark.parametrize(("flag", "value", "takes"), BAD_VALUES, ids=[f"{f}={v}" for f, v, _ in BAD_VALUES])
def test_a_nonsense_number_is_a_usage_error_naming_the_flag(flag, value, takes, tmp_path, capsys):
    with pytest.raises(SystemExit) as info:
        main(["--trace", str(tmp_path / "t.jsonl"), "--run-dir", str(tmp_path / "run"), f"{flag}={value}"])
    err = capsys.readouterr().err
    assert info.value.code == 2
    assert f"argument {flag}: " in err and takes in err and repr(value) in err, err
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(("flag", "good", "parsed"), [("--engine-port", "65535", 65535), ("--warmup", "0", 0),
                                                      ("--request-timeout", "0.5", 0.5), ("--trials", "1", 1)])
def test_the_edges_of_each_range_are_taken(flag, good, parsed):
    args = _build_parser().parse_args(["--trace", "t.jsonl", flag, good])
    assert getattr(args, flag.lstrip("-").replace("-", "_")) == parsed


@pytest.mark.parametrize("words", [["engine", "command"], ["engine", "check"], ["replay", "--trace", "t.jsonl"],
                                   ["capacity", "--trace", "t.jsonl", "--slo", "ttft:p99<1s"]])
def test_the_engine_flags_of_every_command_refuse_the_same_way(words, capsys):
    with pytest.raises(SystemExit) as info:
        _build_parser().parse_args([*words, "--start-timeout", "nan"])
    assert info.value.code == 2 and "argument --start-timeout: expected a finite number > 0, got 'nan'" in \
        capsys.readouterr().err


@pytest.fixture
def folder(tmp_path, monkeypatch) -> Path:
    (tmp_path / "traffic.jsonl").write_text(TRACE)
    (tmp_path / "space.yaml").write_text("name: r\nfixed: {enforce_eager: true}\nparameters:\n"
                                         "  max_num_seqs: {low: 4, high: 64, step: 4}\n")
    fake_model(tmp_path / "model")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def refused(argv: list[str], folder: Path, capsys) -> str:
    """The one-line error of the main job run with `argv` in `folder`, which it left as it was."""
    before = sorted(p.name for p in folder.rglob("*"))
    code = main(["--trace", "traffic.jsonl", "--model", "model", *argv])
    err = capsys.readouterr().err
    assert code == 2, err
    assert sorted(p.name for p in folder.rglob("*")) == before  # no run folder, no database
    assert err.startswith("error: ") and len(err.strip().splitlines()) == 1, err
    return " ".join(err.split())


@pytest.mark.parametrize(("value", "says"), [
    ('{"max_num_seqs": 100}', "--try max_num_seqs=100: outside the range [4, 64] of the search space 'r'"),
    ('{"max_num_seqs": 2}', "--try max_num_seqs=2: outside the range [4, 64]"),
    ('{"max_num_seqs": 6}', "--try max_num_seqs=6: not on the steps of 4 from 4 in the range [4, 64]"),
    ('{"max_num_seqs": 8.5}', "--try max_num_seqs=8.5: expected a whole number"),
    ('{"max_num_seqs": NaN}', "--try max_num_seqs=nan: expected a whole number"),
    ('{"max_num_seqs": "8"}', "--try max_num_seqs='8': expected a whole number"),
    ('{"max_num_seqs": true}', "--try max_num_seqs=True: expected a whole number"),
    ('{"max_num_seqs": [8]}', "max_num_seqs is not one value (a string, number, true/false or null)"),
])
def test_a_try_value_outside_the_space_is_refused(value, says, folder, capsys):
    assert says in refused(["--space", "space.yaml", "--try", value], folder, capsys)


def test_a_try_value_inside_the_space_is_taken(folder):
    from rich.console import Console

    from tracetune.cli.tune import build_request

    args = _build_parser().parse_args(["--trace", "traffic.jsonl", "--model", "model", "--space", "space.yaml",
                                       "--try", '{"max_num_seqs": 64}', "--try", '{"max_num_seqs": 8}'])
    request = build_request(args, Console(file=io.StringIO()))
    assert request.settings.enqueue == [{"max_num_seqs": 64}, {"max_num_seqs": 8}]
    assert not (folder / "runs").exists()  # a request is only checked inputs: nothing made yet


@pytest.mark.parametrize(("storage", "says"), [
    ("postgresql://u@127.0.0.1:1/db", "--storage postgresql://u@127.0.0.1:1/db: cannot open the database: "),
    ("foo://x", "--storage foo://x: not a database URL SQLAlchemy can read; write sqlite:///PATH"),
    ("sqlite:///missing/study.db", "--storage sqlite:///missing/study.db: the folder 'missing' does not exist; "
                                   "create it first (mkdir -p missing)"),
    ("missing/study.db", "the folder '{folder}/missing' does not exist"),
    ("traffic.jsonl", "'{folder}/traffic.jsonl' is not a SQLite database"),
])
def test_a_bad_storage_is_refused_before_anything_is_made(storage, says, folder, capsys):
    message = refused(["--storage", storage], folder, capsys)
    assert says.format(folder=folder.resolve()) in message, message
    assert (folder / "traffic.jsonl").read_text() == TRACE


def test_a_bad_storage_prints_no_traceback_through_the_real_command(folder):
    env = {**os.environ, "COLUMNS": "400", "HF_HUB_OFFLINE": "1"}
    out = subprocess.run([sys.executable, "-m", "tracetune", "--trace", "traffic.jsonl", "--storage",
                          "postgresql://u@127.0.0.1:1/db"], cwd=folder, env=env, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 2 and "Traceback" not in out.stdout + out.stderr
    assert out.stderr.count("\n") == 1 and "--storage postgresql://u@127.0.0.1:1/db" in out.stderr
    assert not (folder / "runs").exists()


def test_a_new_sqlite_file_in_an_existing_folder_or_the_run_folder_is_fine(folder):
    from tracetune.cli.job import check_storage

    assert check_storage(f"sqlite:///{folder / 'new.db'}", folder / "run") == set()
    assert check_storage(f"sqlite:///{folder / 'run' / 'study.db'}", folder / "run") == set()  # made by the job
    assert not (folder / "new.db").exists() and not (folder / "run").exists()


@pytest.mark.parametrize(("storage", "says"), [
    ("postgresql://u@127.0.0.1:1/db", "--warm-start-storage postgresql://u@127.0.0.1:1/db: cannot open the database: "),
    ("foo://x", "--warm-start-storage foo://x: not a database URL SQLAlchemy can read"),
    ("missing/study.db", "--warm-start-storage sqlite:///{folder}/missing/study.db: the folder '{folder}/missing' "
                         "does not exist"),
    ("traffic.jsonl", "'{folder}/traffic.jsonl' is not a SQLite database"),
    ("old.db", "--warm-start old: no such study at --warm-start-storage sqlite:///{folder}/old.db (it holds no "
               "study); name one of them, or give --warm-start-storage URL"),
])
def test_a_bad_warm_start_storage_is_refused_before_anything_is_made(storage, says, folder, capsys):
    message = refused(["--warm-start", "old", "--warm-start-storage", storage], folder, capsys)
    assert says.format(folder=folder.resolve()) in message, message


def test_a_warm_start_study_missing_from_this_storage_is_refused(folder, capsys):
    message = refused(["--warm-start", "old", "--storage", "here.db"], folder, capsys)
    assert f"--warm-start old: no such study at --storage sqlite:///{folder.resolve()}/here.db" in message, message
