"""A study several workers share, as the dashboard shows it: which worker measured each trial (a worker
column in the Trials table, a line in Trial detail), the worker measuring a running trial with its last
heartbeat, and nothing new for a study one worker ran. Read-only throughout."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import optuna
import pytest
from optuna.distributions import IntDistribution
from optuna.trial import TrialState, create_trial

from tests.dashboard.synthetic import add_measured_trial, beat
from tests.dashboard.test_storage_readonly import fingerprint
from tracetune.dashboard import data, tables
from tracetune.tuner.trial_record import Attr


def _copy(synthetic_url: str, folder: Path) -> str:
    folder.mkdir()
    shutil.copy(synthetic_url[len("sqlite:///"):], folder / "study.db")
    return f"sqlite:///{folder / 'study.db'}"


def _add(url: str, state: TrialState, worker: str, max_num_seqs: int) -> int:
    """A RUNNING or WAITING trial carrying `worker`'s name (a re-queued one keeps the dead worker's)."""
    study = optuna.load_study(study_name="synth", storage=url)
    study.add_trial(create_trial(state=state, params={"max_num_seqs": max_num_seqs},
                                 distributions={"max_num_seqs": IntDistribution(1, 128)},
                                 user_attrs={Attr.VALUES.value: {"max_num_seqs": max_num_seqs},
                                             Attr.WORKER_NAME.value: worker}))
    return len(study.trials) - 1


@pytest.fixture(scope="module")
def fleet(synthetic_url, tmp_path_factory) -> tuple[str, dict[str, int]]:
    """The synthetic study (its trials from before workers were named), then trials of two workers: one
    each measured, one pod-1 is measuring (its heartbeat 3 s ago), one re-queued after pod-2 died."""
    url = _copy(synthetic_url, tmp_path_factory.mktemp("fleet") / "db")
    numbers = {"pod-0": add_measured_trial(url, ttft=0.2, tps=50.0, loss=0.0, max_num_seqs=48, worker="pod-0"),
               "pod-1": add_measured_trial(url, ttft=0.4, tps=55.0, loss=0.0, max_num_seqs=96, worker="pod-1"),
               "running": _add(url, TrialState.RUNNING, "pod-1", 12),
               "queued": _add(url, TrialState.WAITING, "pod-2", 20)}
    beat(url, numbers["running"], seconds_ago=3.0)
    return url, numbers


def test_each_trial_shows_the_worker_that_measured_it(fleet):
    url, numbers = fleet
    before = fingerprint(Path(url[len("sqlite:///"):]))
    study = data.load_study(url, "synth")
    rows = {r["trial"]: r for r in tables.trial_table(study)}
    assert study.workers == ["pod-0", "pod-1"] and study.several_workers  # pod-2's trial waits: no worker now
    assert rows[numbers["pod-0"]]["worker"] == "pod-0" and rows[numbers["pod-1"]]["worker"] == "pod-1"
    assert re.fullmatch(r"pod-1 · beat \d s ago", rows[numbers["running"]]["worker"])
    assert rows[numbers["queued"]]["worker"] == "-" and rows[numbers["queued"]]["status"] == "queued"
    assert {rows[n]["worker"] for n in range(6)} == {"-"}  # trials from before workers were named
    assert tables.decision_columns(study)[-1] == "worker"
    assert data.worker_note(study.trial(numbers["pod-0"]), 60) == "measured by worker pod-0"
    running = data.worker_note(study.trial(numbers["running"]), 1200)
    assert re.fullmatch(r"running: worker pod-1 is measuring it now \(its last heartbeat \d s ago; a worker "
                        r"silent for 1200 s is taken for gone\)", running), running
    assert data.worker_note(study.trial(numbers["queued"]), 60) == ""
    assert fingerprint(Path(url[len("sqlite:///"):])) == before  # read, never written


def test_a_study_one_worker_ran_reads_as_before(synthetic_url, tmp_path):
    """The same trials with and without one worker's name: the same table, no worker column."""
    named, unnamed = _copy(synthetic_url, tmp_path / "named"), _copy(synthetic_url, tmp_path / "unnamed")
    for url, worker in ((named, "host:123"), (unnamed, None)):
        add_measured_trial(url, ttft=0.2, tps=50.0, loss=0.0, max_num_seqs=48, worker=worker)
    views = [data.load_study(url, "synth") for url in (named, unnamed)]
    assert views[0].workers == ["host:123"] and not views[0].several_workers
    assert tables.trial_table(views[0]) == tables.trial_table(views[1])
    assert "worker" not in tables.trial_table(views[0])[0]
    assert tables.decision_columns(views[0]) == tables.decision_columns(views[1])
    assert data.worker_note(views[0].trials[-1], 60) == "measured by worker host:123"


def test_an_interrupted_trial_names_the_worker_that_stopped():
    status, reason = data.trial_status("RUNNING", None, None, silent_s=400.0, started_s=None, grace_s=60.0,
                                       worker="pod-3")
    assert status == "interrupted" and reason is not None
    assert reason.startswith("interrupted: its worker pod-3 stopped sending heartbeats 400 s ago")
    _, unnamed = data.trial_status("RUNNING", None, None, silent_s=400.0, started_s=None, grace_s=60.0)
    assert unnamed is not None and unnamed.startswith("interrupted: its worker stopped sending heartbeats")


def test_the_pages_show_the_workers(monkeypatch, fleet):
    """Under Streamlit: the header counts the workers, the Trials table has their column by default, Trial
    detail names the worker measuring a running trial and the one that measured a finished one."""
    from tests.dashboard.test_app import open_app

    url, numbers = fleet
    at = open_app(monkeypatch, url, "synth", "Trials")
    assert any(" · 2 workers · running · read " in c.value for c in at.caption)
    table = at.dataframe[0].value
    assert list(table.columns)[-1] == "worker"
    assert table.loc[table["trial"] == str(numbers["pod-0"]), "worker"].item() == "pod-0"
    at.sidebar.radio(key="page").set_value("Trial detail").run()
    at.selectbox(key="detail_trial").set_value(numbers["running"]).run()
    assert any(i.value.startswith("running: worker pod-1 is measuring it now (its last heartbeat") for i in at.info)
    at.selectbox(key="detail_trial").set_value(numbers["pod-1"]).run()
    assert any(c.value == "measured by worker pod-1" for c in at.caption)
    assert not at.exception and not at.error
