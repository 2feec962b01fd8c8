"""`tune --gpus`: one worker process per GPU (group), pinned with CUDA_VISIBLE_DEVICES, on one study.
The launcher is tested with plain child processes (no GPU here); the study logic that lets several
workers share one study is tested in tests/reliability (scripted and real engines)."""

from __future__ import annotations

import os
import signal
import sys
import threading

import pytest

from tests.conftest import ROOT, run_tune
from tracetune.cli.workers import last_line, parse_gpus, run_workers, worker_argv
from tracetune.errors import InputError


def test_gpu_lists():
    assert parse_gpus("0,1") == ["0", "1"]
    assert parse_gpus("0+1, 2+3") == ["0,1", "2,3"]
    for bad in ("", "0,,1", "a", "0,0", "0+1,1"):
        with pytest.raises(InputError, match="--gpus"):
            parse_gpus(bad)


def test_a_workers_command_line_is_the_users_without_gpus_with_its_own_port():
    argv = ["--trace", "t.jsonl", "--gpus", "0,1", "--engine-port", "8100", "--trials", "4"]
    assert worker_argv(argv, 0) == ["--trace", "t.jsonl", "--trials", "4", "--engine-port", "8100"]
    assert worker_argv(argv, 1) == ["--trace", "t.jsonl", "--trials", "4", "--engine-port", "8101"]
    assert worker_argv(["--gpus=0,1", "--trace", "t.jsonl"], 1) == ["--trace", "t.jsonl"]  # a free port each


def test_each_worker_sees_only_its_gpus_and_the_worst_exit_code_is_returned(tmp_path):
    show = "import os, sys; print('gpus', os.environ['CUDA_VISIBLE_DEVICES']); sys.exit(int(sys.argv[1]))"
    logs = [tmp_path / "worker-0.log", tmp_path / "worker-1.log"]
    lines = []
    code = run_workers([[sys.executable, "-c", show, "0"], [sys.executable, "-c", show, "3"]],
                       [{"CUDA_VISIBLE_DEVICES": "0"}, {"CUDA_VISIBLE_DEVICES": "1,2"}], logs,
                       report=lines.append, every_s=0.0)
    assert code == 3
    assert logs[0].read_text().strip() == "gpus 0" and logs[1].read_text().strip() == "gpus 1,2"
    assert last_line(logs[1]) == "gpus 1,2"


def test_sigterm_reaches_every_worker(tmp_path):
    """A scheduler's SIGTERM to `tune --gpus` is passed to each worker (which stops its engine and
    re-queues its trial); the launcher reports the interruption."""
    wait = ("import signal, sys, time; signal.signal(signal.SIGTERM, lambda *a: (print('stopping'), sys.exit(0)));"
            "print('ready', flush=True); time.sleep(60)")
    logs = [tmp_path / "worker-0.log", tmp_path / "worker-1.log"]

    def term_when_ready():
        import time
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not all(log.exists() and "ready" in log.read_text() for log in logs):
            time.sleep(0.05)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=term_when_ready, daemon=True).start()
    code = run_workers([[sys.executable, "-c", wait]] * 2, [{}, {}], logs, report=lambda line: None)
    assert code == 130
    assert all(log.read_text().split() == ["ready", "stopping"] for log in logs)


def test_gpus_on_a_machine_without_nvidia_gpus_is_a_clear_error(tmp_path):
    res = run_tune("--trace", str(ROOT / "examples" / "traffic.jsonl"), "--gpus", "0,1", "--run-dir",
                   str(tmp_path), timeout=300)
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert "--gpus starts one worker per NVIDIA GPU" in res.stderr


def test_tensor_parallel_is_a_knob_counted_per_gpu_and_checked_against_the_workers_gpus(monkeypatch):
    from pathlib import Path

    from tracetune.engine_adapter.platform import Platform
    from tracetune.engine_adapter.vllm.server import build_command
    from tracetune.engine_adapter.vllm.translate import to_engine_config
    from tracetune.errors import Rejected

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    config = to_engine_config({"tensor_parallel_size": 2}, fixed={}, platform=Platform.CUDA, model_dir=Path("m"))
    assert config.gpus() == 2
    argv, _ = build_command(config, Platform.CUDA)
    assert argv[argv.index("--tensor-parallel-size") + 1] == "2"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")
    with pytest.raises(Rejected, match="spans 2 GPUs and this worker sees 1"):
        to_engine_config({"tensor_parallel_size": 2}, fixed={}, platform=Platform.CUDA, model_dir=Path("m"))
