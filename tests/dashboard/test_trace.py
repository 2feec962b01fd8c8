"""The trace chart of Trial detail (`dashboard.trace`): the profile kept with a study, read back
read-only, and the windows a run's load levels replayed, once each, shaded by kind."""

from __future__ import annotations

import hashlib

import optuna

from tracetune.dashboard import trace
from tracetune.replay.metrics import Summary


def summary_with_parts() -> Summary:
    part = {"kind": "busiest", "start_s": 120.0, "end_s": 180.0}
    other = {"kind": "by load", "start_s": 300.0, "end_s": 360.0}
    steps = [{"scale": 1.0, "parts": [part]}, {"scale": 2.0, "parts": [part, other]}, {"scale": 1.5, "parts": None}]
    return Summary.from_dict({"capacity": {"steps": steps}})  # as an older study stored it: steps alone


def test_each_window_replayed_is_listed_once_with_its_levels():
    parts = trace.parts_replayed(summary_with_parts())
    assert [(p.kind, p.start_s, p.levels) for p in parts] == [("busiest", 120.0, [1.0, 2.0]),
                                                                       ("by load", 300.0, [2.0])]
    assert trace.parts_replayed(Summary.from_dict({"capacity": {"steps": [{"scale": 1.0}]}})) == []
    assert trace.parts_replayed(None) == []


def test_the_figure_draws_the_rate_and_shades_the_windows():
    profile = {"requests": 600, "duration_s": 600.0, "mean_rps": 1.0, "over_time_s": 10.0,
               "over_time": [1.0] * 30 + [4.0] * 6 + [1.0] * 24}
    parts = trace.parts_replayed(summary_with_parts())
    fig = trace.rate_figure(profile, parts, "t")
    assert list(fig.data[0].y) == profile["over_time"] and fig.data[0].x[0] == 10.0 / 2 / 60
    shapes = [(s.x0, s.x1) for s in fig.layout.shapes]
    assert shapes == [(2.0, 3.0), (5.0, 6.0)]  # minutes
    assert {d.name for d in fig.data[1:]} == {"busiest (1)", "by load (1)"}
    assert "2 windows" in trace.caption(profile, parts)
    assert "whole trace" in trace.caption(profile, [])


def test_the_profile_kept_with_a_study_is_read_without_writing(tmp_path):
    db = tmp_path / "study.db"
    url = f"sqlite:///{db}"
    study = optuna.create_study(study_name="s", storage=url)
    study.set_user_attr("trace_profile", {"requests": 3, "over_time": [1.0], "over_time_s": 1.0})
    before = hashlib.sha256(db.read_bytes()).hexdigest()
    assert trace.stored_profile(url, "s")["requests"] == 3
    assert hashlib.sha256(db.read_bytes()).hexdigest() == before
    optuna.create_study(study_name="old", storage=url)
    assert trace.stored_profile(url, "old") is None
