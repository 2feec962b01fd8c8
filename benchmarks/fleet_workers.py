"""Several `tune --engine sim` workers on one PostgreSQL study, as a fleet runs them, for
benchmarks/fleet_scale.py and the fleet integration test: start them (plain `tune` processes,
each its own --engine-port and --run-dir), find the ones measuring a trial right now, SIGKILL
them there, and read back what the study holds afterwards (`outcome`).

The study's short trials: the trace examples/traffic.jsonl (24 requests over 3 s) at twice its
speed, a capacity search under a loose SLO with 1 s levels and a 50% bracket, a 2-text quality
probe: about 10-15 s a trial with one worker on 2 cores. The space is the simulated engine's
knobs with slots 1-64, 192 configurations, so that dozens of trials rarely draw the same one.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import IO, Any

import psycopg

from tracetune.engine_adapter.process import free_port
from tracetune.tuner.coordination import config_key, counted
from tracetune.tuner.storage import COUNTED, ResultStore
from tracetune.tuner.trial_record import TrialRecord

ROOT = Path(__file__).resolve().parents[1]
TRACE = ROOT / "examples" / "traffic.jsonl"
STUDY = "fleet"
SPACE = """\
name: fleet
description: the simulated engine's knobs, slots 1-64 (192 configurations)
parameters:
  max_num_seqs: {low: 1, high: 64}
  precision: {choices: [bf16, fp8, int4]}
"""
SHORT_TRIALS = ["--engine", "sim", "--slo", "ttft:p95<3s", "--precision", "0.5", "--level-seconds", "1",
                "--level-lifetimes", "1", "--level-requests", "10", "--time-scale", "0.5", "--probe-prompts", "2",
                "--probe-tokens", "16", "--sampler", "random", "--no-presets"]
# Shorter still (the integration test): no SLO, so no capacity search: one replay of the trace a trial.
REPLAY_TRIALS = ["--engine", "sim", "--time-scale", "0.5", "--probe-prompts", "1", "--probe-tokens", "8",
                 "--max-quality-loss", "none", "--sampler", "random", "--no-presets"]


@dataclasses.dataclass
class Worker:
    """One `tune` process of the fleet."""

    index: int
    proc: subprocess.Popen
    run_dir: Path
    log: IO[bytes]

    @property
    def pid(self) -> int:
        return self.proc.pid


def start_workers(n: int, url: str, root: Path, *, trials: int, heartbeat_s: int, flags: list[str] = SHORT_TRIALS,
                  space_yaml: str = SPACE) -> list[Worker]:
    """`n` workers on study `STUDY` at `url` with the trial `flags` and search space, each with its
    own seed, engine port and run folder under `root` (its output in root/worker-NN.log)."""
    space = root / "space.yaml"
    space.write_text(space_yaml)
    workers = []
    for i in range(n):
        run_dir = root / f"worker-{i:02d}"
        args = ["--trace", str(TRACE), "--space", str(space), "--study", STUDY, "--storage", url,
                "--trials", str(trials), "--heartbeat", str(heartbeat_s), "--seed", str(i),
                "--engine-port", str(free_port()), "--run-dir", str(run_dir), *flags]
        log = open(root / f"worker-{i:02d}.log", "wb")  # noqa: SIM115 - closed by `wait_all`
        proc = subprocess.Popen([sys.executable, "-m", "tracetune", *args], cwd=ROOT, stdout=log,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env={**os.environ, "COLUMNS": "100"})
        workers.append(Worker(i, proc, run_dir, log))
    return workers


def wait_all(workers: list[Worker], timeout_s: float) -> bool:
    """Wait for every worker to exit; False (and every one left is stopped) after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    ok = True
    for w in workers:
        try:
            w.proc.wait(timeout=max(deadline - time.monotonic(), 0.1))
        except subprocess.TimeoutExpired:
            ok = False
            w.proc.terminate()
            try:
                w.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                w.proc.kill()
                w.proc.wait()
        w.log.close()
    return ok


