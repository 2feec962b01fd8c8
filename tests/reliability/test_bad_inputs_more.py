"""More bad input, refused before anything is created: `--endpoint` and `--tokenizer` values,
`tune replay` and `tune capacity`'s numeric flags, a capacity `--json` onto its trace or a
database, a trace mixing relative and epoch timestamps (or spanning months), and a YAML alias bomb
as `--space`. Each: exit 2, one message naming the flag or the file and line, no traceback, in
seconds, and no file written."""

from __future__ import annotations

import json
import os
import socket
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.reliability.fault_server import FaultServer
from tracetune.cli.main import main
from tracetune.replay.trace import TraceError, parse_lines

TRACE = "".join(json.dumps({"timestamp": i * 0.1, "prompt": f"p{i}", "output_length": 2}) + "\n" for i in range(4))
LENGTH_ONLY = "".join(json.dumps({"timestamp": i * 0.1, "input_length": 8, "output_length": 2}) + "\n"
                      for i in range(4))


def run_tune(args: list[str], cwd: Path, timeout_s: float = 60) -> tuple[subprocess.CompletedProcess, float]:
    env = {**os.environ, "COLUMNS": "400", "HF_HUB_OFFLINE": "1"}
    t0 = time.monotonic()
    out = subprocess.run([sys.executable, "-m", "tracetune", *args], cwd=cwd, env=env, capture_output=True,
                         text=True, timeout=timeout_s)
    return out, time.monotonic() - t0


def refused(out: subprocess.CompletedProcess, *says: str) -> str:
    both = out.stdout + out.stderr
    assert out.returncode == 2, both
    assert "Traceback" not in both, both
    for words in says:
        assert words in out.stderr, f"{words!r} not in {out.stderr!r}"
    return out.stderr


def closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def folder(tmp_path) -> Path:
    (tmp_path / "t.jsonl").write_text(TRACE)
    return tmp_path


def files_in(folder: Path) -> set[str]:
    return {p.name for p in folder.iterdir()}


# --- --endpoint ------------------------------------------------------------------------------------

BAD_URLS = [("localhost:8000", "is not an http:// or https:// URL"),
            ("127.0.0.1:8000", "is not an http:// or https:// URL"),
            ("ftp://127.0.0.1:8000", "is not an http:// or https:// URL"),
            ("not a url", "is not an http:// or https:// URL"),
            ("http://:8000", "names no host"),
            ("http://127.0.0.1:70000", "the port must be a number in 1-65535"),
            ("http://127.0.0.1:0", "the port must be a number in 1-65535"),
            ("http://127.0.0.1:port", "the port must be a number in 1-65535"),
            ("http://[::1", "is not a URL")]


@pytest.mark.parametrize("command", [["replay"], ["capacity", "--slo", "e2e:p99<1s"]], ids=["replay", "capacity"])
@pytest.mark.parametrize(("url", "says"), BAD_URLS, ids=[u for u, _ in BAD_URLS])
def test_a_malformed_endpoint_is_a_usage_error(folder, capsys, command, url, says):
    with pytest.raises(SystemExit) as info:
        main([*command, "--trace", str(folder / "t.jsonl"), "--endpoint", url, "--out", str(folder / "out")])
    err = capsys.readouterr().err
    assert info.value.code == 2 and "argument --endpoint: " in err and says in err, err
    assert files_in(folder) == {"t.jsonl"}


@pytest.mark.parametrize("command", [["replay"], ["capacity", "--slo", "e2e:p99<1s"]], ids=["replay", "capacity"])
def test_an_endpoint_where_nothing_listens_is_named_at_once(folder, command):
    port = closed_port()
    out, took = run_tune([*command, "--trace", "t.jsonl", "--endpoint", f"http://127.0.0.1:{port}"], folder)
    refused(out, f"--endpoint http://127.0.0.1:{port}: nothing is listening on 127.0.0.1:{port}",
            "start the server or fix the URL")
    assert took < 20 and files_in(folder) == {"t.jsonl"}  # no runs/ folder


def test_an_unknown_endpoint_host_is_named(folder, capsys):
    code = main(["replay", "--trace", str(folder / "t.jsonl"), "--endpoint", "http://no-such-host.invalid:8000",
                 "--out", str(folder / "out")])
    err = capsys.readouterr().err
    assert code == 2 and "--endpoint http://no-such-host.invalid:8000: the host 'no-such-host.invalid' is not known" \
        in err.replace("\n", " "), err
    assert files_in(folder) == {"t.jsonl"}


