"""Capacity at the SLO in the dashboard and exports, and vLLM's defaults competing on the front:
the synthetic capacity studies (known numbers) through the data functions, chart builders, exporters
and `tune export --best`."""

from __future__ import annotations

import json
import math

import pytest

from tests.cli.test_dashboard import tune
from tests.dashboard.synthetic import CAPACITY_SLO, CAPACITY_STUDIES, REFERENCE_CAPACITY
from tracetune.capacity.step import CapacityResult
from tracetune.dashboard import capacity, charts, data, metrics, tables
from tracetune.dashboard.export import export
from tracetune.dashboard.export.pick import ReferenceIsBest, best_rule, best_trial, parse_pick, pick_for, select_trial
from tracetune.errors import InputError
from tracetune.replay.metrics import Estimate, Summary


@pytest.fixture(scope="module")
def cap_study(capacity_url):
    return data.load_study(capacity_url, "cap")


@pytest.fixture(scope="module")
def defaults_study(capacity_url):
    return data.load_study(capacity_url, "cap_defaults")


# -- metrics -------------------------------------------------------------------------------------
def test_capacity_is_a_metric_to_maximize(cap_study):
    assert metrics.METRICS["capacity"] == "maximize" and metrics.METRICS["capacity_scale"] == "maximize"
    assert metrics.metric_label("capacity") == ("capacity (req/s per GPU at the SLO)", 1.0)
    assert cap_study.objectives == ["ttft_p99", "capacity", "quality_loss"]
    assert cap_study.trial(0).metric("capacity") == pytest.approx(6.0)
    assert cap_study.trial(3).metric("capacity") == pytest.approx(2.5)      # 5 req/s on 2 GPUs
    assert cap_study.trial(3).metric("capacity_scale") == pytest.approx(2.0)
    assert cap_study.reference_metric("capacity") == pytest.approx(4.0)
    without = metrics.run_of(Summary.from_dict({"latency_s": {}}))  # a run without capacity
    assert math.isnan(metrics.metric_value("capacity", without))
    assert [c.metric for c in tables.parse_conditions("capacity>=3 and capacity_scale>1")] == ["capacity", "capacity_scale"]


def test_a_difference_inside_the_intervals_is_a_tie_not_dominated(cap_study):
    """Trial 2 is dominated by the reference on every objective, its TTFT clearly (1.0 s [0.9, 1.1] vs
    0.8 s [0.72, 0.88]). At 0.85 s [0.77, 0.94], inside the reference's interval, and with its capacity
    bracket [3.9, 5.0] overlapping the reference's [4.0, 4.2], the same point values are a tie."""
    import copy

    assert cap_study.trial(2).category == "dominated" and not cap_study.trial(2).tied
    assert data.clearly_dominates(cap_study.reference_run, cap_study.trial(2), cap_study.objectives,
                                  cap_study.directions)
    study = copy.deepcopy(cap_study)
    t = study.trial(2)
    t.objective_values["ttft_p99"] = 0.85
    t.summary.latency["ttft"]["p99"] = Estimate(0.85, 0.765, 0.935)
    data.mark_front(study)
    assert study.decision.dominated_by_reference == [2] and t.category == "tie" and t.beaten_by_reference
    assert metrics.metric_interval("capacity", t.run) == pytest.approx((3.9, 5.0))
    fig = charts.pareto_figure(study, "ttft_p99", "capacity")
    assert any(trace.name == "tied with the front, inside the intervals (1)" for trace in fig.data)


def test_studies_without_capacity_keep_their_table(synthetic_url):
    study = data.load_study(synthetic_url, "synth")
    assert not data.has_capacity(study)
    row = tables.trial_table(study)[0]
    assert not {"capacity", "capacity bracket", "capacity notes"} & set(row)


# -- the reference as a competitor ---------------------------------------------------------------
def test_the_reference_dominates_trial_2_so_it_is_not_on_the_front(cap_study):
    cats = {t.number: t.category for t in cap_study.trials}
    assert cats == {0: "pareto", 1: "pareto", 2: "dominated", 3: "pareto", 4: "pareto", 5: "failed"}
    assert cap_study.trial(2).beaten_by_reference and not cap_study.trial(0).beaten_by_reference
    # without the reference, nothing among the trials dominates trial 2
    trials = [t for t in cap_study.trials if t.measured]
    points = [[t.metric(o) for o in cap_study.objectives] for t in trials]
    assert dict(zip([t.number for t in trials], data.pareto_mask(points, cap_study.directions)))[2]
    assert cap_study.decision.dominated_by_reference == [2]
    assert cap_study.decision.best.label == 0 and not cap_study.decision.reference_is_best


