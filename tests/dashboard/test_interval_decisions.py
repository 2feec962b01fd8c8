"""The decisions of issue 37 on the stored studies of tests/dashboard/interval_studies.py, as the
dashboard's data and `tune export` give them (the pages' words: test_e2e_intervals.py)."""

from __future__ import annotations

import pytest

from tests.conftest import run_tune
from tests.dashboard.interval_studies import make_interval_studies
from tracetune.dashboard import data
from tracetune.dashboard.metrics import quality_text


@pytest.fixture(scope="module")
def url(tmp_path_factory) -> str:
    return make_interval_studies(tmp_path_factory.mktemp("intervals") / "study.db")


def test_a_straddling_interval_is_undecided_never_within(url):
    study = data.load_study(url, "undecided")
    fp8 = study.trial(0)
    assert study.decision.best.label == 0 and fp8.on_front  # no gate set: the default gate only judges it
    assert fp8.gate_decision.word == "undecided" and fp8.outside_gate
    text = fp8.gate_decision.text(study.gate_words)
    assert text.startswith("undecided against the default quality gate ppl<=+1% (this study set none): its 95% "
                           "interval [-13.37%, +4.86%] reaches both sides of the limit; a probe of about ")
    assert "within" not in text


def test_tune_export_best_says_undecided(url):
    out = run_tune("export", "--storage", url, "--study", "undecided", "--best", "--format", "command", timeout=120)
    assert out.returncode == 0, out.stderr
    comments = [line for line in out.stdout.splitlines() if line.startswith("#")]
    assert any("UNDECIDED against the default gate (ppl<=+1%)" in line for line in comments), comments
    assert not any("within the default gate" in line for line in comments)


def test_an_nll_only_quality_reads_in_perplexity(url):
    study = data.load_study(url, "undecided")
    four_bit = study.trial(1)
    assert quality_text(four_bit.quality).startswith("perplexity +55.27% [+49.18%, +61.61%]")
    assert four_bit.gate_decision.word == "outside"
    out = run_tune("export", "--storage", url, "--study", "undecided", "--trial", "1", "--format", "command", timeout=120)
    assert "quality cost vs vLLM's defaults: +55.3% perplexity [+49.2%, +61.6%]" in out.stdout, out.stdout


def test_defaults_breaking_the_slo_are_no_candidate_and_their_export_says_so(url):
    study = data.load_study(url, "slo_broken")
    ref = study.reference_run
    assert study.decision.front == [] and study.decision.best is None and not study.decision.reference_is_best
    assert not ref.on_front and ref.category == "infeasible"
    assert ref.violations == ["breaks the SLO: TTFT p99 17.8 s against 2 s, every load failed"]
    assert "(vLLM's defaults break it: TTFT p99 17.8 s against 2 s, every load failed; 2 measured trial(s)" \
        in study.decision.verdict()
    out = run_tune("export", "--storage", url, "--study", "slo_broken", "--reference", "--format", "command", timeout=120)
    assert out.returncode == 0, out.stderr
    assert "# WARNING: vLLM's defaults break the study's SLO (TTFT p99 17.8 s against 2 s, every load failed)" \
        in out.stdout, out.stdout
    best = run_tune("export", "--storage", url, "--study", "slo_broken", "--best", "--format", "command", timeout=120)
    assert best.returncode != 0 and "vLLM's defaults are best" not in best.stderr


def test_random_weights_show_no_quality(url):
    study = data.load_study(url, "random")
    assert study.floor_text == "" and study.noise_floor == {}
    for t in study.candidates:
        assert t.quality is None and quality_text(t.quality) == "-" and not t.outside_gate


def test_chart_hovers_say_the_decision_too(url):
    from tracetune.dashboard.charts import pareto_figure

    def hovers(name: str) -> list[str]:
        study = data.load_study(url, name)
        figure = pareto_figure(study, *study.objectives[:2])
        return [text for trace in figure.data for text in (trace.hovertext or [])]

    random = hovers("random")
    assert random and all("quality: not measurable (random weights)" in h for h in random if "trial" in h), random
    broken = [h for h in hovers("slo_broken") if h.startswith("<b>reference</b>")]
    assert broken and "breaks the SLO</b>: TTFT p99 17.8 s against 2 s, every load failed" in broken[0], broken


def test_the_export_states_quality_loss_in_its_unit_and_never_on_random_weights(url):
    measured = run_tune("export", "--storage", url, "--study", "undecided", "--trial", "1", "--format", "command",
                        timeout=120).stdout
    line = next(x for x in measured.splitlines() if x.startswith("# measured: "))
    assert "quality_loss=" in line and line.rstrip().endswith("nats/token"), line
    from tracetune.dashboard.export.notes import measured_value

    random = data.load_study(url, "random")
    assert [measured_value("quality_loss", t) for t in random.candidates] == \
        ["not measurable (random weights)"] * len(random.candidates)