# --- --tokenizer -----------------------------------------------------------------------------------

def test_a_missing_or_empty_tokenizer_folder_is_refused(folder, capsys):
    (folder / "t.jsonl").write_text(LENGTH_ONLY)
    (folder / "empty").mkdir()
    (folder / "file").write_text("x")
    cases = [("missing", "no such folder"), ("file", "is a file, not a folder"),
             ("empty", "holds no tokenizer (none of tokenizer.json")]
    with FaultServer("ok") as server:
        for name, says in cases:
            code = main(["replay", "--trace", str(folder / "t.jsonl"), "--endpoint", server.base_url,
                         "--tokenizer", str(folder / name), "--out", str(folder / "out")])
            err = capsys.readouterr().err.replace("\n", " ")
            assert code == 2 and f"--tokenizer {folder / name}: {says}" in err, err
    assert files_in(folder) == {"t.jsonl", "empty", "file"}


def test_a_folder_that_is_not_a_tokenizer_is_refused_before_anything_is_written(folder):
    (folder / "t.jsonl").write_text(LENGTH_ONLY)
    (folder / "broken").mkdir()
    (folder / "broken" / "tokenizer.json").write_text("{ this is not a tokenizer")
    with FaultServer("ok") as server:
        out, _ = run_tune(["replay", "--trace", "t.jsonl", "--endpoint", server.base_url, "--tokenizer", "broken",
                           "--out", "out"], folder)
        assert server.requests == 0
    refused(out, "--tokenizer broken: no tokenizer loads from it")
    assert files_in(folder) == {"t.jsonl", "broken"}


# --- numeric flags of replay and capacity -----------------------------------------------------------

REPLAY_FLAGS = [("--max-requests", "0", "a whole number >= 1"), ("--warmup", "-1", "a whole number >= 0"),
                ("--request-timeout", "nan", "a finite number > 0"), ("--request-timeout", "-1", "a finite number > 0"),
                ("--time-scale", "inf", "a finite number > 0"), ("--rate-scale", "0", "a finite number > 0"),
                ("--max-duration", "nan", "a finite number > 0"), ("--concurrency", "0", "a whole number >= 1"),
                ("--max-output-tokens", "0", "a whole number >= 1")]
CAPACITY_FLAGS = [("--attainment", "nan", "a share in (0, 1]"), ("--attainment", "1.5", "a share in (0, 1]"),
                  ("--precision", "nan", "a ratio in (0, 1)"), ("--precision", "1", "a ratio in (0, 1)"),
                  ("--level-seconds", "nan", "a finite number >= 0"),
                  ("--level-lifetimes", "-1", "a finite number >= 0"),
                  ("--level-requests", "-1", "a whole number >= 0"), ("--start-scale", "0", "a finite number > 0"),
                  ("--max-scale", "inf", "a finite number > 0"), ("--min-scale", "nan", "a finite number > 0"),
                  ("--max-requests", "0", "a whole number >= 1"), ("--max-duration", "-5", "a finite number > 0"),
                  ("--warmup", "-1", "a whole number >= 0"), ("--request-timeout", "nan", "a finite number > 0")]
CASES = [("replay", *c) for c in REPLAY_FLAGS] + [("capacity", *c) for c in CAPACITY_FLAGS]


@pytest.mark.parametrize(("command", "flag", "value", "takes"), CASES, ids=[f"{c}{f}={v}" for c, f, v, _ in CASES])
def test_a_nonsense_number_is_refused_naming_its_flag(folder, capsys, command, flag, value, takes):
    slo = ["--slo", "e2e:p99<1s"] if command == "capacity" else []
    with pytest.raises(SystemExit) as info:
        main([command, "--trace", str(folder / "t.jsonl"), *slo, "--endpoint", "http://127.0.0.1:1",
              "--out", str(folder / "out"), f"{flag}={value}"])
    err = capsys.readouterr().err
    assert info.value.code == 2 and f"argument {flag}: expected {takes}" in err and repr(value) in err, err
    assert files_in(folder) == {"t.jsonl"}


