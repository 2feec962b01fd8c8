"""Where a trial's wall time goes (`tuner.trial_cost`): the clock's split, its words, the time left."""

from __future__ import annotations

import time

from tracetune.replay.metrics import Summary
from tracetune.tuner.trial_cost import CostClock, cost_text, duration, time_left


def test_the_clock_splits_levels_from_the_probes_inside_them():
    clock = CostClock()
    with clock.part("start_s"):
        time.sleep(0.02)
    with clock.part("measure_s"):
        time.sleep(0.02)
        with clock.part("probe_s"):
            time.sleep(0.03)
    cost = clock.as_dict()
    assert set(cost) == {"start_s", "levels_s", "probe_s", "acceptance_s", "stop_s", "wall_s"}
    assert 0.015 <= cost["levels_s"] < cost["levels_s"] + cost["probe_s"] <= cost["wall_s"]
    assert cost["probe_s"] >= 0.025 and cost["acceptance_s"] == 0.0


def test_words_and_the_time_left():
    assert duration(42.4) == "42s" and duration(185) == "3m05s" and duration(3720) == "1h02m"
    text = cost_text({"start_s": 24.0, "levels_s": 130.0, "probe_s": 18.0, "acceptance_s": 0.0, "stop_s": 0.2}, 6)
    assert text == "engine start 24s · levels 2m10s (6) · quality probe 18s"
    assert cost_text(None) == ""
    assert time_left([100.0, 140.0], 3) == "about 6m00s left for 3 more trials"
    assert time_left([100.0], 0) == "" and time_left([], 2) == ""
    # A trial stopped early and one searched to the end: which comes next is not known, so a range.
    assert time_left([18.0, 282.0], 1) == "18s to 4m42s left for 1 more trial (a trial so far: 18s to 4m42s)"
    assert time_left([18.0], 2, full_s=570.0) == ("36s to 19m00s left for 2 more trials (a trial so far: 18s to "
                                                  "9m30s, the reference's included)")


def test_a_summary_keeps_its_cost_and_an_older_one_reads_without():
    stored = {"requests": 1, "succeeded": 1, "cost": {"start_s": 1.5, "levels_s": 2.0}}
    assert Summary.from_dict(stored).cost == {"start_s": 1.5, "levels_s": 2.0}
    assert Summary.from_dict({"requests": 1}).cost is None
