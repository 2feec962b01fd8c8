"""A trial ends in one place (tuner.trial_end.TrialEnd.record): its row first, then its attributes with
the status last, then the reporter; the same attributes for every kind of outcome as before."""

from __future__ import annotations

import optuna
import pytest

from tests.reliability.scripted import fake_quality, fake_summary
from tracetune.replay.metrics import SLO
from tracetune.replay.types import ReplayOptions
from tracetune.tuner.objectives import FAILED_VIOLATION
from tracetune.tuner.reporter import NullReporter
from tracetune.tuner.runner import Measurement
from tracetune.tuner.secrets import Redactor
from tracetune.tuner.settings import StudySettings
from tracetune.tuner.storage import Status
from tracetune.tuner.trial_end import Attempt, Infeasible, Measured, Reused, TrialEnd


class Log:
    """What happened, in order: store writes, attributes set, reporter events."""

    def __init__(self) -> None:
        self.events: list[str] = []
        self.rows: list[dict] = []


class Store:
    def __init__(self, log: Log) -> None:
        self.log = log

    def save_trial(self, study_name: str, number: int, status: str, **columns: object) -> None:
        self.log.events.append("row")
        self.log.rows.append({"status": str(status), **columns})

    def save_levels(self, study_name: str, number: int, levels: object) -> None:
        self.log.events.append("levels")


class Reporter(NullReporter):
    def __init__(self, log: Log) -> None:
        self.log = log

    def on_trial_done(self, **kw: object) -> None:
        self.log.events.append("done")

    def on_trial_failed(self, **kw: object) -> None:
        self.log.events.append("failed")

    def on_trial_pruned(self, **kw: object) -> None:
        self.log.events.append("pruned")

    def on_duplicate(self, **kw: object) -> None:
        self.log.events.append("duplicate")


class Trial:
    """A running Optuna trial whose attribute writes are logged."""

    def __init__(self, trial: optuna.trial.Trial, log: Log) -> None:
        self._trial, self.log = trial, log

    def set_user_attr(self, key: str, value: object) -> None:
        self.log.events.append(f"attr {key}")
        self._trial.set_user_attr(key, value)

    def __getattr__(self, name: str) -> object:
        return getattr(self._trial, name)


def record(outcome, *, secrets=()):
    log = Log()
    settings = StudySettings(study_name="s", storage_url="sqlite://", trials=4, objectives=["ttft_p99", "output_tps"],
                             slos=[SLO("ttft", "p99", 2.0)], max_quality_loss=None, sampler="random", seed=0,
                             replay=ReplayOptions())
    study = optuna.create_study(directions=["minimize", "maximize"])
    trial = Trial(study.ask(), log)
    ending = TrialEnd(settings, Store(log), Reporter(log), Redactor(list(secrets)))  # type: ignore[arg-type]
    values = ending.record(trial, Attempt(0, {"max_num_seqs": 8}, config={"max_num_seqs": 8}), outcome,
                           reference_values=None)
    return log, dict(trial.user_attrs), values


def measurement(error_rate: float = 0.0) -> Measurement:
    return Measurement(summary=fake_summary(0.5, 100.0, error_rate), quality=fake_quality(0.0), startup_s=3.0)


def test_a_measured_trial_stores_its_row_then_its_attributes_then_tells_the_reporter():
    log, attrs, values = record(Measured(measurement(), [0.5, 100.0], [-1.5]))
    assert log.events == ["row", "levels", "attr sampler_constraints", "attr feasible", "attr constraints",
                          "attr status", "done"]
    assert attrs == {"sampler_constraints": [0.0, -1.5], "feasible": True, "constraints": [-1.5],
                     "status": "measured"}
    assert values == [0.5, 100.0]
    assert log.rows[0]["status"] == "measured" and log.rows[0]["failure_reason"] is None


def test_failed_requests_keep_the_measurement_but_not_its_feasibility():
    _, attrs, _ = record(Measured(measurement(error_rate=0.2), [0.5, 100.0], [-1.5]))
    assert attrs["feasible"] is False
    assert attrs["failure_reason"] == "20% of requests failed, e.g. ['timed out after 5.0s']"


def test_a_pruned_trial_tells_the_sampler_its_values_but_stays_off_the_front():
    log, attrs, values = record(Measured(measurement(), [0.5, 100.0], [-1.5], status=Status.PRUNED,
                                         reason="pruned: fails 2x"))
    assert attrs["status"] == "pruned" and attrs["feasible"] is False and attrs["failure_reason"] == "pruned: fails 2x"
    assert values == [0.5, 100.0] and log.events[-1] == "pruned"
    assert log.rows[0]["failure_reason"] == "pruned: fails 2x"


def test_a_measured_but_not_meaningful_trial_is_kept_off_the_front_with_its_reason():
    _, attrs, _ = record(Measured(measurement(), [0.5, 100.0], [-1.5], reason="random weights",
                                  not_meaningful="random weights"))
    assert attrs["not_meaningful"] == attrs["failure_reason"] == "random weights" and attrs["feasible"] is False


def test_a_reused_result_is_a_duplicate_the_sampler_sees_with_the_originals_values():
    log, attrs, values = record(Reused(2, [0.5, 100.0], [-1.5], error_rate=0.0, error_examples=[], note="same as 2"))
    assert attrs == {"sampler_constraints": [0.0, -1.5], "feasible": False, "constraints": [-1.5],
                     "duplicate_of": 2, "status": "duplicate"}
    assert values == [0.5, 100.0] and log.events[0] == "row" and log.events[-1] == "duplicate"
    assert log.rows[0] == {"status": "duplicate", "values": {"max_num_seqs": 8}, "config": {"max_num_seqs": 8},
                           "failure_reason": "same as 2", "wall_s": pytest.approx(log.rows[0]["wall_s"])}


def test_an_infeasible_trial_gets_penalties_every_constraint_broken_and_its_reason_redacted():
    log, attrs, values = record(Infeasible(Status.ENGINE_FAILED, "crashed with key sk-123", log_tail="x sk-123"),
                                secrets=["sk-123"])
    assert log.events[0] == "row" and log.events[-2:] == ["attr status", "failed"]
    assert attrs["status"] == "engine_failed" and attrs["feasible"] is False
    assert attrs["constraints"] == [FAILED_VIOLATION] and attrs["sampler_constraints"] == [FAILED_VIOLATION] * 2
    assert "sk-123" not in attrs["failure_reason"] and "sk-123" not in attrs["log_tail"]
    assert values == [0.0, 0.0]  # nothing measured yet: the worst latency seen is 0, no throughput


def test_an_unusable_measurement_is_stored_with_what_it_measured():
    log, attrs, _ = record(Infeasible(Status.FAILED, "an objective could not be measured (NaN)",
                                      measurement=measurement()))
    assert log.events[:2] == ["row", "levels"]
    assert log.rows[0]["status"] == "failed" and log.rows[0]["summary"]["requests"] == 10
    assert "log_tail" not in attrs
