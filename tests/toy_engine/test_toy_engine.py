"""A throwaway engine kind, written in this folder alone and registered here for the test's length,
runs the main job end to end: its own space, its reference, a capacity search and the quality probe
on its servers, the results under its own name, read back by the dashboard. Nothing outside this
folder names it."""

from __future__ import annotations

import json

import optuna
import pytest

from tests.toy_engine import toy
from tracetune.cli.main import main
from tracetune.engine_adapter.registry import ENGINES

TRACE = [{"timestamp": round(i * 0.1, 3), "prompt": f"Question {i}: what is a queue?", "output_length": 8 + i % 9}
         for i in range(30)]


@pytest.fixture
def registered(monkeypatch):
    """The toy engine in the registry: its one line, for this test only."""
    monkeypatch.setitem(ENGINES, toy.NAME, toy.kind)
    monkeypatch.setenv("COLUMNS", "200")


@pytest.mark.slow
def test_a_throwaway_engine_from_one_folder_runs_a_study(registered, tmp_path, capsys):
    from tracetune.dashboard.data import load_study

    trace = tmp_path / "t.jsonl"
    trace.write_text("".join(json.dumps(line) + "\n" for line in TRACE))
    run = tmp_path / "run"
    code = main(["--trace", str(trace), "--engine", "toy", "--trials", "1", "--study", "s", "--run-dir", str(run),
                 "--slo", "ttft:p95<500ms", "--precision", "0.5", "--level-seconds", "1", "--level-lifetimes", "1",
                 "--level-requests", "20", "--probe-prompts", "2", "--probe-tokens", "32",
                 "--try", '{"slots": 32, "fast": true}'])
    said = capsys.readouterr()
    out = " ".join(said.out.split())
    assert code == 0, out[-3000:] + said.err
    assert "Toy engine's defaults" in out and "model" not in out.split("study s")[0]  # it loads no model
    url = f"sqlite:///{run / 'study.db'}"
    study = optuna.load_study(study_name="s", storage=url)
    (trial,) = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    assert trial.params == {"slots": 32, "fast": True}
    measured = dict(zip(["ttft_p99", "capacity", "quality_loss"], trial.values))
    assert measured["capacity"] > 0 and measured["quality_loss"] == pytest.approx(0.004)  # the server's fp8 loss
    view = load_study(url, "s")
    stored = {t.number: t.config for t in view.trials}
    assert stored[trial.number] == {"engine": "toy", "model": "toy", "slots": 32, "fast": True}
    assert view.engine == "toy" and view.kind.shown == "Toy engine"
    assert view.reference_run is not None and view.reference_run.config == {"engine": "toy", "model": "toy",
                                                                             "slots": 4, "fast": False}
    best = json.loads((run / "best.json").read_text())
    assert best["config"]["engine"] == "toy"
