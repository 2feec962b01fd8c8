"""A trial's Optuna attributes (tuner.trial_record.TrialRecord): written and read in one place, and
studies written before it read the same."""

from __future__ import annotations

import optuna
import pytest

from tracetune.tuner.storage import Status
from tracetune.tuner.trial_record import Attr, TrialRecord


def test_a_record_written_on_a_trial_reads_back_the_same():
    study = optuna.create_study()
    trial = study.ask()
    written = TrialRecord(values={"max_num_seqs": 8, "speculative": "ngram"}, worker="host:1:ab", worker_name="pod-1",
                          config={"max_num_seqs": 8}, failure_reason="12% of requests failed", feasible=False,
                          constraints=[0.5, -1.0], duplicate_of=3, not_meaningful="random weights",
                          status=Status.DUPLICATE)
    written.write(trial)
    study.tell(trial, 1.0)
    frozen = study.trials[0]
    assert frozen.user_attrs["status"] == "duplicate"  # stored as the plain string
    assert TrialRecord.of(frozen) == written
    assert TrialRecord.of(frozen).status is Status.DUPLICATE


def test_fields_left_none_are_not_written_and_the_status_comes_last():
    class Trial:
        def __init__(self) -> None:
            self.keys: list[str] = []

        def set_user_attr(self, key: str, value: object) -> None:
            self.keys.append(key)

    trial = Trial()
    TrialRecord(status=Status.FAILED, failure_reason="could not prepare", feasible=False).write(trial)  # type: ignore[arg-type]
    assert trial.keys == ["failure_reason", "feasible", "status"]


def test_every_field_has_its_key():
    assert {a.value for a in Attr} - {"sampler_constraints"} == {
        f.name for f in TrialRecord.__dataclass_fields__.values()}


@pytest.mark.parametrize("attrs, feasible, counts, measured", [
    ({}, True, False, True),  # a complete trial of the first tracetune: no attributes at all
    ({"constraints": [-0.2], "values": {"max_num_seqs": 4}}, True, False, True),  # before `status` and `feasible`
    ({"status": "measured", "feasible": False, "constraints": [0.3]}, False, True, True),
    ({"status": "pruned", "feasible": False}, False, True, False),
    ({"status": "rejected", "feasible": False}, False, False, False),
])
def test_older_studies_read_as_they_were_written(attrs, feasible, counts, measured):
    record = TrialRecord.read(attrs)
    assert record.is_feasible is feasible
    assert record.counts is counts
    assert record.measured is measured
    assert record.ended is ("status" in attrs)
    assert record.worker_name is None  # from before workers were named: the dashboard shows no worker


def test_a_status_this_version_does_not_know_stays_its_string():
    record = TrialRecord.read({"status": "someday_new", "duplicate_of": 4})
    assert record.status == "someday_new" and not isinstance(record.status, Status)
    assert record.duplicate_of == 4 and not record.counts and not record.skipped
