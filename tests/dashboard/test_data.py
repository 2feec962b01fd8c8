"""Data shaping and Pareto logic of the dashboard (plain functions, no Streamlit)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.dashboard.synthetic import SLO
from tracetune.dashboard import charts, data, metrics, records, storage, tables
from tracetune.errors import InputError


@pytest.fixture(scope="module")
def study(synthetic_url):
    return data.load_study(synthetic_url, "synth")


def test_dominates_respects_directions():
    dirs = ["minimize", "maximize"]
    assert data.dominates([1.0, 10.0], [2.0, 5.0], dirs)
    assert not data.dominates([1.0, 4.0], [2.0, 5.0], dirs)      # a trade-off
    assert not data.dominates([1.0, 5.0], [1.0, 5.0], dirs)      # equal points do not dominate


def test_pareto_mask_small_cases():
    dirs = ["minimize", "maximize"]
    pts = [[0.3, 30.0], [0.5, 45.0], [0.6, 25.0], [math.nan, 99.0]]
    assert data.pareto_mask(pts, dirs) == [True, True, False, False]
    assert data.pareto_mask([[1.0, 1.0], [1.0, 1.0]], dirs) == [True, True]  # ties both stay


points_strategy = st.lists(st.lists(st.integers(0, 6).map(float), min_size=3, max_size=3), min_size=1, max_size=25)


@settings(max_examples=200, deadline=None)
@given(points=points_strategy, dirs=st.lists(st.sampled_from(["minimize", "maximize"]), min_size=3, max_size=3))
def test_pareto_mask_is_the_non_dominated_set(points, dirs):
    mask = data.pareto_mask(points, dirs)
    front = [p for p, on in zip(points, mask) if on]
    assert front, "a non-empty set always has a front"
    for p, on in zip(points, mask):
        dominated = any(data.dominates(q, p, dirs) for q in points)
        assert on == (not dominated)
    # every point off the front is dominated by a point on it (transitivity)
    for p, on in zip(points, mask):
        if not on:
            assert any(data.dominates(q, p, dirs) for q in front)


def test_load_study_categories(study):
    cats = {t.number: t.category for t in study.trials}
    assert cats == {0: "pareto", 1: "pareto", 2: "dominated", 3: "infeasible", 4: "failed", 5: "failed", 6: "running"}
    assert study.objectives == ["ttft_p99", "output_tps", "quality_loss"]
    assert study.directions == ["minimize", "maximize", "minimize"]
    assert study.running and study.platform == "cuda"
    assert [t.number for t in study.front] == [0, 1]


def test_penalty_values_of_unmeasured_trials_are_never_shown(study):
    failed = study.trial(4)
    assert failed.state == "COMPLETE" and failed.status == "engine_failed"
    assert math.isnan(failed.metric("ttft_p99")) and failed.objective_values == {}
    assert failed.failure_reason.startswith("engine exited") and "no memory" in failed.log_tail


def test_diff_from_reference(study):
    assert study.trial(1).diff == {"max_num_seqs": 32}
    assert study.trial(4).diff == {"kv_cache_space_gib": 0.0001}
    assert data.diff_text({}) == "(same as reference)"


def test_reference_metrics(study):
    assert study.reference_metric("ttft_p99") == pytest.approx(0.25)
    assert study.reference_metric("output_tps") == pytest.approx(20.0)
    assert study.reference_metric("quality_loss") == 0.0


def test_metric_value_reads_every_metric_from_stored_dicts(study):
    t = study.trial(0)
    assert t.metric("ttft_p50") == pytest.approx(0.15)
    assert t.metric("e2e_p99") == pytest.approx(1.8)
    assert t.metric("prefix_cache_hit_rate") == pytest.approx(0.25)
    assert t.metric("spec_acceptance_rate") == pytest.approx(0.6)
    assert math.isnan(t.metric("goodput"))  # no SLO-based goodput stored
    with pytest.raises(InputError, match="unknown metric"):
        metrics.metric_value("nope", t.run)


def test_thresholds_from_slos_and_quality_gate(study):
    lines = charts.thresholds(study)
    assert lines["ttft_p99"] == [(f"SLO {SLO}", pytest.approx(0.8))]
    assert lines["quality_loss"][0][1] == 0.05


def test_quality_units_are_metrics_and_a_gate_in_them_is_a_line(study):
    import dataclasses as dc

    quality = {"nll_delta_per_token": {"value": 0.02}, "kld": {"value": 0.013}, "ppl_change": {"value": 0.021},
               "top1_agreement": {"value": 0.94}}
    from tracetune.replay.metrics import Summary

    empty = Summary.from_dict({})
    assert metrics.metric_value("kld", metrics.run_of(empty, quality)) == pytest.approx(0.013)
    assert metrics.metric_value("top1_agreement", metrics.run_of(empty, quality)) == pytest.approx(0.94)
    assert metrics.metric_label("ppl_change") == ("perplexity change vs reference (%)", 100.0)
    older = metrics.run_of(empty, {"nll_delta_per_token": {"value": 0.1}})  # an older study
    assert math.isnan(metrics.metric_value("kld", older)) and metrics.metric_value("quality_loss", older) == 0.1
    from tracetune.quality.gate import parse_gate

    for spec, gate, metric, limit in (("kld:0.01", "kld<=0.01", "kld", 0.01),
                                      ("ppl:+1%", "ppl<=+1%", "ppl_change", 0.01),
                                      ("top1:0.99", "top1>=0.99", "top1_agreement", 0.99)):
        stored = data._gate_of({"quality_gate": parse_gate(spec).spec, "max_quality_loss": None})
        lines = charts.thresholds(dc.replace(study, quality_gate=stored))
        assert lines[metric] == [(f"quality gate {gate} (beyond the noise floor)", pytest.approx(limit))]
    # A study from before gates had units: its plain nats limit; one without a gate: none.
    assert str(data._gate_of({"max_quality_loss": 0.05})) == "nats<=0.05" and data._gate_of({}) is None


def test_the_noise_floor_is_a_band_on_quality_axes(study):
    """The synthetic reference's floor (NLL 0.002 and 0.004 per prompt): a band from zero to its upper
    bound on the quality axis, none on a latency axis; the line of text names the probe's size."""
    low, high = charts.floor_band(study, "quality_loss")
    assert low == 0.0 and high == pytest.approx(0.004, abs=1e-9)
    assert charts.floor_band(study, "top1_agreement") == (pytest.approx(0.9), 1.0)
    assert charts.floor_band(study, "ttft_p99") is None
    assert study.floor_text.startswith("noise floor (the reference against itself, 2 texts, 8 tokens)")
    fig = charts.pareto_figure(study, "ttft_p99", "quality_loss").to_dict()
    bands = [s for s in fig["layout"]["shapes"] if s.get("type") == "rect"]
    assert len(bands) == 1 and bands[0]["y0"] == 0.0 and bands[0]["y1"] == pytest.approx(0.004, abs=1e-9)
    assert any("noise floor" in (a.get("text") or "") for a in fig["layout"]["annotations"])
    assert not [s for s in charts.pareto_figure(study, "ttft_p99", "output_tps").to_dict()["layout"]["shapes"]
                if s.get("type") == "rect"]