def test_categories_agree_with_tuner_front(cap_study, defaults_study):
    from tracetune.tuner.front import REFERENCE, Candidate, front

    for study in (cap_study, defaults_study):
        ref = Candidate(REFERENCE, data.reference_values(study))
        trials = [Candidate(t.number, tuple(t.objective_values[o] for o in study.objectives))
                  for t in study.trials if t.measured and t.feasible]
        labels = {c.label for c in front([ref, *trials], study.directions)}
        assert {t.number for t in study.front} == labels - {REFERENCE}


def test_when_the_defaults_beat_every_trial(defaults_study):
    assert {t.number: t.category for t in defaults_study.trials} == {0: "dominated", 1: "dominated", 2: "failed"}
    assert defaults_study.front == []
    assert defaults_study.decision.reference_is_best
    assert "no configuration beats vLLM's defaults" in defaults_study.decision.verdict()
    rows = {r["trial"]: r for r in tables.trial_table(defaults_study)}
    assert rows[0]["why"] == "vLLM's defaults beat it on every objective"
    assert rows[2]["why"] == "engine exited at start: no memory for the KV cache"


# -- capacity shaping ----------------------------------------------------------------------------
def test_bracket_and_flags():
    cap = CapacityResult.from_dict(CAPACITY_STUDIES["cap"][3][1])  # unstable, 2 GPUs, bracket [5, 5.95] req/s
    assert cap.bracket_rps() == (pytest.approx(5.0), pytest.approx(5.95))
    assert capacity.bracket_text(cap) == "[5, 5.95] req/s"
    assert capacity.bracket_text(cap, per_gpu=True) == "[2.5, 2.97] req/s per GPU"
    assert capacity.flags(cap) == ["unstable (a repeated level disagreed with its first measurement)"]
    client = CapacityResult.from_dict(CAPACITY_STUDIES["cap"][4][1])
    assert capacity.bracket_text(client) == "[5, -) req/s"
    assert capacity.flags(client) == ["client-limited (a lower bound)"]
    assert capacity.capacity_of(Summary.from_dict({"latency_s": {}})) is None and capacity.table_columns(None) == {
        "capacity bracket": "", "capacity notes": ""}


def test_trial_table_has_capacity_columns(cap_study):
    rows = {r["trial"]: r for r in tables.trial_table(cap_study)}
    assert rows[0]["capacity"] == pytest.approx(6.0)
    assert rows[0]["capacity bracket"] == "[6, 7.14] req/s per GPU"
    assert rows[3]["capacity bracket"] == "[2.5, 2.97] req/s per GPU ([5, 5.95] req/s on 2 GPUs)"
    assert rows[3]["capacity notes"].startswith("unstable")
    assert rows[4]["capacity notes"] == "client-limited (a lower bound)"
    assert rows[2]["why"] == "vLLM's defaults beat it on every objective"
    assert rows[5]["capacity bracket"] == "" and math.isnan(rows[5]["capacity"])


def test_steps_kinds_and_capacity_point():
    import dataclasses

    cap = CapacityResult.from_dict(CAPACITY_STUDIES["cap"][3][1])
    got = [(s.scale, s.kind, s.repeat) for s in capacity.steps(cap)]
    assert got == [(1.0, "passed", False), (2.0, "passed", False), (4.0, "abandoned", False),
                   (2.83, "abandoned", False), (2.38, "passed", False), (2.38, "failed", True)]
    assert "attainment <= 30% (abandoned after 30 of 50 sent" in capacity.steps(cap)[2].hover
    assert capacity.capacity_point(cap) == (pytest.approx(5.0), pytest.approx(0.96))
    client = CapacityResult.from_dict(CAPACITY_STUDIES["cap"][4][1])
    assert capacity.steps(client)[-1].kind == "client-limited"
    assert capacity.capacity_point(dataclasses.replace(cap, capacity_scale=None)) is None


def test_compare_rows_include_capacity(cap_study):
    rows = {r["field"]: r for r in tables.compare(cap_study, cap_study.trial(0), cap_study.trial(3))}
    # per GPU, with the bracket as its interval (trial 3 runs on 2 GPUs)
    assert rows["capacity"]["a"] == "6 [6, 7.14]" and rows["capacity"]["b"] == "2.5 [2.5, 2.975]"
    assert rows["capacity bracket"] == {"field": "capacity bracket", "a": "[6, 7.14] req/s", "b": "[5, 5.95] req/s",
                                        "differs": True}


