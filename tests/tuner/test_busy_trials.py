"""A trial whose capacity search ended on a busy machine (`capacity.search`, verdict machine_busy) is
unmeasurable, with the reason and the fix, never a measured (or front) trial; a reference measured on a
busy machine stops the study before anything of it is stored (every trial would be compared with it)."""

from __future__ import annotations

import pytest

from tests.reliability.scripted import SEQS, ScriptedRunner, make_tuner
from tracetune.capacity.search import search_capacity
from tracetune.capacity.step import CapacityOptions, Step
from tracetune.errors import TuneError
from tracetune.replay.metrics import parse_slos
from tracetune.tuner.storage import Status

BUSY = "machine busy: other work took 1.6 of the 2 cores the engine needs"


def busy_capacity() -> dict:
    """A search whose level 1x failed on a busy machine every time it was measured."""
    def measure(scale: float, repeat: bool) -> Step:
        return Step(scale=scale, rps=scale, output_tps=scale, attainment=0.2, passed=False, abandoned=False,
                    requests=20, planned=20, good=4, duration_s=1.0, machine_busy=BUSY)

    return search_capacity(measure, CapacityOptions(slos=tuple(parse_slos("ttft:p99<2s")))).as_dict()


class BusyRunner(ScriptedRunner):
    """Measures as scripted; the trials (and with `reference`, the reference too) on a busy machine."""

    def __init__(self, *, reference: bool = False) -> None:
        super().__init__(lambda config: (0.1, 10.0 * config.max_num_seqs, 0.0), calls=[])
        self.reference = reference

    def measure(self, config, label, **kwargs):
        measured = super().measure(config, label, **kwargs)
        if label != "reference" or self.reference:
            measured.summary.capacity = busy_capacity()
        return measured


def test_a_trial_measured_on_a_busy_machine_is_unmeasurable_and_says_why(tmp_path):
    tuner = make_tuner(tmp_path, None, space_yaml=SEQS, trials=1, runner=BusyRunner())
    tuner.run()
    (row,) = [r for r in tuner.store.trials("s") if r["trial_number"] >= 0]
    assert row["status"] == Status.UNMEASURABLE
    assert row["failure_reason"].startswith("unmeasurable: capacity not measurable: other work on this machine")
    assert "Stop the other work on this machine" in row["failure_reason"]


def test_a_reference_measured_on_a_busy_machine_stops_the_study_and_stores_nothing(tmp_path):
    tuner = make_tuner(tmp_path, None, space_yaml=SEQS, trials=1, runner=BusyRunner(reference=True))
    with pytest.raises(TuneError, match="the reference could not be measured: unmeasurable: capacity not"):
        tuner.run()
    assert tuner.store.reference("s") is None