def test_a_lossless_trial_beyond_the_floor_says_the_probe_is_too_noisy(study):
    import dataclasses as dc

    noisy = {**study.trials[0].quality, "lossless": True, "within_floor": False}
    assert study.quality_check == ""  # the synthetic trials say nothing about losslessness
    changed = dc.replace(study, trials=[dc.replace(study.trials[0], quality=noisy), *study.trials[1:]])
    assert changed.quality_check.startswith("quality probe too noisy on this platform: trial(s) 0 ")


def test_parse_conditions_units_and_errors():
    conds = tables.parse_conditions("ttft_p99<500ms and output_tps>=20, quality_loss <= 0.01")
    assert [(c.metric, c.op, c.value) for c in conds] == [("ttft_p99", "<", pytest.approx(0.5)),
                                                          ("output_tps", ">=", 20.0), ("quality_loss", "<=", 0.01)]
    assert tables.parse_conditions("  ") == []
    with pytest.raises(InputError, match="unknown metric 'ttft'"):
        tables.parse_conditions("ttft<1")
    with pytest.raises(InputError, match="cannot read"):
        tables.parse_conditions("ttft_p99 < lots")
    with pytest.raises(InputError, match="not a latency"):
        tables.parse_conditions("output_tps>5ms")


def test_filter_trials_by_constraints_and_category(study):
    got = tables.filter_trials(study.trials, tables.parse_conditions("ttft_p99<0.55"))
    assert [t.number for t in got] == [0, 1]  # unmeasured trials never meet a condition
    got = tables.filter_trials(study.trials, [], categories=["failed"])
    assert [t.number for t in got] == [4, 5]