# -- charts --------------------------------------------------------------------------------------
def test_attainment_figure_of_one_trial(cap_study):
    curves = charts.capacity_curves(cap_study, [cap_study.trial(3)])
    assert [label for label, _ in curves] == ["trial 3", "reference (vLLM's defaults)"]
    fig = charts.attainment_figure(curves[:1])
    counts = charts.figure_summary(fig)
    assert counts == {"trial 3": 5, "trial 3: passed (3)": 3, "trial 3: failed (1)": 1, "trial 3: abandoned (2)": 2,
                      "trial 3: repeat (1)": 1, "trial 3: capacity 5 req/s": 1}
    markers = {t.name: t.marker.symbol for t in fig.data if t.mode == "markers"}
    assert markers["trial 3: passed (3)"] != markers["trial 3: failed (1)"] != markers["trial 3: abandoned (2)"]
    star = next(t for t in fig.data if t.name.startswith("trial 3: capacity"))
    assert (star.x[0], star.y[0], star.marker.symbol) == (pytest.approx(5.0), pytest.approx(0.96), "star")
    line = next(t for t in fig.data if t.name == "trial 3")
    assert list(line.x) == sorted(line.x) and len(line.x) == 5  # through the levels by load, repeat left out
    target = [s for s in fig.layout.shapes if s.type == "line" and s.y0 == s.y1]
    assert target and target[0].y0 == pytest.approx(0.95)
    bracket = [s for s in fig.layout.shapes if s.type == "rect"]
    assert (bracket[0].x0, bracket[0].x1) == (pytest.approx(5.0), pytest.approx(5.95))
    assert CAPACITY_SLO in fig.layout.annotations[0].text
    assert fig.layout.yaxis.tickformat == ".0%" and fig.layout.xaxis.type == "linear"


def test_attainment_figure_overlays_trials_and_the_reference(cap_study):
    fig = charts.attainment_figure(charts.capacity_curves(cap_study, [cap_study.trial(0), cap_study.trial(4)]))
    names = charts.figure_summary(fig)
    assert {"trial 0", "trial 4", "reference (vLLM's defaults)", "trial 4: client-limited (1)",
            "reference (vLLM's defaults): capacity 4 req/s"} <= set(names)
    ref_line = next(t for t in fig.data if t.name == "reference (vLLM's defaults)")
    assert ref_line.line.dash == "dash"
    assert not [s for s in fig.layout.shapes if s.type == "rect"]  # brackets are shaded for one run only
    assert fig.layout.xaxis.type == "log"  # the loads span 2.5 to 12 req/s


def test_pareto_figure_can_plot_capacity(cap_study):
    fig = charts.pareto_figure(cap_study, "ttft_p99", "capacity")
    counts = charts.figure_summary(fig)
    assert counts["Pareto front (4)"] == 4 and counts["dominated (1)"] == 1
    dominated = next(t for t in fig.data if t.name.startswith("dominated"))
    assert "defaults beat it on every objective" in dominated.hovertext[0]
    assert fig.layout.yaxis.title.text == "capacity (req/s per GPU at the SLO)"


# -- export --------------------------------------------------------------------------------------
def test_export_header_carries_the_capacity(cap_study):
    text = export(cap_study, cap_study.trial(3), "k8s")
    assert f"# SLO: {CAPACITY_SLO}; attainment target 95% of requests" in text
    assert ("# capacity at the SLO: 5 req/s on 2 GPU(s) = 2.5 req/s per GPU (2x the trace's rate); "
            "bracket [5, 5.95] req/s = [2.5, 2.97] req/s per GPU") in text
    assert "# capacity caveats: unstable" in text
    assert json.loads(export(cap_study, cap_study.trial(0), "json"))["capacity"]["capacity_rps"] == pytest.approx(6.0)
    assert "vLLM's defaults (the reference) are at least as good" in export(cap_study, cap_study.trial(2), "command")


def test_best_is_the_tuners_best(cap_study):
    assert str(best_rule(cap_study)) == "max:capacity"
    assert best_trial(cap_study).number == 0 == select_trial(cap_study, best=True).number
    # a rule can never pick a trial the defaults dominate: trial 2 (the only one above 800 ms) is off the front
    with pytest.raises(InputError, match="no trial on the front meets it"):
        pick_for(cap_study, parse_pick("max:capacity where ttft_p99>0.8"))


