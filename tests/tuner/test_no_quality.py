"""A study that neither optimises nor gates quality (or runs random weights, whose plan drops both)
spends no time on a quality probe: the runner is handed none, the reference is stored without one,
and the study resumes and reports from that. Scripted runner; the study and its database are real."""

from __future__ import annotations

import dataclasses
import io
from typing import Any

from rich.console import Console

from tests.reliability.scripted import ScriptedRunner, make_tuner

SPACE = "name: s\nparameters:\n  max_num_seqs: {choices: [4, 8, 16]}\n"


class Recording(ScriptedRunner):
    """The scripted runner, keeping the probe each measurement was handed."""

    def __init__(self, probes: list) -> None:
        super().__init__(lambda config: (0.3, 60.0 + config.max_num_seqs, 0.0), calls=[])
        self.probes = probes

    def measure(self, config: Any, label: str, **kwargs: Any):
        self.probes.append(kwargs.get("probe"))
        measured = super().measure(config, label, **kwargs)
        if kwargs.get("probe") is None:  # what a run handed no probe measures
            measured = dataclasses.replace(measured, quality=None, reference=None)
        return measured


def study(tmp_path, probes: list, trials: int):
    return make_tuner(tmp_path, lambda c: (0.3, 60.0, 0.0), space_yaml=SPACE, trials=trials,
                      objectives=["ttft_p99", "output_tps"], runner=Recording(probes))


def test_no_probe_when_quality_is_neither_an_objective_nor_gated(tmp_path):

    from tracetune.cli.results import report_results
    from tracetune.dashboard.data import load_study

    probes: list = []
    tuner = study(tmp_path, probes, trials=2)
    assert not tuner.settings.measures_quality
    tuner.run()
    assert len(probes) == 3 and probes == [None] * 3  # the reference and both trials
    assert tuner.store.reference("s")["probe"] is None
    resumed = study(tmp_path, probes, trials=3)
    resumed.run()  # the stored reference, without a probe, reads back
    assert len(probes) == 4 and probes[-1] is None
    out = io.StringIO()
    report_results(resumed, Console(file=out, width=120), tmp_path)
    text = out.getvalue()
    assert "verdict:" in text and "noise floor" not in text and "quality vs" not in text
    view = load_study(resumed.settings.storage_url, "s")  # the dashboard reads it too
    assert view.noise_floor == {} and all(t.quality is None for t in view.trials)


def test_a_probe_when_quality_is_an_objective(tmp_path):
    probes: list = []
    tuner = make_tuner(tmp_path, lambda c: (0.3, 60.0, 0.0), space_yaml=SPACE, trials=1,
                       runner=Recording(probes))
    assert tuner.settings.measures_quality
    tuner.run()
    assert probes[0] is not None and probes[0].reference is None  # the reference builds the texts
