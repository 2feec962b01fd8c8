"""A study choosing between engines (`engine: [vllm, b]`): vLLM's defaults stay the reference, and the
other engine's own defaults are measured first as an ordinary trial marked with its engine (the row the
dashboard and the results label "b defaults"). The runner is scripted; the study, sampler and database
are real."""

from __future__ import annotations

import pytest

from tests.engine_adapter.test_choice import BConfig, _kind
from tests.reliability.scripted import TRACE, Events, ScriptedRunner, crash
from tracetune.engine_adapter.choice import choice_of
from tracetune.engine_adapter.kind import Knob
from tracetune.engine_adapter.platform import Platform
from tracetune.engine_adapter.registry import engine_kind
from tracetune.replay.trace import load_trace
from tracetune.replay.types import ReplayOptions
from tracetune.search_spaces.space import load_space
from tracetune.tuner.study import StudySettings, Tuner
from tracetune.tuner.trial_record import TrialRecord

SPACE = """\
name: both
fixed: {enforce_eager: true, threads: 2}
parameters:
  engine: {choices: [vllm, b]}
  max_num_seqs: {choices: [4, 8], when: {engine: [vllm]}}
  speculative: {choices: [none, ngram], when: {engine: [b]}}
"""


def _b():
    """The other engine, `b` (scripted: it is never started)."""
    return _kind("b", BConfig, {"threads": Knob("threads"), "speculative": Knob("spec")}, [])


def _tuner(tmp_path, trials: int, configs: list, b_crashes: bool = False) -> Tuner:
    choice = choice_of([engine_kind("vllm"), _b()])
    (tmp_path / "trace.jsonl").write_text(TRACE)
    (tmp_path / "space.yaml").write_text(SPACE)
    settings = StudySettings(study_name="s", storage_url=f"sqlite:///{tmp_path / 'study.db'}", trials=trials,
                             objectives=["ttft_p99", "output_tps", "quality_loss"], slos=[], max_quality_loss=None,
                             sampler="random", seed=0, replay=ReplayOptions(), heartbeat_s=2)

    def script(config):
        configs.append(config)
        if b_crashes and isinstance(config, BConfig):
            crash()
        return (0.3, 80.0, 0.01) if isinstance(config, BConfig) else (0.4, 60.0, 0.0)

    return Tuner(settings, trace=load_trace(tmp_path / "trace.jsonl"), space=load_space(tmp_path / "space.yaml",
                                                                                        choice),
                 model_dir=tmp_path / "model", platform=Platform.CPU, runner=ScriptedRunner(script, calls=[]),
                 report=Events(), engine=choice, base={"served_model_name": "m"})


def test_the_other_engines_defaults_are_the_first_trial_and_vllms_the_reference(tmp_path):
    configs: list = []
    tuner = _tuner(tmp_path, 3, configs)
    study = tuner.run()
    ref = tuner.store.reference("s")
    assert "threads" not in ref["config"] and ref["config"]["enforce_eager"] is True  # vLLM's defaults
    first = study.trials[0]
    record = TrialRecord.of(first)
    assert record.defaults_of == "b" and record.values == {"engine": "b"} and first.params == {"engine": "b"}
    # b's own defaults: its fixed settings and the command line's, nothing sampled
    assert configs[0] == BConfig(model=tmp_path / "model", threads=2)
    assert record.config["engine"] == "b" and record.config["speculative"] == "none"
    assert all(TrialRecord.of(t).defaults_of is None for t in study.trials[1:])
    assert tuner.engine.config_diff(record.config, ref["config"]) == {"engine": "b", "threads": 2}


def test_a_resumed_study_does_not_queue_the_defaults_again(tmp_path):
    configs: list = []
    _tuner(tmp_path, 2, configs).run()
    study = _tuner(tmp_path, 4, configs).run()
    assert [TrialRecord.of(t).defaults_of for t in study.trials].count("b") == 1


@pytest.mark.parametrize("b_crashes", [False, True])
def test_the_results_label_the_other_engines_defaults(tmp_path, b_crashes, monkeypatch):
    import io

    from rich.console import Console

    from tracetune.cli.results import report_results
    from tracetune.engine_adapter.registry import ENGINES

    monkeypatch.setitem(ENGINES, "b", _b)  # the results read the study as the dashboard does: by its engine's name
    tuner = _tuner(tmp_path, 3, [], b_crashes)
    tuner.run()
    out = io.StringIO()
    report_results(tuner, Console(file=out, width=120), tmp_path)
    text = out.getvalue()
    if b_crashes:  # no penalty values shown as if measured
        assert "B defaults (trial 0): not on the front (engine_failed: see below)" in text
        assert "cross-engine floor" not in text
    else:  # faster than vLLM's defaults and every vLLM trial (scripted), at a quality cost: on the front
        assert "0 (B defaults)" in text and "  0 (B defaults): engine=b, threads=2" in text
        # its quality against vLLM's defaults is the floor a comparison of the two engines rests on
        assert "cross-engine floor: B defaults (trial 0) against vLLM's defaults, same probe:" in text


def test_a_llamacpp_studys_results_name_llamacpps_defaults_as_the_reference(tmp_path):
    """`tune --engine llamacpp`: the reference is llama.cpp's defaults, and the results say so wherever they
    name it (table title, configurations, verdict, the trials it beats, the best): never vLLM's. Scripted:
    the reference is faster than both trials, so every line that names it is printed."""
    import io

    from rich.console import Console

    from tracetune.cli.results import report_results

    kind = engine_kind("llamacpp")
    (tmp_path / "trace.jsonl").write_text(TRACE)
    (tmp_path / "space.yaml").write_text("name: slots\nfixed: {threads: 2}\nparameters:\n"
                                         "  parallel_slots: {choices: [1, 2]}\n")
    settings = StudySettings(study_name="s", storage_url=f"sqlite:///{tmp_path / 'study.db'}", trials=2,
                             objectives=["ttft_p99", "output_tps", "quality_loss"], slos=[], max_quality_loss=None,
                             sampler="random", seed=0, replay=ReplayOptions(), heartbeat_s=2)
    tuner = Tuner(settings, trace=load_trace(tmp_path / "trace.jsonl"),
                  space=load_space(tmp_path / "space.yaml", kind), model_dir=tmp_path / "model",
                  platform=Platform.CPU, runner=ScriptedRunner(lambda config: (0.6, 40.0, 0.0), calls=[]),
                  report=Events(), engine=kind)
    tuner.run()
    out = io.StringIO()
    report_results(tuner, Console(file=out, width=200), tmp_path)
    text = out.getvalue()
    assert "Pareto front of study s (0 of 2 trials + llama.cpp's defaults)" in text
    assert "configurations (what differs from llama.cpp's defaults):" in text
    assert "  ref: llama.cpp's defaults" in text
    assert "verdict: no configuration beats llama.cpp's defaults: every measured trial is worse" in text
    assert "  llama.cpp's defaults beat trials 0, 1 on every objective" in text
    assert "best by output_tps on the front: llama.cpp's defaults (the reference)" in text
    assert "vLLM" not in text