def test_best_refuses_when_the_defaults_win(defaults_study):
    with pytest.raises(ReferenceIsBest, match="vLLM's defaults are best.*no configuration beats vLLM's defaults"):
        select_trial(defaults_study, best=True)
    with pytest.raises(ReferenceIsBest):
        pick_for(defaults_study, parse_pick("max:capacity"))
    assert select_trial(defaults_study, trial=0).number == 0  # by number it still exports
    chosen = select_trial(defaults_study, reference=True)  # and the answer itself: vLLM's defaults
    doc = json.loads(export(defaults_study, chosen, "json"))
    assert doc["trial"] == "reference" and doc["config"] == defaults_study.reference["config"]
    assert "tracetune-cap-defaults-ref" in export(defaults_study, chosen, "k8s")


def test_tune_export_best_exits_2_when_the_defaults_win(capacity_url):
    out = tune("export", "--storage", capacity_url, "--study", "cap_defaults", "--best", "--format", "json")
    assert out.returncode == 2, out.stdout + out.stderr
    assert "vLLM's defaults are best" in out.stderr and "Traceback" not in out.stderr
    out = tune("export", "--storage", capacity_url, "--study", "cap", "--best", "--format", "json")
    assert out.returncode == 0 and json.loads(out.stdout)["trial"] == 0


def test_reference_capacity_is_read(cap_study):
    import dataclasses

    from tracetune.capacity.step import CapacityResult

    read = capacity.capacity_of(cap_study.reference_summary)
    assert read.usd_per_1m_output_tokens > 0  # derived from the study's --gpu-hour-cost
    assert dataclasses.replace(read, usd_per_1m_output_tokens=None) == CapacityResult.from_dict(REFERENCE_CAPACITY)
    assert cap_study.reference_run.capacity.usd_per_1m_output_tokens == read.usd_per_1m_output_tokens


def test_reads_what_replay_capacity_stores():
    from tracetune.capacity.step import CapacityResult, Step

    def step(scale, passed, **kw):
        return Step(scale=scale, rps=2 * scale, output_tps=100 * scale, attainment=1.0 if passed else 0.5,
                    passed=passed, abandoned=kw.pop("abandoned", False), requests=40, planned=40,
                    good=40 if passed else 20, duration_s=5.0, **kw)

    result = CapacityResult(attainment_target=0.95, precision=0.05, slos=[CAPACITY_SLO],
                            steps=[step(1.0, True), step(2.0, False, abandoned=True), step(1.5, True),
                                   step(1.5, True, repeat=True)],
                            capacity_scale=1.5, bracket_high=2.0, base_rps=2.0, base_output_tps=100.0, gpus=2)
    stored = Summary.from_dict({"capacity": result.as_dict()})
    cap = capacity.capacity_of(stored)
    assert metrics.metric_value("capacity", metrics.run_of(stored)) == pytest.approx(1.5)
    assert capacity.bracket_text(cap) == "[3, 4] req/s"
    assert [s.kind for s in capacity.steps(cap)] == ["passed", "abandoned", "passed", "passed"]
    assert capacity.capacity_point(cap) == (pytest.approx(3.0), 1.0)
    assert "1.5 req/s per GPU (3 req/s on 2 GPUs)" in capacity.headline(cap)
    assert charts.figure_summary(charts.attainment_figure([("trial 0", cap)]))["trial 0: capacity 3 req/s"] == 1


def test_cost_and_sizing_columns_and_export_lines(cap_study, defaults_study):
    from tracetune.tuner.front import economics

    assert cap_study.economics == {"gpu_hour_cost": 2.5, "target_rate": 40.0}
    rows = {r["trial"]: r for r in tables.trial_table(cap_study)}
    measured = [t for t in cap_study.trials if t.measured and capacity.capacity_of(t.summary)]
    t = measured[0]
    expected = economics(t.summary.capacity, gpu_hour_cost=2.5, target_rate=40.0)
    assert rows[t.number]["$/1M output tokens"] == pytest.approx(expected["usd_per_1m_output_tokens"])
    assert rows[t.number]["GPUs for 40 req/s"] == expected["gpus_total"]
    header = export(cap_study, t, "command")
    assert "$2.5/GPU-hour" in header and "per 1M output tokens" in header and "for 40 req/s of this traffic" in header
    # a study run without the flags has no such columns
    assert not any("$/1M" in key for row in tables.trial_table(defaults_study) for key in row)
    # cost is a metric too: a Pareto axis and a filter
    assert t.metric("usd_per_1m_output_tokens") == pytest.approx(expected["usd_per_1m_output_tokens"])
    assert metrics.METRICS["usd_per_1m_output_tokens"] == "minimize"
    assert math.isnan(next(x for x in defaults_study.trials if x.measured).metric("usd_per_1m_output_tokens"))
    fig = charts.pareto_figure(cap_study, "usd_per_1m_output_tokens", "capacity")
    assert fig.data
