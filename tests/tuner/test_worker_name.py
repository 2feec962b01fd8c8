"""A worker's readable name (`tuner.worker_name`): TRACETUNE_WORKER or host:pid, kept on each trial from
the moment it starts, so a RUNNING trial already names the worker measuring it."""

from __future__ import annotations

import os
import socket

import optuna

from tests.reliability.scripted import SEQS, ScriptedRunner, make_tuner
from tracetune.tuner.trial_record import TrialRecord
from tracetune.tuner.worker_name import ENV_WORKER, MAX_NAME_CHARS, worker_name


def test_the_environment_names_the_worker_else_host_and_pid(monkeypatch):
    monkeypatch.setenv(ENV_WORKER, "  tune-worker-3\t ")
    assert worker_name() == "tune-worker-3"
    monkeypatch.setenv(ENV_WORKER, "x" * 1000)
    assert worker_name() == "x" * MAX_NAME_CHARS
    for unset in (lambda: monkeypatch.setenv(ENV_WORKER, "  "), lambda: monkeypatch.delenv(ENV_WORKER)):
        unset()
        assert worker_name() == f"{socket.gethostname()}:{os.getpid()}"


class PeekingRunner(ScriptedRunner):
    """Measures as scripted; while measuring a trial, reads from the study's storage what its RUNNING
    trials say of their worker, as the dashboard would."""

    def __init__(self, url: str, seen: list) -> None:
        super().__init__(lambda config: (0.1, 10.0 * config.max_num_seqs, 0.0), calls=[])
        self.url, self.seen = url, seen

    def measure(self, config, label, **kwargs):
        if label != "reference":
            study = optuna.load_study(study_name="s", storage=self.url)
            self.seen += [TrialRecord.of(t).worker_name for t in study.get_trials(
                deepcopy=False, states=(optuna.trial.TrialState.RUNNING,))]
        return super().measure(config, label, **kwargs)


def test_a_running_trial_names_its_worker_and_keeps_the_name_once_measured(tmp_path, monkeypatch):
    monkeypatch.setenv(ENV_WORKER, "tune-worker-7")
    url, seen = f"sqlite:///{tmp_path / 'study.db'}", []
    tuner = make_tuner(tmp_path, None, space_yaml=SEQS, trials=2, url=url, runner=PeekingRunner(url, seen))
    study = tuner.run()
    assert seen == ["tune-worker-7", "tune-worker-7"]  # each trial, while it was RUNNING
    records = [TrialRecord.of(t) for t in study.trials]
    assert [r.worker_name for r in records] == ["tune-worker-7"] * 2
    assert all(r.worker == tuner.worker for r in records)  # claims still go by the owner id
