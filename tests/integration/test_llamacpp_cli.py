"""`tune engine check --engine llamacpp` as a user runs it: a real llama-server (the cached build of
scripts/install_llamacpp.sh) on the bundled model, started, streamed from twice (the second request
hits the slot's prompt cache), stopped; and `tune engine command --engine llamacpp` prints the
llama-server command of the same settings."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys

import pytest

pytestmark = pytest.mark.integration


def tune(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tracetune", *args], capture_output=True, text=True, timeout=300)


def test_engine_check_streams_from_a_real_llama_server(default_model, tmp_path):
    settings = ["--engine", "llamacpp", "--model", str(default_model), "--parallel", "2", "--cache-type-k", "q8_0"]
    out = tune("engine", "check", *settings, "--max-tokens", "8", "--repeat", "2", "--run-dir",
               str(tmp_path / "run"), "--json", str(tmp_path / "check.json"))
    assert out.returncode == 0, out.stderr[-2000:]
    result = json.loads((tmp_path / "check.json").read_text())
    assert result["config"]["engine"] == "llamacpp" and result["config"]["parallel"] == 2
    assert [r["output_tokens"] for r in result["requests"]] == [8, 8]
    assert all(r["ttft_s"] > 0 and r["text"] for r in result["requests"])
    assert result["engine_counters"]["prefix_cache_hits"] > 0  # the repeat reused the first prompt
    assert "healthy after" in out.stdout and "platform: cpu" in out.stdout
    command = tune("engine", "command", *settings, "--port", "9001")
    assert command.returncode == 0, command.stderr
    argv = shlex.split(command.stdout.strip().splitlines()[-1])
    assert argv[0].endswith("llama-server") and argv[argv.index("--parallel") + 1] == "2"
    assert argv[argv.index("--port") + 1] == "9001" and argv[argv.index("--cache-type-k") + 1] == "q8_0"