def test_trial_table_rows(study):
    rows = {r["trial"]: r for r in tables.trial_table(study)}
    assert rows[1]["output_tps"] == 45.0 and rows[1]["category"] == "pareto"
    assert rows[1]["95% intervals"] == "ttft_p99 [450, 550] ms · output_tps [40.5, 49.5] · quality_loss [0.019, 0.021]"
    assert rows[1]["based on"] == "4 requests, 4 probe texts"
    assert rows[1]["differs from reference"] == "max_num_seqs=32"
    assert rows[5]["differs from reference"].startswith("sampled: max_num_seqs=")
    assert "AVX-512" in rows[5]["why"] and rows[3]["why"] == "breaks the SLO ttft:p99<800ms: ttft p99 900 ms"
    assert rows[2]["why"] == "another run is better on every objective"
    assert rows[1]["quality vs defaults"].startswith("perplexity +2.02% [+1.92%, +2.12%] · KLD 0.0100 [")
    assert rows[1]["spec_acceptance_rate"] == pytest.approx(0.6) and rows[1]["spec_accepted_length"] == 2.5
    assert tables.decision_columns(study) == ["trial", "category", "why", "ttft_p99", "output_tps", "quality_loss",
                                              "quality vs defaults", "differs from reference"]
    order = [t.number for t in tables.sort_for_table(study.trials)]
    assert order == [0, 1, 2, 3, 4, 5, 6]


def test_cdf_and_latency_cdfs(study):
    xs, ys = records.cdf([3.0, None, 1.0, 2.0, math.nan])
    assert xs == [1.0, 2.0, 3.0] and ys == pytest.approx([1 / 3, 2 / 3, 1.0])
    rows = records.request_records(study.trial(0))
    assert len(rows) == 5
    cdfs = records.latency_cdfs(rows)
    assert len(cdfs["ttft"][0]) == 4          # the failed request has no TTFT
    assert len(cdfs["itl"][0]) == 12          # gaps pooled over successful requests
    assert cdfs["e2e"][1][-1] == 1.0


def test_a_long_cdf_is_thinned_to_evenly_spaced_ranks_keeping_the_tail():
    """600 requests x 255 gaps: the ITL CDF drawn from 400 ranks, not 153,000 (Trial detail's weight)."""
    values = [float(v) for v in range(153_000)]
    xs, ys = records.cdf(reversed(values))
    assert len(xs) == records.CDF_POINTS and xs[0] == 0.0 and xs[-1] == 152_999.0 and ys[-1] == 1.0
    assert ys == sorted(ys) and ys[0] == pytest.approx(1 / 153_000)
    assert max(b - a for a, b in zip(xs, xs[1:])) <= 153_000 / (records.CDF_POINTS - 1) + 1  # evenly spaced


def test_timeline_sorted_by_send_time(study):
    rows = records.timeline(records.request_records(study.trial(1)))
    assert [r.send_s for r in rows] == sorted(r.send_s for r in rows)
    assert [r.success for r in rows].count(False) == 1 and rows[3].error == "timeout"


def test_engine_counters(study):
    c = records.engine_counters(study.trial(0))
    assert c["prefix_cache_hit_rate"] == 0.25 and c["spec_decode_acceptance_rate"] == 0.6
    assert records.engine_counters(study.trial(5))["prefix_cache_hit_rate"] is None


def test_compare_marks_differences(study):
    rows = {r["field"]: r for r in tables.compare(study, study.trial(0), study.trial(1))}
    assert rows["config.max_num_seqs"]["differs"] and rows["config.max_num_seqs"]["a"] == "8"
    assert not rows["config.dtype"]["differs"]
    assert rows["ttft_p99"]["a"] == "300 ms [270, 330] ms" and rows["ttft_p99"]["b"] == "500 ms [450, 550] ms"
    assert rows["based on"]["a"] == "4 requests, 4 probe texts"  # sample sizes shown


