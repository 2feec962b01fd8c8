"""A level that ends when its pass is decided (`capacity.levels.DecidedPass`): against the simulated
engine's timing model in virtual time, the same level under the classic rules (run to its last
request) and the guided ones (its slowest requests cut once the pass is certain)."""

from __future__ import annotations

import random

import pytest

from tracetune.capacity.levels import LevelRunner
from tracetune.capacity.response import repeat_rule
from tracetune.capacity.step import CUT_ERROR, CapacityOptions
from tracetune.capacity.sustain import CUT_QUEUE_ERROR
from tracetune.capacity.virtual import VirtualSend
from tracetune.engine_adapter.sim.model import SimModel
from tracetune.replay.metrics import parse_slos
from tracetune.replay.types import PreparedRequest, ReplayOptions

SLOS = tuple(parse_slos("ttft:p95<2s,tpot:p95<200ms"))


def trace(n: int = 60, seed: int = 1) -> list[PreparedRequest]:
    """A request a second, outputs of 20-60 tokens but for the last, of 400: it streams for 20 s after
    the last arrival."""
    rng = random.Random(seed)
    return [PreparedRequest(index=i, id=None, scheduled_s=float(i), input_tokens=100.0,
                            max_tokens=400 if i == n - 1 else rng.choice([20, 60])) for i in range(n)]


def level(rules: str, scale: float):
    options = CapacityOptions(slos=SLOS, rules=rules, level_lifetimes=1, level_requests=60)
    runner = LevelRunner("http://simulated", "sim", trace(), ReplayOptions(), options,
                         send=VirtualSend(SimModel(slots=16, ttft_s=0.3, tpot_s=0.05, alpha=0.01)))
    step = runner.level(scale)
    return step, runner.results[scale]


def test_a_decided_pass_cuts_the_tail_and_keeps_the_verdict_and_its_tests():
    classic, classic_run = level("classic", 1.0)
    guided, guided_run = level("guided", 1.0)
    assert classic.passed and guided.passed and guided.decided_by == classic.decided_by == "held"
    assert classic.cut == 0 and guided.cut == 1  # at most what the last third may miss (1 of its 20)
    assert guided_run.duration_s < classic_run.duration_s - 10  # the slowest answers no longer hold it open
    cut = [r for r in guided_run.records if r.error == CUT_ERROR]
    assert len(cut) == guided.cut and all(r.ttft_s is not None and not r.success for r in cut)
    assert len(guided_run.records) == len(classic_run.records) and not guided_run.abandoned
    # Its attainment is a lower bound: the cut requests count as misses.
    assert guided.attainment <= classic.attainment and guided.errors == 0
    # The held tests read the same queue: every cut request counted for its time in flight.
    assert guided.in_flight_trend == classic.in_flight_trend
    assert "ended with 1 in flight, its attainment certain" in guided.line()
    assert f"attainment >= {guided.attainment:.0%} (" in guided.line()


def test_a_failing_level_is_never_decided_as_a_pass():
    classic, _ = level("classic", 16.0)
    guided, _ = level("guided", 16.0)
    assert not classic.passed and not guided.passed and guided.cut == 0


def test_a_level_whose_queue_is_certainly_rising_ends_at_its_last_arrival_with_the_same_verdict():
    """Many slots whose streams slow as the batch grows: at 7x the queue rises while every request
    meets the SLO. The guided rules end the level once its last request is sent, since the requests
    in flight up to then are fixed: the same trend, the same verdict, without the drain."""
    def run(rules: str):
        options = CapacityOptions(slos=SLOS, rules=rules, level_lifetimes=1, level_requests=60)
        runner = LevelRunner("http://simulated", "sim", trace(), ReplayOptions(), options,
                             send=VirtualSend(SimModel(slots=256, ttft_s=0.3, tpot_s=0.05, alpha=0.05)))
        return runner.level(7.0), runner.results[7.0]

    (classic, classic_run), (guided, guided_run) = run("classic"), run("guided")
    assert not classic.passed and not guided.passed and classic.decided_by == guided.decided_by == "queue rising"
    assert classic.cut == 0 and guided.cut > 0 and guided.ended == "its queue certainly rising"
    assert guided.in_flight_trend == pytest.approx(classic.in_flight_trend)
    assert guided_run.duration_s < classic_run.duration_s - 15 and not guided_run.abandoned
    cut = [r for r in guided_run.records if r.error == CUT_QUEUE_ERROR]
    assert len(cut) == guided.cut and len(guided_run.records) == len(classic_run.records)
    # Its attainment and SLO ratio are lower bounds: the requests cut count at the least they can be.
    assert guided.attainment < classic.attainment == 1.0
    assert guided.slo_ratio[1] <= classic.slo_ratio[1] and guided.slo_ratio[1] > 0
    assert repeat_rule(guided, 0.95)[0] is False  # a trend test decided it: no repeat
    line = guided.line()
    assert f"attainment >= {guided.attainment:.0%}" in line and "its queue certainly rising" in line
