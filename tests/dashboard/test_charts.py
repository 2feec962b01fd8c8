"""Charts that fit their data: axis ranges hold error bars and brackets, legends sit outside the plot,
log axes only over positive values, the attainment axis zoomed to the data and the target."""

from __future__ import annotations

import dataclasses
import math

import pytest

from tests.dashboard.synthetic import capacity
from tracetune.capacity.step import CapacityResult
from tracetune.dashboard import charts, data


def test_axis_range_holds_finite_values_and_logs_only_positive_ones():
    assert charts.axis_range([1.0, 3.0], pad_share=0.5) == [0.0, 4.0]
    assert charts.axis_range([2.0, math.inf, None, math.nan]) == pytest.approx([1.8, 2.2])  # one value: +-10%
    assert charts.axis_range([0.0, 1.0, 100.0, math.inf], log=True, pad_share=0.1) == pytest.approx([-0.2, 2.2])
    assert charts.axis_range([0.0, -1.0], log=True) is None


def test_the_pareto_range_holds_every_error_bar(synthetic_url):
    study = data.load_study(synthetic_url, "synth")
    fig = charts.pareto_figure(study, "ttft_p99", "output_tps")
    for axis in ("x", "y"):
        ends = [v for trace in fig.data for v in charts._extent(trace, axis)]
        low, high = getattr(fig.layout, f"{axis}axis").range
        assert low < min(ends) and max(ends) < high
    tops = [t.y[i] + t.error_y.array[i] for t in fig.data if t.error_y and t.error_y.visible for i in range(len(t.y))]
    assert max(tops) == pytest.approx(66.0)  # trial 3: 60 tokens/s [54, 66], inside the axis
    assert fig.layout.legend.y < 0 and fig.layout.legend.yanchor == "top"  # below the plot area


def test_a_bracket_with_raw_zero_or_inf_never_stretches_a_log_axis():
    """The reference's chart once ran from 1 to 1e40 req/s: a bracket's 0 and inf drawn on a log axis."""
    cap = CapacityResult.from_dict(capacity(1.0, 2.0, [(1.0, 0.99, "pass"), (8.0, 0.2, "fail")], high=8.0))
    cap = dataclasses.replace(cap, capacity_scale=None, bracket_high=math.inf)  # bracket [0, inf] req/s
    fig = charts.attainment_figure([("trial 0", cap)])
    assert not [s for s in fig.layout.shapes if s.type == "rect"]
    assert fig.layout.xaxis.type == "log"  # 2 to 16 req/s, all positive
    low, high = fig.layout.xaxis.range
    assert 10 ** low < 2.0 < 16.0 < 10 ** high < 100.0


def test_the_attainment_axis_zooms_to_the_band_of_the_data():
    near = CapacityResult.from_dict(capacity(1.2, 2.0, [(1.0, 1.0, "pass"), (1.5, 0.96, "fail"), (1.2, 0.97, "pass")],
                                             high=1.5))
    low, high = charts.attainment_figure([("trial 0", near)]).layout.yaxis.range
    assert 0.94 < low < 0.95 and 1.0 < high < 1.01  # 95% target .. 100%, not 0 .. 100%
    wide = CapacityResult.from_dict(capacity(1.2, 2.0, [(1.0, 1.0, "pass"), (2.0, 0.3, "abandon"), (1.2, 0.97, "pass")],
                                             high=2.0))
    low, _ = charts.attainment_figure([("trial 0", wide)]).layout.yaxis.range
    assert 0.2 < low < 0.3  # the abandoned level stays in view


def test_cdf_legends_sit_below_the_plot(synthetic_url):
    study = data.load_study(synthetic_url, "synth")
    fig = charts.cdf_figure([study.trial(0), study.reference_run], "ttft")
    assert fig.layout.showlegend and fig.layout.legend.orientation == "h" and fig.layout.legend.y < 0