def test_front_on_two_axes_and_staircase(study):
    assert {t.number for t in data.front_on(study.trials, ["ttft_p99", "output_tps"])} == {0, 1}
    # on ttft_p99 alone, only the fastest is best
    assert [t.number for t in data.front_on(study.trials, ["ttft_p99"])] == [0]
    xs, ys = data.front_line(study.trials, "ttft_p99", "output_tps")
    assert xs == [0.3, 0.5, 0.5] and ys == [30.0, 30.0, 45.0]


def test_pareto_figure_shows_each_kind_distinctly(study):
    fig = charts.pareto_figure(study, "ttft_p99", "output_tps")
    counts = charts.figure_summary(fig)
    assert counts["Pareto front (2)"] == 2 and counts["dominated (1)"] == 1
    assert counts["violates SLO / quality gate (1)"] == 1 and counts["reference (unquantized)"] == 1
    pareto = next(t for t in fig.data if t.name.startswith("Pareto"))
    assert list(pareto.x) == [300.0, 500.0]                        # latencies drawn in ms
    assert "max_num_seqs=32" in pareto.hovertext[1]               # hover carries the config
    assert any(getattr(s, "x0", None) == pytest.approx(800.0) for s in fig.layout.shapes)  # the SLO line
    fig3 = charts.pareto_figure(study, "ttft_p99", "output_tps", "quality_loss")
    assert {type(t).__name__ for t in fig3.data} == {"Scatter3d"}


def test_default_storage_is_the_newest_run(tmp_path):
    import os
    import time

    assert storage.default_storage(tmp_path) is None
    for name in ("old", "new"):
        (tmp_path / "runs" / name).mkdir(parents=True)
        (tmp_path / "runs" / name / "study.db").write_bytes(b"")
        os.utime(tmp_path / "runs" / name / "study.db", (time.time() - (100 if name == "old" else 0),) * 2)
    assert storage.default_storage(tmp_path) == f"sqlite:///{(tmp_path / 'runs' / 'new' / 'study.db').resolve()}"


def test_missing_sqlite_file_is_refused_not_created(tmp_path):
    missing = tmp_path / "nope.db"
    with pytest.raises(InputError, match="no such database file"):
        data.load_study(f"sqlite:///{missing}")
    assert not missing.exists()


def test_unknown_study_names_the_ones_there(synthetic_url):
    with pytest.raises(InputError, match=r"studies there: \['synth'\]"):
        data.load_study(synthetic_url, "other")
    assert storage.resolve_study(synthetic_url, None) == "synth"


def test_loading_never_writes_measurements(synthetic_url, tmp_path):
    import shutil
    import sqlite3

    copy = tmp_path / "copy.db"
    shutil.copy(synthetic_url[len("sqlite:///"):], copy)
    with sqlite3.connect(copy) as conn:  # a database from an older tracetune: fewer tables
        conn.execute("DROP TABLE IF EXISTS tracetune_claims")
    before = copy.read_bytes()
    data.load_study(f"sqlite:///{copy}", "synth")
    assert copy.read_bytes() == before


def test_request_records_read_packed_and_plain_storage(study):
    from tracetune.tuner.storage import pack_records, unpack_records  # what the dashboard reads with

    plain = study.trial(0).requests_jsonl
    assert plain.startswith("{")  # unpacked on load
    assert unpack_records(pack_records(plain)) == plain
    assert unpack_records(plain) == plain  # written by an older tracetune


def test_the_pareto_chart_draws_95_percent_intervals_as_error_bars(study):
    fig = charts.pareto_figure(study, "ttft_p99", "output_tps")
    front = next(t for t in fig.data if t.name.startswith("Pareto front"))
    order = [int(n) for n in front.text]
    plus = dict(zip(order, front.error_x.array))
    assert front.error_x.visible and plus[0] == pytest.approx(30.0) and plus[1] == pytest.approx(50.0)  # ms
    assert dict(zip(order, front.error_y.arrayminus))[1] == pytest.approx(4.5)  # output_tps 45 [40.5, 49.5]
    ref = next(t for t in fig.data if t.name == "reference (unquantized)")
    assert ref.error_x.array == (pytest.approx(25.0),)  # the reference's run: 250 ms [225, 275]