def test_one_slow_subprocess_case_prints_no_traceback(folder):
    out, took = run_tune(["capacity", "--trace", "t.jsonl", "--slo", "e2e:p99<1s", "--attainment", "nan"], folder)
    refused(out, "argument --attainment: expected a share in (0, 1], e.g. 0.95, got 'nan'")
    assert took < 20 and files_in(folder) == {"t.jsonl"}


# --- capacity --json -------------------------------------------------------------------------------

def test_capacity_json_onto_the_trace_or_a_database_is_refused(folder, capsys):
    db = folder / "study.db"
    with sqlite3.connect(db) as conn:
        conn.execute("create table t (x)")
    before = {p: p.read_bytes() for p in (folder / "t.jsonl", db)}
    for target, says in [(folder / "t.jsonl", "that is the file this command reads"), (db, "is a database")]:
        code = main(["capacity", "--trace", str(folder / "t.jsonl"), "--slo", "e2e:p99<1s",
                     "--endpoint", "http://127.0.0.1:1", "--json", str(target), "--out", str(folder / "out")])
        err = capsys.readouterr().err.replace("\n", " ")
        assert code == 2 and f"--json {target}: {says}" in err, err
    assert {p: p.read_bytes() for p in before} == before and files_in(folder) == {"t.jsonl", "study.db"}


# --- traces whose timestamps a replay would sleep through --------------------------------------------

def test_mixed_relative_and_epoch_timestamps_are_refused(folder):
    lines = [{"timestamp": 0.5, "prompt": "a", "output_length": 2}, {"timestamp": 1.0, "prompt": "b", "output_length": 2},
             {"timestamp": 1733212345.0, "prompt": "c", "output_length": 2}]
    (folder / "t.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    out, took = run_tune(["replay", "--trace", "t.jsonl", "--endpoint", "http://127.0.0.1:1"], folder)
    refused(out, "t.jsonl:3: field 'timestamp': 1733212345.0 comes", "a gap of more than a day",
            "relative and epoch timestamps mixed?")
    assert took < 20 and files_in(folder) == {"t.jsonl"}


def test_a_trace_spanning_months_is_refused_and_a_day_long_one_is_not():
    def trace(gaps: list[float]) -> list[bytes]:
        times = [1.7e9]
        for gap in gaps:
            times.append(times[-1] + gap)
        return [json.dumps({"timestamp": t, "prompt": "a", "output_length": 1}).encode() + b"\n" for t in times]

    assert parse_lines(trace([86_400.0]), "day.jsonl").records[-1].timestamp == 86_400.0
    with pytest.raises(TraceError, match=r"^long\.jsonl:34: field 'timestamp': .* is 31\.6 days after the first"):
        parse_lines(trace([82_800.0] * 40), "long.jsonl")  # 23 h apart: no gap too long, the span is
    with pytest.raises(TraceError, match=r"^gap\.jsonl:2: field 'timestamp': .*a gap of more than a day"):
        parse_lines(trace([86_401.0]), "gap.jsonl")


# --- YAML alias bombs ------------------------------------------------------------------------------

BOMB = "name: bomb\na: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n" + "".join(
    f"{b}: &{b} [{', '.join(['*' + a] * 9)}]\n" for a, b in zip("abcdefgh", "bcdefghi")) + "parameters: *i\n"


def test_a_yaml_alias_bomb_as_space_is_refused_at_once(folder):
    (folder / "bomb.yaml").write_text(BOMB)
    assert len(BOMB) < 700
    out, took = run_tune(["--trace", "t.jsonl", "--space", "bomb.yaml"], folder)
    refused(out, "bomb.yaml:3: not valid YAML (alias '*a' refused")
    assert took < 20 and files_in(folder) == {"t.jsonl", "bomb.yaml"}


def test_a_merge_key_alias_is_refused_with_its_line(tmp_path):
    from tracetune.search_spaces.space import SpaceError, load_space

    (tmp_path / "s.yaml").write_text("name: s\nbase: &base {low: 4, high: 64}\nparameters:\n"
                                     "  max_num_seqs:\n    <<: *base\n")
    with pytest.raises(SpaceError, match=r"s\.yaml:5: not valid YAML \(alias '\*base' refused"):
        load_space(tmp_path / "s.yaml")