# A worker is mid-trial when its trial is RUNNING and it holds that trial's claim (its engine is up
# and measuring), read from the study's tables as they are.
_MEASURING = """
SELECT t.number, a.value_json::json #>> '{}' FROM trials t
JOIN trial_user_attributes a ON a.trial_id = t.trial_id AND a.key = 'worker'
JOIN tracetune_claims c ON c.owner = a.value_json::json #>> '{}' AND c.trial_number = t.number
                       AND c.state = 'running'
WHERE t.state = 'RUNNING' AND c.key <> 'reference'
"""
_FINISHED = """
SELECT t.number, v.objective, v.value FROM trials t JOIN trial_values v ON v.trial_id = t.trial_id
WHERE t.state = 'COMPLETE' ORDER BY t.number, v.objective
"""


def pid_of(owner: str) -> int | None:
    """The process id in a worker id (`host:pid:random`)."""
    text = owner.split(":")[1] if owner.count(":") >= 2 else ""
    return int(text) if text.isdigit() else None


def finished_values(conn: psycopg.Connection) -> dict[int, list[float]]:
    """Every COMPLETE trial's objective values, by trial number."""
    out: dict[int, list[float]] = {}
    for number, _, value in conn.execute(_FINISHED).fetchall():
        out.setdefault(number, []).append(value)
    return out


@dataclasses.dataclass
class Kills:
    """The SIGKILLs sent mid-trial: which trial each killed worker was measuring, when, and the
    finished trials (values) as they were just before."""

    trials: dict[int, int] = dataclasses.field(default_factory=dict)  # trial number -> killed pid
    at: dt.datetime | None = None
    at_s: float = 0.0  # time.monotonic() of the kills
    finished_before: dict[int, list[float]] = dataclasses.field(default_factory=dict)
    polls: int = 0  # the watcher's own reads of the study (each one transaction)


def kill_mid_trial(url: str, workers: list[Worker], n: int, *, min_finished: int, timeout_s: float) -> Kills:
    """Once at least `min_finished` trials are COMPLETE and `n` workers are measuring a trial, SIGKILL
    those `n` (one poll: they are mid-trial in the same snapshot). Gives up after `timeout_s`."""
    ours = {w.pid: w for w in workers}
    kills = Kills()
    deadline = time.monotonic() + timeout_s
    with psycopg.connect(url, autocommit=True) as conn:
        while time.monotonic() < deadline and any(w.proc.poll() is None for w in workers):
            kills.polls += 1
            try:
                with conn.transaction():
                    finished = finished_values(conn)
                    measuring = [(num, pid_of(owner)) for num, owner in conn.execute(_MEASURING).fetchall()]
            except psycopg.errors.UndefinedTable:  # the first worker has not made the tables yet
                time.sleep(1.0)
                continue
            chosen = [(num, pid) for num, pid in measuring if pid in ours and ours[pid].proc.poll() is None][:n]
            if len(finished) >= min_finished and len(chosen) == n:
                kills.at, kills.at_s, kills.finished_before = dt.datetime.now(), time.monotonic(), finished
                for num, pid in chosen:
                    os.kill(pid, signal.SIGKILL)  # one of the workers this run started
                    kills.trials[num] = pid
                return kills
            time.sleep(1.0)
    return kills


def engine_starts(workers: list[Worker]) -> int:
    """Engines started for trials (the reference's excluded), over every worker's run folder."""
    return sum(1 for w in workers for _ in w.run_dir.glob("trial-*/engine-*.log"))


