"""Two real `tune --engine sim` workers on one PostgreSQL study, then the dashboard reading it: each trial
names the worker that measured it, one named by TRACETUNE_WORKER (as a fleet's pods are), the other by its
host and pid, and the Trials table gets its worker column."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time

import pytest

from tests.reliability.engines import kill_tagged, new_tag
from tests.reliability.pg import postgres_url  # noqa: F401 - fixture
from tracetune.dashboard import data, tables
from tracetune.tuner.worker_name import ENV_WORKER

pytestmark = pytest.mark.integration

# The quickest study the simulated engine runs: trace-rate replays of 10 requests, a probe of 8 tokens.
QUICK = ["--engine", "sim", "--trials", "4", "--study", "fleet", "--no-presets", "--max-quality-loss", "none",
         "--probe-prompts", "1", "--probe-tokens", "8", "--acceptance-prompts", "0", "--heartbeat", "5"]


def test_two_workers_trials_read_back_with_their_workers(tmp_path, postgres_url):  # noqa: F811
    trace = tmp_path / "trace.jsonl"
    trace.write_text("".join(json.dumps({"timestamp": round(i * 0.1, 3), "prompt": f"Question {i}: a queue?",
                                         "output_length": 8}) + "\n" for i in range(10)))
    tag = new_tag()
    base = {k: v for k, v in os.environ.items() if k != ENV_WORKER} | {"TRACETUNE_TEST_TAG": tag}
    procs = [subprocess.Popen([sys.executable, "-m", "tracetune", "--trace", str(trace), "--storage", postgres_url,
                               "--run-dir", str(tmp_path / f"run-{i}"), *QUICK], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for i, env in enumerate((base | {ENV_WORKER: "tune-worker-0"}, base))]
    try:
        deadline = time.monotonic() + 120  # about 30 s on 2 busy cores: a hung worker fails the test
        for p in procs:
            p.wait(timeout=max(deadline - time.monotonic(), 0.1))
    except subprocess.TimeoutExpired:
        pass
    finally:
        for p in procs:
            p.kill()
        outputs = [p.communicate()[0] for p in procs]
        kill_tagged(tag)  # engines a killed worker left behind
    assert [p.returncode for p in procs] == [0, 0], "\n".join(out[-3000:] for out in outputs)
    study = data.load_study(postgres_url, "fleet")
    workers = {t.number: t.worker for t in study.trials if t.status != "queued"}
    assert set(workers.values()) == {"tune-worker-0", f"{socket.gethostname()}:{procs[1].pid}"}, workers
    assert study.several_workers
    rows = tables.trial_table(study)
    assert {r["worker"] for r in rows} == set(workers.values())