def test_a_running_trial_whose_worker_went_silent_is_shown_interrupted(tmp_path):
    """Optuna's heartbeat table says when a running trial's worker last spoke: silent for longer than
    twice the heartbeat (600 s in the synthetic study), the trial was cut off (shown interrupted, live
    refresh off); recent, it runs."""
    import re

    from tests.dashboard.synthetic import beat, make_study

    url = make_study(tmp_path / "study.db")
    beat(url, 6, seconds_ago=1300)
    stale = data.load_study(url, "synth")
    assert stale.trial(6).status == "interrupted" and not stale.running and stale.trial(6).category == "failed"
    ago = re.search(r"stopped sending heartbeats (\d+) s ago", stale.trial(6).failure_reason)
    assert ago and 1295 <= int(ago.group(1)) <= 1305  # the database's clock has whole seconds
    beat(url, 6, seconds_ago=3 * 86400)
    assert "stopped sending heartbeats 3.0 days ago" in data.load_study(url, "synth").trial(6).failure_reason
    beat(url, 6, seconds_ago=5)
    fresh = data.load_study(url, "synth")
    assert fresh.trial(6).status == "running" and fresh.running


def test_trial_status_rules():
    """RUNNING with a stale or absent heartbeat is interrupted; WAITING is queued, never running."""
    status = data.trial_status
    assert status("RUNNING", None, None, silent_s=10, started_s=5000, grace_s=60) == ("running", None)
    assert status("RUNNING", None, None, silent_s=61, started_s=None, grace_s=60)[0] == "interrupted"
    late = status("RUNNING", None, None, silent_s=None, started_s=7200, grace_s=60)
    assert late[0] == "interrupted" and "started 2.0 h ago and no heartbeat" in late[1]
    assert status("RUNNING", None, None, silent_s=None, started_s=30, grace_s=60)[0] == "running"
    queued = status("WAITING", None, None, silent_s=None, started_s=None, grace_s=60)
    assert queued[0] == "queued" and "next run measures it" in queued[1]
    assert status("COMPLETE", "measured", None, silent_s=None, started_s=None, grace_s=60) == ("measured", None)
    assert status("FAIL", None, None, silent_s=None, started_s=None, grace_s=60)[0] == "interrupted"


def test_a_queued_trial_is_not_running(tmp_path):
    import optuna

    from tests.dashboard.synthetic import beat, make_study

    url = make_study(tmp_path / "study.db")
    beat(url, 6, seconds_ago=5000)
    study = optuna.load_study(study_name="synth", storage=url)
    study.enqueue_trial({"max_num_seqs": 12})
    view = data.load_study(url, "synth")
    queued = view.trials[-1]
    assert queued.status == "queued" and queued.category == "queued" and not view.running


def test_a_pruned_trial_is_its_own_category_listed_with_why_never_plotted(tmp_path):
    """A trial whose capacity search stopped early (`tune`'s early stop) is neither failed nor on the chart."""
    import optuna
    from optuna.distributions import IntDistribution
    from optuna.trial import TrialState, create_trial

    from tests.dashboard.synthetic import config, make_study, quality, summary
    from tracetune.tuner.storage import ResultStore

    url = make_study(tmp_path / "s.db")
    study = optuna.load_study(study_name="synth", storage=url)
    reason = "pruned: fails 2x the trace's rate (confirmed by a repeat), where trial 0 passes"
    params = {"max_num_seqs": 3}
    number = len(study.trials)
    ResultStore(url).save_trial("synth", number, "pruned", values=params, config=config(max_num_seqs=3),
                                summary=summary(0.5, 10.0), quality=quality(0.0), failure_reason=reason)
    study.add_trial(create_trial(state=TrialState.COMPLETE, values=[0.5, 10.0, 0.0], params=params,
                                 distributions={"max_num_seqs": IntDistribution(1, 128)},
                                 user_attrs={"values": params, "status": "pruned", "feasible": False,
                                             "failure_reason": reason, "constraints": [0.0, 0.0]}))
    view = data.load_study(url, "synth")
    pruned = view.trial(number)
    assert pruned.category == "pruned" and pruned.objective_values == {}
    assert [c["status"] for c in tables.failure_causes([pruned])] == ["pruned"]
    assert number not in {t.number for t in view.front}


