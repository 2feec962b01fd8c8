"""Where a choice is made: the quality gate (or its absence), ties inside the intervals, why a trial is
off the front, stale and queued trials (tests/dashboard/synthetic.py's decision studies, known values)."""

from __future__ import annotations

import math

import pytest

from tests.dashboard.synthetic import make_decision_studies, quality
from tracetune.dashboard import charts, data, metrics, tables


@pytest.fixture(scope="module")
def decision_url(tmp_path_factory) -> str:
    return make_decision_studies(tmp_path_factory.mktemp("decisions") / "study.db")


@pytest.fixture(scope="module")
def nogate(decision_url):
    return data.load_study(decision_url, "nogate")


@pytest.fixture(scope="module")
def gated(decision_url):
    return data.load_study(decision_url, "gated")


def test_one_quality_vocabulary_with_intervals():
    text = metrics.quality_text(quality(math.log1p(0.134)))
    assert text.startswith("perplexity +13.40% [+13.29%, +13.51%] · KLD 0.0629 [0.0566, 0.0692] · top-1 0.900 [")
    assert metrics.quality_text(None) == "-"
    assert metrics.display_value("ppl_change", 0.0267) == "+2.67%"
    assert metrics.display_interval("ppl_change", (0.0245, 0.0288)) == "[+2.45%, +2.88%]"


def test_without_a_gate_front_points_beyond_the_default_gate_are_marked(nogate):
    assert nogate.gate_off and str(nogate.shown_gate) == "ppl<=+1%"
    one = nogate.trial(1)
    assert one.category == "pareto" and one.outside_gate and not one.only_the_gate
    assert not nogate.trial(0).outside_gate
    fig = charts.pareto_figure(nogate, "ttft_p99", "output_tps")
    marked = [t for t in fig.data if t.name.startswith("on the front, outside the default gate ppl<=+1%")]
    assert len(marked) == 1 and list(marked[0].customdata) == [1] and marked[0].marker.symbol == "diamond-x"
    assert "Pareto front (1)" in {t.name for t in fig.data}  # trial 0 alone keeps the plain front marker
    rows = {r["trial"]: r for r in tables.front_table(nogate)}
    assert rows["1"]["standing"] == "on the front, outside the default quality gate ppl<=+1% (this study set none)"
    assert rows["1"]["quality vs defaults"].startswith("perplexity +13.40%")


def test_with_a_gate_what_only_the_gate_kept_off_is_named_with_its_cost(gated):
    one = gated.trial(1)
    assert one.category == "infeasible" and one.only_the_gate and one.outside_gate
    assert one.violations == [f"outside the quality gate ppl<=+1%: {metrics.quality_text(one.quality)}"]
    assert gated.decision.beyond_gate.candidate.label == 1
    assert "trial 1 reaches 4.50x vLLM's defaults' output_tps at +13.4% perplexity" in gated.decision.verdict()
    names = [t.name for t in charts.pareto_figure(gated, "ttft_p99", "output_tps").data]
    assert "outside the quality gate ppl<=+1% only (SLOs kept) (1)" in names
    assert not any(n.startswith("violates SLO") for n in names)  # trial 3 has no ttft_p99 to draw
    rows = {r["trial"]: r["standing"] for r in tables.front_table(gated)}
    assert rows == {"0": "on the front", "2": "tie: dominated by 0 only inside the 95% intervals",
                    "1": "off the front: outside the quality gate ppl<=+1% alone"}


def test_an_infeasible_trial_names_what_it_lacks_or_breaks(gated):
    assert gated.trial(3).violations == ["summary lacks ttft_p99 that the SLO ttft:p99<800ms names (measured "
                                         "before the SLO was set, or by an older tracetune)"]
    assert math.isnan(gated.trial(3).metric("ttft_p99"))  # Optuna's inf is no value to plot
    from tests.dashboard.synthetic import summary
    from tracetune.replay.metrics import Summary, parse_slos

    slos = parse_slos("ttft:p99<800ms", flag="--slo")
    broken = Summary.from_dict({**summary(0.9, 10.0), "error_rate": 0.1, "errors": 2, "requests": 20})
    assert metrics.violations(broken, None, slos, None, [0.1]) == [
        "2 of 20 requests failed (10.0%): a measurement of the survivors only",
        "breaks the SLO ttft:p99<800ms: ttft p99 900 ms"]
    kept = Summary.from_dict(summary(0.5, 10.0))
    assert metrics.violations(kept, None, slos, None, [0.3]) == ["constraint 1 = 0.3 (> 0 breaks it)"]