def measured_configs(rows: list[dict[str, Any]], finished: set[int]) -> dict[str, Any]:
    """Configurations measured (`rows`: the study's stored results) by the `finished` trials (COMPLETE
    in Optuna), how many distinct; and results stored by trials that did not finish (killed after
    storing, before reporting), with those whose configuration was measured again."""
    stored = [r for r in rows if r["status"] in COUNTED and r["config"]]
    keys = [config_key(r["config"]) for r in stored if r["trial_number"] in finished]
    unfinished = [r for r in stored if r["trial_number"] not in finished]
    return {"measured": len(keys), "distinct_configs": len(set(keys)),
            "unfinished_results": sorted(r["trial_number"] for r in unfinished),
            "measured_again": sorted(r["trial_number"] for r in unfinished if config_key(r["config"]) in set(keys))}


def stored_to_finished_s(rows: list[dict[str, Any]], finished: list[Any]) -> list[float]:
    """Per finished trial, seconds from its result stored to its trial COMPLETE in Optuna: while a worker
    killed there loses a stored result (`measured_configs`' unfinished ones)."""
    stored = {r["trial_number"]: r["created_at"].replace(tzinfo=dt.UTC) for r in rows}
    return sorted(round((t.datetime_complete.astimezone(dt.UTC) - stored[t.number]).total_seconds(), 2)
                  for t in finished if t.number in stored and t.datetime_complete)


def kill_outcome(trials: list[Any], kills: Kills, finished_now: dict[int, list[float]]) -> dict[str, Any]:
    """After `kills`: the trials finished before them still COMPLETE with their values (those that are
    not: `lost`), each killed trial failed and re-queued, and when."""
    import optuna

    retries = {int(t.system_attrs["failed_trial"]): t for t in trials if "failed_trial" in t.system_attrs}
    failed_at = [t.datetime_complete for t in trials if t.number in kills.trials and t.datetime_complete]
    assert kills.at is not None
    return {"killed_trials": sorted(kills.trials), "finished_before": len(kills.finished_before),
            "lost": [n for n, v in kills.finished_before.items() if finished_now.get(n) != v],
            "requeued": sorted(n for n in kills.trials if n in retries),
            "retries_complete": sum(1 for n in kills.trials
                                    if n in retries and retries[n].state == optuna.trial.TrialState.COMPLETE),
            "requeued_after_s": sorted(round((at - kills.at).total_seconds(), 1) for at in failed_at)}


def outcome(url: str, kills: Kills | None = None) -> dict[str, Any]:
    """What the study holds at the end: trials by state, counted ones by status, configurations
    measured (`measured_configs`), the claims, and after `kills` what they cost (`kill_outcome`)."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.ERROR)
    study = optuna.load_study(study_name=STUDY, storage=url.replace("postgresql://", "postgresql+psycopg://", 1))
    trials = study.get_trials(deepcopy=False)
    states = [t.state.name for t in trials]
    finished = [t for t in trials if t.state == optuna.trial.TrialState.COMPLETE]
    statuses = [str(t.user_attrs.get("status")) for t in finished if TrialRecord.of(t).counts]
    rows = ResultStore(url).trials(STUDY)
    with psycopg.connect(url, autocommit=True) as conn:
        claims = dict(conn.execute("SELECT state, count(*) FROM tracetune_claims WHERE key <> 'reference' "
                                   "GROUP BY state").fetchall())
        finished_now = finished_values(conn)
    out: dict[str, Any] = {
        "states": {s: states.count(s) for s in sorted(set(states))}, "counted": counted(study),
        "duplicates": sum(r["status"] == "duplicate" for r in rows),
        "statuses": {s: statuses.count(s) for s in sorted(set(statuses))},
        **measured_configs(rows, {t.number for t in finished}),
        "stored_to_finished_s": stored_to_finished_s(rows, finished),
        "claims_done": claims.get("done", 0), "claims_running": claims.get("running", 0),
        "timeline": [(t.number, t.state.name, t.user_attrs.get("status"), pid_of(str(t.user_attrs.get("worker", ""))),
                      str(t.datetime_start), str(t.datetime_complete), t.system_attrs.get("failed_trial"),
                      str(t.params)) for t in trials]}
    if kills is not None and kills.at is not None:
        out["kills"] = kill_outcome(trials, kills, finished_now)
    return out
