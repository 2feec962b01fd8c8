"""The smaller items of issue 37, without a browser: log-axis labels as whole numbers, CDFs that end
inside the frame, Compare marking only differences outside the intervals, tiles with units."""

from __future__ import annotations

import math

import pytest

from tests.dashboard.interval_studies import make_interval_studies
from tracetune.dashboard import charts, data, tables


@pytest.fixture(scope="module")
def study(tmp_path_factory) -> data.StudyView:
    return data.load_study(make_interval_studies(tmp_path_factory.mktemp("pages") / "study.db"), "undecided")


def test_log_axis_labels_are_whole_loads():
    ticks = charts.log_ticks([20.0, 35.0, 90.0])
    assert ticks["ticktext"][:8] == ["20", "30", "40", "50", "60", "70", "80", "90"]
    assert charts.log_ticks([0.5, 40.0])["ticktext"] == ["0.5", "1", "2", "5", "10", "20", "50"]
    assert charts.log_ticks([]) == {}


def test_a_cdf_ends_inside_the_frame(study):
    fig = charts.cdf_figure([study.trial(0)], "ttft")
    longest = max(fig.data[0].x)
    assert fig.layout.xaxis.range[1] > longest and fig.layout.xaxis.range[0] == 0


def test_compare_marks_only_differences_outside_the_intervals(study):
    rows = {r["field"]: r for r in tables.compare(study, study.trial(0), study.reference_run)}
    # ttft_p99 0.7 s against 0.8 s, each +-10%: the intervals overlap, so no difference is marked
    assert rows["ttft_p99"]["a"] != rows["ttft_p99"]["b"] and not rows["ttft_p99"]["differs"]
    # capacity 6 against 4 req/s per GPU, with no interval: the values differ
    assert rows["capacity"]["differs"]


def test_tiles_carry_units_and_never_a_raw_float():
    from tracetune.dashboard.tiles import tile_value

    assert tile_value("capacity", 6.0) == "6 req/s/GPU" and tile_value("output_tps", 1234.567) == "1235 tok/s"
    assert tile_value("quality_loss", -8.884e-08) == "-0.00% ppl"
    assert tile_value("ttft_p99", 0.7) == "700 ms" and tile_value("capacity", math.nan) == "-"
