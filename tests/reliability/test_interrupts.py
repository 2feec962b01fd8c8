"""Records first, summary second: `tune replay` and `tune capacity` keep every request that finished
when Ctrl-C or SIGTERM stops them mid-run (the records on disk, a partial summary marked
interrupted, exit 130 / 143), keep an earlier run's results folder, and keep the records when the
summary itself fails. The commands run as subprocesses against a slow server on loopback."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.reliability.fault_server import FaultServer

CODES = {signal.SIGINT: 130, signal.SIGTERM: 143}


def write_trace(path: Path, n: int, gap_s: float, tokens: int = 2) -> Path:
    path.write_text("".join(json.dumps({"timestamp": i * gap_s, "prompt": f"hello number {i}",
                                        "output_length": tokens}) + "\n" for i in range(n)))
    return path


def start_tune(args: list[str], cwd: Path) -> subprocess.Popen:
    env = {**os.environ, "COLUMNS": "200", "HF_HUB_OFFLINE": "1"}
    return subprocess.Popen([sys.executable, "-m", "tracetune", *args], cwd=cwd, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def lines_of(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def wait_for(ready, proc: subprocess.Popen, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not ready():
        if proc.poll() is not None:
            raise AssertionError(f"tune ended (exit {proc.returncode}) before the test's moment:\n"
                                 f"{proc.communicate()[0]}")
        if time.monotonic() > deadline:
            proc.kill()
            raise AssertionError(f"no such moment within {timeout_s:.0f}s:\n{proc.communicate()[0]}")
        time.sleep(0.05)


def stopped(proc: subprocess.Popen, signum: int) -> str:
    proc.send_signal(signum)
    out = proc.communicate(timeout=60)[0]
    assert proc.returncode == CODES[signum], out
    assert "Traceback" not in out and "engine" not in out, out  # no engine was started: none is mentioned
    return out


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
@pytest.mark.parametrize("procs", [1, 2])
def test_interrupted_replay_keeps_every_finished_request(tmp_path, signum, procs):
    trace = write_trace(tmp_path / "t.jsonl", 82, 0.05)  # 80 measured requests over 4 s
    records = tmp_path / "out" / "requests.jsonl"
    with FaultServer("slow", delay_s=0.3) as server:
        proc = start_tune(["replay", "--trace", str(trace), "--endpoint", server.base_url, "--out", "out",
                           "--client-procs", str(procs)], tmp_path)
        wait_for(lambda: len(lines_of(records)) >= 5, proc)
        seen = len(lines_of(records))
        out = stopped(proc, signum)
    kept = lines_of(records)
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert seen <= len(kept) < 80, out  # stopped mid-replay, nothing seen before the signal lost
    assert summary["interrupted"] is True and summary["requests_finished"] == len(kept)
    assert summary["summary"]["requests"] == len(kept)
    # Only requests that finished: those cut off by the stop are not recorded as failures.
    assert all(r["success"] for r in kept), [r["error"] for r in kept if not r["success"]]
    assert len({r["index"] for r in kept}) == len(kept)
    assert f"the {len(kept)} requests that finished are in out/requests.jsonl" in out.replace("\n", " "), out


def test_replay_interrupted_before_sending_writes_nothing(tmp_path):
    trace = write_trace(tmp_path / "t.jsonl", 5, 0.1)
    with FaultServer("slow", delay_s=3.0) as server:
        # The warm-up request takes 3 s: the signal comes while it is in flight, before any is measured.
        proc = start_tune(["replay", "--trace", str(trace), "--endpoint", server.base_url, "--out", "out",
                           "--warmup", "1"], tmp_path)
        wait_for(lambda: server.requests >= 1, proc)
        out = stopped(proc, signal.SIGTERM)
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["interrupted"] is True and summary["requests_finished"] == 0 and summary["summary"] is None
    assert not (tmp_path / "out" / "requests.jsonl").exists()
    assert "no request had finished" in out, out


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_interrupted_capacity_keeps_the_levels_done(tmp_path, signum):
    trace = write_trace(tmp_path / "t.jsonl", 21, 0.05)  # 20 measured requests over 1 s at k = 1
    records = tmp_path / "out" / "requests.jsonl"
    with FaultServer("slow", delay_s=0.1) as server:  # never fails the SLO: the search climbs level after level
        proc = start_tune(["capacity", "--trace", str(trace), "--endpoint", server.base_url, "--slo", "e2e:p99<5s",
                           "--level-seconds", "0.5", "--level-lifetimes", "0", "--level-requests", "10",
                           "--warmup", "1", "--json", "cap.json", "--out", "out"], tmp_path)
        wait_for(lambda: any(r["level"] >= 3 for r in lines_of(records)), proc)
        out = stopped(proc, signum)
    result = json.loads((tmp_path / "cap.json").read_text())
    steps = result["steps"]
    assert result["interrupted"] is True and len(steps) >= 2, out
    kept = lines_of(records)
    for level, step in enumerate(steps, 1):  # every request of every level done is on disk, with its level
        mine = [r for r in kept if r["level"] == level]
        assert len(mine) == step["requests"] == step["planned"] and {r["scale"] for r in mine} == {step["scale"]}
    assert all(r["success"] for r in kept)
    assert f"{len(steps)} load levels done" in out and "cap.json (marked interrupted)" in out, out


def test_replay_never_writes_over_an_earlier_run(tmp_path):
    trace = write_trace(tmp_path / "t.jsonl", 4, 0.01)
    earlier = tmp_path / "out"
    earlier.mkdir()
    (earlier / "summary.json").write_text('{"earlier": true}')
    (earlier / "requests.jsonl").write_text('{"index": 0}\n')
    with FaultServer("ok") as server:
        proc = start_tune(["replay", "--trace", str(trace), "--endpoint", server.base_url, "--out", "out"], tmp_path)
        out = proc.communicate(timeout=60)[0]
    assert proc.returncode == 0, out
    assert (earlier / "summary.json").read_text() == '{"earlier": true}'
    assert (earlier / "requests.jsonl").read_text() == '{"index": 0}\n'
    assert "out holds an earlier run's results (kept as they are); writing to out-2" in out, out
    assert len(lines_of(tmp_path / "out-2" / "requests.jsonl")) == 2  # 4 requests, 2 of them warm-up
    assert "interrupted" not in json.loads((tmp_path / "out-2" / "summary.json").read_text())


def test_a_failing_summary_keeps_the_records(tmp_path, monkeypatch, capsys):
    """One value no one foresaw breaks the summary: the records are on disk all the same."""
    from tracetune.cli.main import main
    from tracetune.replay import metrics

    def broken(*args, **kwargs):
        raise ValueError("a value no one foresaw")

    monkeypatch.setattr(metrics, "summarize", broken)
    monkeypatch.chdir(tmp_path)
    trace = write_trace(tmp_path / "t.jsonl", 5, 0.01)
    with FaultServer("ok") as server:
        code = main(["replay", "--trace", str(trace), "--endpoint", server.base_url, "--out", "out"])
    err = capsys.readouterr().err
    assert code == 1 and "Traceback" not in err
    assert "the replay's summary failed (ValueError: a value no one foresaw)" in err.replace("\n", " ")
    assert len(lines_of(tmp_path / "out" / "requests.jsonl")) == 3
