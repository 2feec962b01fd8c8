"""The dashboard's pages on studies with capacity objectives (Streamlit's AppTest): capacity as a
column and an axis, the attainment-versus-load charts, and vLLM's defaults competing on the front."""

from __future__ import annotations

from tests.dashboard.test_app import figure, open_app, trace_names

VERDICT = "No configuration beats vLLM's defaults"


def chart_titles(at) -> list[str]:
    return [figure(at, i)["layout"]["title"]["text"] for i in range(len(at.get("plotly_chart")))]


def test_capacity_is_an_axis_and_a_column(monkeypatch, capacity_url):
    at = open_app(monkeypatch, capacity_url, "cap", "Pareto")
    assert at.selectbox(key="pareto_y").value == "capacity"  # the study's second objective
    fig = figure(at)
    assert fig["layout"]["yaxis"]["title"]["text"] == "capacity (req/s per GPU at the SLO)"
    assert {"Pareto front (4)", "dominated (1)"} <= set(trace_names(fig))
    at.selectbox(key="pareto_x").set_value("capacity_scale").run()
    assert figure(at)["layout"]["xaxis"]["title"]["text"].startswith("capacity_scale")
    at.sidebar.radio(key="page").set_value("Trials").run()
    assert "capacity bracket" not in at.dataframe[0].value.columns  # compact by default: decision columns
    at.multiselect(key="trials_more").set_value(["capacity bracket", "capacity notes"]).run()
    table = at.dataframe[0].value
    assert {"capacity", "capacity bracket", "capacity notes", "why"} <= set(table.columns)
    row = table[table["trial"] == "3"].iloc[0]
    assert row["capacity"] == 2.5 and row["capacity bracket"].startswith("[2.5, 2.97] req/s per GPU")
    assert row["capacity notes"].startswith("unstable")
    assert table[table["trial"] == "4"].iloc[0]["capacity notes"] == "client-limited (a lower bound)"
    assert table[table["trial"] == "ref"].iloc[0]["capacity"] == 4.0  # vLLM's defaults, a row like any trial
    at.text_input(key="trials_filter").set_value("capacity>=5").run()
    assert sorted(at.dataframe[0].value["trial"]) == ["0", "4"]


def test_pareto_page_says_which_trials_the_defaults_beat(monkeypatch, capacity_url):
    at = open_app(monkeypatch, capacity_url, "cap", "Pareto")
    assert not at.warning
    assert "vLLM's defaults beat trial(s) 2 on every objective" in at.info[0].value


def test_banner_when_the_defaults_beat_every_trial(monkeypatch, capacity_url):
    at = open_app(monkeypatch, capacity_url, "cap_defaults", "Pareto")
    assert VERDICT in at.warning[0].value and "Keep the defaults" in at.warning[0].value
    assert {"dominated (2)", "reference (unquantized)"} <= set(trace_names(figure(at)))
    assert not any(name.startswith("Pareto front") for name in trace_names(figure(at)))


def test_no_banner_without_a_winner(monkeypatch, synthetic_url):
    at = open_app(monkeypatch, synthetic_url, "synth", "Pareto")
    assert not at.warning and not at.info


def test_detail_shows_attainment_versus_load(monkeypatch, capacity_url):
    at = open_app(monkeypatch, capacity_url, "cap", "Trial detail")
    at.selectbox(key="detail_trial").set_value(3).run()
    titles = chart_titles(at)
    assert titles[:4] == ["TTFT CDF", "ITL CDF", "E2E CDF", "request timeline"]
    assert titles[4] == "attainment versus load: trial 3 vs reference (vLLM's defaults)"
    names = trace_names(figure(at, 4))
    assert {"trial 3: passed (3)", "trial 3: abandoned (2)", "trial 3: repeat (1)", "trial 3: capacity 5 req/s",
            "reference (vLLM's defaults)"} <= set(names)
    assert any("unstable" in c.value and "[5, 5.95] req/s" in c.value for c in at.caption)
    at.selectbox(key="detail_trial").set_value(5).run()  # the engine failed: no capacity, no chart
    assert len(at.get("plotly_chart")) == 0 and at.error


def test_compare_overlays_both_curves(monkeypatch, capacity_url):
    at = open_app(monkeypatch, capacity_url, "cap", "Compare")
    at.selectbox(key="compare_a").set_value(0).run()
    at.selectbox(key="compare_b").set_value(3).run()
    titles = chart_titles(at)
    assert titles[-1] == "attainment versus load: trial 0 vs trial 3 vs reference (vLLM's defaults)"
    names = trace_names(figure(at, len(titles) - 1))
    assert {"trial 0", "trial 3", "reference (vLLM's defaults)"} <= set(names)
    rows = at.dataframe[0].value
    assert rows[rows["field"] == "capacity bracket"].iloc[0]["trial 3"] == "[5, 5.95] req/s"


def test_export_refuses_the_best_pick_when_the_defaults_win(monkeypatch, capacity_url):
    at = open_app(monkeypatch, capacity_url, "cap_defaults", "Export")
    assert VERDICT in at.warning[0].value
    at.radio(key="export_how").set_value("by rule (--pick)").run()
    assert at.text_input(key="export_rule").value == "max:capacity"
    assert not at.success and not at.code and not at.get("download_button")
    assert any("vLLM's defaults are best" in w.value for w in at.warning)


def test_export_picks_and_annotates_the_best_trial(monkeypatch, capacity_url):
    at = open_app(monkeypatch, capacity_url, "cap", "Export")
    assert at.selectbox(key="export_trial").value == 0 and not at.warning
    assert "# capacity at the SLO: 6 req/s on 1 GPU(s)" in at.code[0].value
    at.selectbox(key="export_trial").set_value(2).run()
    assert "vLLM's defaults beat trial 2 on every objective" in at.warning[0].value
    at.radio(key="export_how").set_value("by rule (--pick)").run()
    assert "rule picks trial 0" in at.success[0].value
