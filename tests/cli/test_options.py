"""The options several commands share (cli/options.py): --trace and --slo read the same way by the main
job, `tune replay` and `tune capacity`, and a bad --slo refused as a usage error (the real `tune` in a
subprocess: exit 2, the flag named, no traceback, nothing written)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tracetune.cli.main import _build_parser

SPEC = "ttft:p99<500ms,tpot:p50<50ms"
# The commands that take --trace and --slo, as the words before them.
COMMANDS = {"main job": [], "replay": ["replay"], "capacity": ["capacity"]}


def tune(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tracetune", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=120)


@pytest.mark.parametrize("words", COMMANDS.values(), ids=COMMANDS.keys())
def test_trace_and_slo_are_read_the_same_way_by_every_command(words):
    args = _build_parser().parse_args([*words, "--trace", "traffic.jsonl", "--slo", SPEC])
    assert args.trace == Path("traffic.jsonl") and args.slo == SPEC  # a path, and the spec as given


def test_trace_is_required_by_the_commands_and_optional_at_the_root(capsys):
    assert _build_parser().parse_args(["--slo", SPEC]).trace is None  # the root parser: `tune` alone shows help
    for command in ("replay", "capacity"):
        with pytest.raises(SystemExit) as info:
            _build_parser().parse_args([command, "--slo", SPEC])
        assert info.value.code == 2 and "--trace" in capsys.readouterr().err


def test_slo_is_required_by_capacity_only(capsys):
    assert _build_parser().parse_args(["replay", "--trace", "t.jsonl"]).slo is None
    with pytest.raises(SystemExit) as info:
        _build_parser().parse_args(["capacity", "--trace", "t.jsonl"])
    assert info.value.code == 2 and "--slo" in capsys.readouterr().err


@pytest.mark.parametrize("words", COMMANDS.values(), ids=COMMANDS.keys())
def test_help_shows_trace_and_slo(words, tmp_path):
    out = tune(*words, "--help", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "--trace FILE" in out.stdout and "--slo SPEC" in out.stdout


@pytest.mark.parametrize("words", COMMANDS.values(), ids=COMMANDS.keys())
@pytest.mark.parametrize("bad, says", [("ttft<3", "cannot read 'ttft<3'"),
                                       ("ttft:p99<2s,speed:p50<1s", "cannot read 'speed:p50<1s'"),
                                       ("ttft:p0<1s", "percentile in 'ttft:p0<1s' must be between 0 and 100"),
                                       ("ttft:p99<0s", "the threshold in 'ttft:p99<0s' must be above 0"),
                                       ("", "empty; write e.g. 'ttft:p99<2s,tpot:p99<100ms', or leave --slo out"),
                                       (" ", "empty; write e.g."),
                                       ("ttft:p99<1s,ttft:p99<2s", "ttft:p99 is bound twice")])
def test_a_bad_slo_is_a_usage_error_naming_the_flag(words, bad, says, capsys):
    with pytest.raises(SystemExit) as info:
        _build_parser().parse_args([*words, "--trace", "traffic.jsonl", "--slo", bad])
    assert info.value.code == 2
    assert f"argument --slo: {says}" in capsys.readouterr().err


@pytest.mark.parametrize("words", COMMANDS.values(), ids=COMMANDS.keys())
def test_a_bad_slo_exits_2_naming_the_flag_without_a_traceback(words, tmp_path):
    (tmp_path / "traffic.jsonl").write_text('{"timestamp": 0, "prompt": "Hello", "output_length": 4}\n')
    before = sorted(p.name for p in tmp_path.iterdir())
    out = tune(*words, "--trace", "traffic.jsonl", "--slo", "ttft<3", cwd=tmp_path)
    assert out.returncode == 2, out.stdout + out.stderr
    assert "argument --slo: cannot read 'ttft<3'" in out.stderr and "Traceback" not in out.stderr + out.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # refused before anything was started or written
