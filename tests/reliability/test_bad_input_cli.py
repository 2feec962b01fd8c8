"""Bad input through the real CLI, in a subprocess: a corrupted trace (`tune replay`, `tune --trace`),
public-format source (`tune trace convert`) or search space (`tune --trace --space`) exits 2, names
the file and line, prints no traceback and writes nothing, before any model or engine is touched."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.reliability.bad_spaces import SPACE_KINDS, bad_spaces
from tests.reliability.bad_traces import PUBLIC_KINDS, TRACE_KINDS, bad_public, bad_traces
from tests.reliability.fuzz import CASES, CLI, Case, report_case_counts  # noqa: F401 (autouse)

pytestmark = pytest.mark.slow  # 67 runs of the real CLI, a second or more each


def run_tune(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "COLUMNS": "400", "HF_HUB_OFFLINE": "1"}
    return subprocess.run([sys.executable, "-m", "tracetune", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=120)


def check_cli(out: subprocess.CompletedProcess, path: Path, case: Case, cwd: Path, before: set[str]) -> None:
    both = out.stdout + out.stderr
    assert out.returncode == 2, f"{case.kind}: exit {out.returncode}\n{both}"
    assert "Traceback" not in both, both
    # Only the bad input's message: no model was resolved, no engine started.
    assert "starting vLLM" not in both and "model" not in out.stdout, both
    where = f"{path}:{case.line}: " if case.line is not None else f"{path}: "
    assert where in out.stderr, f"{case.kind}: {where!r} not in {out.stderr!r}"
    if case.field is not None:
        assert f"field '{case.field}" in out.stderr, out.stderr
    assert sorted(p.name for p in cwd.iterdir()) == sorted(before), f"{case.kind}: files written: {list(cwd.iterdir())}"


@pytest.mark.parametrize("kind", TRACE_KINDS)
@CLI
@given(st.data())
def test_cli_replay_refuses_bad_trace(kind, data):
    case = data.draw(bad_traces(kind), label="case")
    CASES["cli replay"] += 1
    with tempfile.TemporaryDirectory() as tmp:
        cwd = Path(tmp)
        path = cwd / "traffic.jsonl"
        path.write_bytes(case.data)
        before = {p.name for p in cwd.iterdir()}
        # --model names a directory that does not exist: had the trace passed, the command would stop there,
        # so a generator bug can never start an engine.
        out = run_tune(["replay", "--trace", str(path), "--model", str(cwd / "no-model")], cwd)
        check_cli(out, path, case, cwd, before)


@pytest.mark.parametrize(("fmt", "kind"), PUBLIC_KINDS)
@CLI
@given(st.data())
def test_cli_convert_refuses_bad_source(fmt, kind, data):
    case = data.draw(bad_public(fmt, kind), label="case")
    CASES["cli convert"] += 1
    with tempfile.TemporaryDirectory() as tmp:
        cwd = Path(tmp)
        path = cwd / f"source.{fmt}"
        path.write_bytes(case.data)
        before = {p.name for p in cwd.iterdir()}
        target = cwd / "out" / "converted.jsonl"
        out = run_tune(["trace", "convert", "--from", fmt, str(path), str(target), "--model", str(cwd / "no-model")],
                       cwd)
        check_cli(out, path, case, cwd, before)
        assert not target.exists() and not target.with_name(target.name + ".tmp").exists()


GOOD_TRACE = b'{"timestamp": 0, "prompt": "Hello", "output_length": 4}\n'


# `tune --trace` reads the trace with the same load_trace as `tune replay` (every kind above): a sample.
@pytest.mark.parametrize("kind", ["wrong_type", "unsorted", "non_finite", "non_utf8", "truncated", "deep", "empty"])
@CLI
@given(st.data())
def test_cli_tune_refuses_bad_trace(kind, data):
    case = data.draw(bad_traces(kind), label="case")
    CASES["cli tune trace"] += 1
    with tempfile.TemporaryDirectory() as tmp:
        cwd = Path(tmp)
        path = cwd / "traffic.jsonl"
        path.write_bytes(case.data)
        before = {p.name for p in cwd.iterdir()}
        out = run_tune(["--trace", str(path), "--model", str(cwd / "no-model"), "--trials", "1"], cwd)
        check_cli(out, path, case, cwd, before)


@pytest.mark.parametrize("kind", SPACE_KINDS)
@CLI
@given(st.data())
def test_cli_tune_refuses_bad_space(kind, data):
    case = data.draw(bad_spaces(kind), label="case")
    if case.line is None:  # the YAML parser picks the line; covered at library level
        return
    CASES["cli tune space"] += 1
    with tempfile.TemporaryDirectory() as tmp:
        cwd = Path(tmp)
        trace, space = cwd / "traffic.jsonl", cwd / "space.yaml"
        trace.write_bytes(GOOD_TRACE)
        space.write_bytes(case.data)
        before = {p.name for p in cwd.iterdir()}
        out = run_tune(["--trace", str(trace), "--space", str(space), "--model", str(cwd / "no-model"),
                        "--trials", "1"], cwd)
        check_cli(out, space, case, cwd, before)
