"""A speculative trial's acceptance probe on the dashboard and in exports (`replay.acceptance`): the
verdict says its caveats when the best trial has some, Trial detail and the Trials table carry the
natural-stop acceptance beside the replay's forced one, and every export format carrying notes says
why a caveated trial's acceptance may not hold (tests/dashboard/synthetic.py's study, plus two
speculative trials: 7 caveated, 8 clean)."""

from __future__ import annotations

import json
import math
import shutil

import pytest

from tests.dashboard.synthetic import add_measured_trial, speculation_probe
from tests.dashboard.test_app import open_app
from tracetune.dashboard import data, records, tables
from tracetune.dashboard.export import FORMATS, export
from tracetune.dashboard.export.notes import choice_notes

NOTE = "SPECULATION: acceptance may not hold on your traffic: "
SYNTHESIZED = "measured on prompts synthesized to the trace's lengths (6 of 8)"
PAST_END = "70% of the accepted draft tokens came after the model's natural end"


def _study_with(tmp_path_factory, synthetic_url: str, caveated: bool) -> str:
    """The synthetic study plus trial 7 (the most throughput: best, its probe `caveated` or clean) and
    trial 8 (the fastest TTFT: on the front, clean); returns its URL."""
    db = tmp_path_factory.mktemp("speculation") / "study.db"
    shutil.copy(synthetic_url[len("sqlite:///"):], db)
    url = f"sqlite:///{db}"
    assert add_measured_trial(url, ttft=0.4, tps=80.0, loss=0.0, max_num_seqs=96,
                              acceptance=speculation_probe(caveated=caveated)) == 7
    assert add_measured_trial(url, ttft=0.2, tps=35.0, loss=0.0, max_num_seqs=12,
                              acceptance=speculation_probe(caveated=False)) == 8
    return url


@pytest.fixture(scope="module")
def spec_url(tmp_path_factory, synthetic_url) -> str:
    return _study_with(tmp_path_factory, synthetic_url, caveated=True)


@pytest.fixture(scope="module")
def spec(spec_url):
    return data.load_study(spec_url, "synth")


@pytest.fixture(scope="module")
def clean(tmp_path_factory, synthetic_url):
    return data.load_study(_study_with(tmp_path_factory, synthetic_url, caveated=False), "synth")


def header(text: str) -> str:
    return "\n".join(line for line in text.splitlines() if line.startswith("#"))


def test_the_verdict_says_the_best_trials_caveat(spec, clean):
    assert spec.decision.best.label == 7 and set(spec.decision.trials_on_front) >= {7, 8}
    verdict = spec.decision.verdict()
    assert "Caveat: its speed rests on speculative decoding whose acceptance may not hold on your traffic: " \
        in verdict
    assert PAST_END in verdict and SYNTHESIZED in verdict
    assert set(spec.decision.speculation_words) == {7}  # trial 8's acceptance holds
    assert clean.decision.best.label == 7 and "speculat" not in clean.decision.verdict()


def test_trial_detail_and_the_table_carry_the_natural_figure(spec):
    seven, eight = spec.trial(7), spec.trial(8)
    assert seven.metric("spec_natural_rate") == pytest.approx(0.5)
    assert seven.metric("spec_acceptance_rate") == pytest.approx(0.6)  # the replay's counters, forced
    figures = records.acceptance_figures(seven)
    assert figures is not None
    assert figures["natural_rate"] == pytest.approx(0.5) and figures["forced_rate"] == pytest.approx(100 / 120)
    assert figures["past_end_share"] == pytest.approx(0.7)
    assert (figures["prompts"], figures["recorded"], figures["synthesized"], figures["ended"]) == (8, 2, 6, 5)
    assert len(seven.speculation_caveats) == 2 and not eight.speculation_caveats
    assert records.acceptance_figures(spec.trial(0)) is None  # no speculation, no probe
    rows = {r["trial"]: r for r in tables.trial_table(spec)}
    assert rows[7]["spec_natural_rate"] == pytest.approx(0.5) and rows[8]["spec_natural_rate"] == pytest.approx(0.6)
    assert PAST_END in str(rows[7]["speculation caveat"]) and rows[8]["speculation caveat"] == "-"
    assert math.isnan(float(rows[0]["spec_natural_rate"])) and rows[0]["speculation caveat"] == "-"


def test_without_a_probe_the_table_has_no_probe_columns(synthetic_url):
    rows = tables.trial_table(data.load_study(synthetic_url, "synth"))
    assert not any("spec_natural_rate" in r or "speculation caveat" in r for r in rows)


@pytest.mark.parametrize("fmt", FORMATS)
def test_an_export_of_a_caveated_trial_carries_the_note(spec, fmt):
    caveated, clean = export(spec, spec.trial(7), fmt), export(spec, spec.trial(8), fmt)
    if fmt == "json":
        notes = json.loads(caveated)["notes"]
        assert [n for n in notes if n.startswith(NOTE)] == [NOTE + "; ".join(spec.trial(7).speculation_caveats)]
        assert not any("SPECULATION" in n for n in json.loads(clean)["notes"])
    else:
        assert header(caveated).count("# " + NOTE) == 1 and SYNTHESIZED in header(caveated)
        assert "SPECULATION" not in clean
    assert "SPECULATION" not in export(spec, spec.trial(1), fmt)  # no speculation, no note


def test_the_note_follows_the_quality_notes(spec):
    notes = choice_notes(spec, spec.trial(7))
    assert notes[0].startswith("quality cost vs vLLM's defaults") and notes[-1].startswith(NOTE)


def test_the_pages_say_the_caveats(monkeypatch, spec_url):
    at = open_app(monkeypatch, spec_url, "synth", "Pareto")
    assert any(w.value.startswith("Verdict: trial 7 is best") and "Caveat: its speed rests" in w.value
               for w in at.warning)
    at.sidebar.radio(key="page").set_value("Trial detail").run()
    at.selectbox(key="detail_trial").set_value(7).run()
    assert not at.exception and not at.error
    labels = {m.label: m.value for m in at.metric}
    assert labels["acceptance, natural stops"] == "50.0%" and labels["acceptance, forced lengths"] == "83.3%"
    assert labels["accepted past the natural end"] == "70.0%" and labels["probe prompts recorded"] == "2 of 8"
    warnings = [w.value for w in at.warning if w.value.startswith("Speculation: acceptance may not hold")]
    assert len(warnings) == 2 and PAST_END in warnings[0] and SYNTHESIZED in warnings[1]
    at.selectbox(key="detail_trial").set_value(8).run()
    assert "acceptance, natural stops" in {m.label for m in at.metric}
    assert not any(w.value.startswith("Speculation:") for w in at.warning)
    at.sidebar.radio(key="page").set_value("Export").run()
    assert at.selectbox(key="export_trial").value == 7  # the best trial
    assert sum(w.value.startswith("Speculation: acceptance may not hold") for w in at.warning) == 2
    assert "# " + NOTE in at.code[0].value