def test_speculation_on_random_weights_says_why_it_is_off_the_front(tmp_path):
    """The tuner keeps such a trial measured but infeasible (`tuner.front.not_meaningful`); the
    dashboard gives its reason, not a constraint it never broke."""
    import optuna
    from optuna.distributions import IntDistribution
    from optuna.trial import TrialState, create_trial

    from tests.dashboard.synthetic import config, make_study, quality, summary
    from tracetune.tuner.front import not_meaningful
    from tracetune.tuner.storage import ResultStore

    url = make_study(tmp_path / "s.db")
    study = optuna.load_study(study_name="synth", storage=url)
    cfg = {**config(max_num_seqs=4), "load_format": "dummy", "speculative": {"method": "ngram"}}
    reason = not_meaningful(cfg)
    params = {"max_num_seqs": 4}
    number = len(study.trials)
    ResultStore(url).save_trial("synth", number, "measured", values=params, config=cfg,
                                summary=summary(0.1, 90.0), quality=quality(0.0), failure_reason=reason)
    study.add_trial(create_trial(state=TrialState.COMPLETE, values=[0.1, 90.0, 0.0], params=params,
                                 distributions={"max_num_seqs": IntDistribution(1, 128)},
                                 user_attrs={"values": params, "status": "measured", "feasible": False,
                                             "not_meaningful": reason, "failure_reason": reason,
                                             "constraints": [-0.7, -0.05]}))
    view = data.load_study(url, "synth")
    trial = view.trial(number)
    assert trial.category == "infeasible" and trial.violations == [reason]
    assert "random weights" in tables.why(view, trial)


def test_a_stored_row_of_an_older_study_reads_as_typed_records():
    """`StoredRun.from_row` reads a row as `ResultStore.trials` decodes it; an older row (no engine
    counters, a summary without client errors or stream faults) reads with defaults."""
    from tracetune.tuner.storage import StoredRun

    old_summary = {"requests": 4, "succeeded": 4, "errors": 0, "error_rate": 0.0, "duration_s": 2.0,
                   "request_throughput_rps": {"value": 2.0, "ci_low": 1.8, "ci_high": 2.2},
                   "output_throughput_tps": {"value": 20.0, "ci_low": 18.0, "ci_high": 22.0},
                   "latency_s": {"ttft": {"p99": {"value": 0.3, "ci_low": 0.2, "ci_high": 0.4}}}}
    row = StoredRun.from_row({"trial_number": 3, "status": "measured", "summary": old_summary, "engine": None,
                              "config": {"max_num_seqs": 8}, "quality": None, "startup_s": 12.0})
    assert row.summary is not None and row.summary.client_errors == 0 and row.summary.stream_faults == 0
    assert row.summary.estimate("ttft", "p99").value == 0.3 and row.engine is None and row.wall_s is None
    assert metrics.metric_value("ttft_p99", metrics.run_of(row.summary)) == 0.3
    assert math.isnan(metrics.metric_value("prefix_cache_hit_rate", metrics.run_of(row.summary)))
    empty = StoredRun.from_row({"trial_number": 4, "status": "engine_failed", "summary": None})
    assert empty.summary is None and metrics.run_of(empty.summary) is None


def test_a_level_kind_is_its_outcome_a_client_limited_level_apart():
    from tracetune.capacity.step import Outcome, Step
    from tracetune.dashboard.capacity import LevelKind, step_kind

    def level(**kw):
        return Step(scale=1.0, rps=1.0, output_tps=1.0, attainment=0.5, requests=10, planned=10, good=5,
                    duration_s=1.0, **kw)

    assert step_kind(level(passed=True, abandoned=False)) is LevelKind.PASSED
    assert step_kind(level(passed=False, abandoned=False)) is LevelKind.FAILED
    assert step_kind(level(passed=False, abandoned=True)) is LevelKind.ABANDONED
    assert step_kind(level(passed=False, abandoned=True, client_overloaded=True)) is LevelKind.CLIENT_LIMITED
    assert step_kind(level(passed=True, abandoned=False, client_overloaded=True)) is LevelKind.PASSED
    assert level(passed=False, abandoned=True).outcome is Outcome.ABANDONED
