"""A fleet on one PostgreSQL study (the test setup's server): four `tune --engine sim` workers, one
SIGKILLed while it measures a trial, the others finishing the study with no configuration measured
twice, no finished trial lost and nothing left RUNNING (benchmarks/fleet_workers.py starts and
watches them, as benchmarks/fleet_scale.py does at 16). And what 16 workers found: a worker the
database refuses (its connection limit reached) stops with the database's reason, not an Optuna
traceback; a dead worker's re-queued trial, taken up by a live one, is not failed again as the
dead worker's."""

from __future__ import annotations

import socket
import subprocess

import optuna
import psycopg
import pytest

from benchmarks.fleet_workers import REPLAY_TRIALS, engine_starts, kill_mid_trial, outcome, start_workers, wait_all
from tests.reliability.pg import postgres_url  # noqa: F401 - fixture
from tracetune.errors import TuneError
from tracetune.tuner.coordination import Coordinator, make_storage
from tracetune.tuner.reporter import NullReporter
from tracetune.tuner.storage import ResultStore
from tracetune.tuner.trial_record import TrialRecord

# Six configurations for a budget of six: the workers' draws collide (their seeds are fixed), so the
# claims decide who measures a configuration and who reuses it.
SIX = """\
name: six
parameters:
  max_num_seqs: {choices: [2, 8, 32]}
  precision: {choices: [bf16, int4]}
"""


@pytest.mark.integration
def test_four_sim_workers_lose_nothing_when_one_is_killed_mid_trial(tmp_path, postgres_url):  # noqa: F811
    workers = start_workers(4, postgres_url, tmp_path, trials=6, heartbeat_s=2, flags=REPLAY_TRIALS, space_yaml=SIX)
    try:
        kills = kill_mid_trial(postgres_url, workers, 1, min_finished=1, timeout_s=60)
    finally:
        finished = wait_all(workers, 90)
    logs = "\n".join((tmp_path / f"worker-{w.index:02d}.log").read_text()[-1500:] for w in workers)
    assert kills.at is not None, f"no worker was seen mid-trial after a finished trial\n{logs}"
    assert finished, logs
    killed = set(kills.trials.values())
    assert [w.proc.returncode for w in workers if w.pid not in killed] == [0, 0, 0], logs
    got = outcome(postgres_url, kills)
    # Racing workers may each start "the last" trial: at least the budget, never fewer.
    assert got["counted"] >= 6, got
    assert got["duplicates"] >= 1, got  # draws collided ...
    assert got["measured"] == got["distinct_configs"], got  # ... and no configuration was measured twice
    assert engine_starts(workers) == got["measured"] + 1, got  # one engine more: the killed trial's
    assert got["states"].get("RUNNING", 0) == 0 and got["claims_running"] == 0, got
    assert got["kills"]["lost"] == [] and got["kills"]["finished_before"] >= 1, got
    assert got["kills"]["requeued"] == list(kills.trials) and got["kills"]["retries_complete"] == 1, got


def test_a_worker_refused_by_the_database_says_why(postgres_url):  # noqa: F811
    with psycopg.connect(postgres_url, autocommit=True) as admin:
        # A role's connection limit is refused as a full server is ("too many ..."); superusers ignore it.
        admin.execute("CREATE ROLE one_conn LOGIN CONNECTION LIMIT 1")
        url = postgres_url.replace("postgres@", "one_conn@", 1)
        with psycopg.connect(url):  # the role's only connection, taken
            with pytest.raises(TuneError, match="too many connections.*max_connections"):
                make_storage(url, 5)
            with pytest.raises(TuneError, match="refused this worker.*too many connections"):
                ResultStore(url)


@pytest.mark.filterwarnings("ignore:Heartbeat of storage")  # trials asked here, not through optimize
def test_a_retry_taken_up_by_a_live_worker_is_not_failed_as_the_dead_ones(postgres_url):  # noqa: F811
    """A dead worker's trial is re-queued; a live worker takes the retry up and, before it writes its
    own id on it, another worker recovers dead workers' trials: the retry is not one of them."""
    dead = subprocess.Popen(["true"])
    dead.wait()  # a process of this host that is gone
    storage = make_storage(postgres_url, 5)
    study = optuna.create_study(study_name="retry", storage=storage, directions=["minimize"])
    lost = study.ask({"x": optuna.distributions.IntDistribution(0, 9)})
    TrialRecord(worker=f"{socket.gethostname()}:{dead.pid}:0000").write(lost)
    store, reporter = ResultStore(postgres_url), NullReporter()
    assert Coordinator(store, study_name="retry", heartbeat_s=5, reporter=reporter).recover(study, storage) \
        == [lost.number]
    retry = study.ask()  # the live worker's, its own id not written yet
    assert study.trials[retry.number].system_attrs["failed_trial"] == lost.number and retry.params == lost.params
    assert Coordinator(store, study_name="retry", heartbeat_s=5, reporter=reporter).recover(study, storage) == []
    assert study.trials[retry.number].state == optuna.trial.TrialState.RUNNING