def test_zero_width_intervals_a_hair_apart_are_a_tie(nogate):
    """16.06 vs 16.07 tokens/s, every other objective equal, intervals of zero width: not dominated."""
    zero, two = nogate.trial(0), nogate.trial(2)
    assert zero.interval("output_tps") == (16.07, 16.07) and two.interval("output_tps") == (16.06, 16.06)
    assert data.dominates([zero.metric(o) for o in nogate.objectives], [two.metric(o) for o in nogate.objectives],
                          nogate.directions)
    assert two.category == "tie" and not data.clearly_dominates(zero, two, nogate.objectives, nogate.directions)
    assert data.interval_of(two, "output_tps") == pytest.approx((16.06 * 0.99, 16.06 * 1.01))
    assert not data.apart(zero, two, "output_tps") and data.apart(zero, nogate.trial(1), "output_tps")
    rows = {r["trial"]: r["statistically"] for r in tables.front_table(nogate)}
    assert rows == {"0": "apart from 1; inside the intervals of 2", "1": "apart from every other row",
                    "2": "apart from 1; inside the intervals of 0"}


def test_stale_running_is_interrupted_and_waiting_is_queued(nogate):
    stale, queued = nogate.trial(4), nogate.trial(5)
    assert stale.status == "interrupted" and "stopped sending heartbeats 3.0 days ago" in stale.failure_reason
    assert queued.status == "queued" and queued.category == "queued"
    assert not nogate.running  # so live refresh starts off


def test_speculation_from_engine_counters():
    from tracetune.engine_adapter.metrics import EngineMetrics

    def speculation(stored):
        return metrics.speculation(EngineMetrics.from_dict(stored))

    assert speculation({"spec_decode_draft_tokens": 10.0, "spec_decode_accepted_tokens": 6.0,
                        "spec_decode_drafts": 4.0}) == (pytest.approx(0.6), pytest.approx(2.5))
    assert speculation({"spec_decode_draft_tokens": 0.0, "spec_decode_accepted_tokens": 0.0}) == (None, None)
    assert speculation({"spec_decode_draft_tokens": 10.0, "spec_decode_accepted_tokens": 6.0}) == (
        pytest.approx(0.6), None)  # a run stored before the drafts counter


# -- the pages (Streamlit's AppTest) -------------------------------------------------------------
def test_pages_say_no_gate_show_the_front_table_and_explain_status(monkeypatch, decision_url):
    from tests.dashboard.test_app import open_app

    at = open_app(monkeypatch, decision_url, "nogate", "Pareto")
    assert at.sidebar.toggle(key="live").value is False  # the stale trial is no reason to refresh
    assert any(w.value.startswith("No quality gate") for w in at.sidebar.warning)
    banner = next(w.value for w in at.warning if w.value.startswith("No quality gate: this study was run with"))
    assert "front trial(s) 1 are outside it" in banner
    front = at.dataframe[0].value
    assert list(front["trial"]) == ["0", "1", "2"] and "quality vs defaults" in front.columns
    at.sidebar.radio(key="page").set_value("Trial detail").run()
    at.selectbox(key="detail_trial").set_value(4).run()
    assert any("stopped sending heartbeats 3.0 days ago" in w.value for w in at.warning)
    at.selectbox(key="detail_trial").set_value(1).run()
    assert any(w.value.startswith("Outside the default quality gate ppl<=+1%") for w in at.warning)
    at.selectbox(key="detail_trial").set_value(3).run()
    assert any("summary lacks ttft_p99" in w.value for w in at.warning)


def test_gated_verdict_names_the_trade_the_gate_turned_down(monkeypatch, decision_url):
    from tests.dashboard.test_app import open_app

    at = open_app(monkeypatch, decision_url, "gated", "Pareto")
    assert not any(w.value.startswith("No quality gate") for w in at.sidebar.warning)
    assert any("Outside the quality gate (ppl<=+1%): trial 1 reaches" in w.value for w in at.warning)


def test_export_names_a_trial_outside_the_gate_before_its_export(monkeypatch, decision_url):
    from tests.dashboard.test_app import open_app

    at = open_app(monkeypatch, decision_url, "nogate", "Export")
    at.selectbox(key="export_trial").set_value(1).run()
    assert any(w.value.startswith("Trial 1 is outside the default quality gate ppl<=+1% (this study set none): "
                                  "perplexity +13.40%") for w in at.warning)
    at.selectbox(key="export_trial").set_value(0).run()
    assert not any("is outside" in w.value for w in at.warning)


@pytest.mark.parametrize("name", ["nogate", "gated"])
def test_every_page_renders_for_the_decision_studies(monkeypatch, decision_url, name):
    from tests.dashboard.test_app import open_app
    from tracetune.dashboard.views import PAGES

    at = open_app(monkeypatch, decision_url, name)
    for page in PAGES:
        at.sidebar.radio(key="page").set_value(page).run()
        assert not at.exception, (page, [e.value for e in at.exception])
        assert not at.error, (page, [e.value for e in at.error])
    at.sidebar.radio(key="page").set_value("Trials").run()
    table = at.dataframe[0].value
    assert table.loc[table["trial"] == "5", "category"].item() == "queued"
    assert table.loc[table["trial"] == "4", "why"].item().startswith("interrupted: its worker stopped sending")
