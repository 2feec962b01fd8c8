"""A trace-rate level that ends once it certainly misses the SLO (`capacity.step.MissedSLO`, a trial's
trace rate: `tuner.measure`): against the simulated engine's timing model in virtual time, the same
level run to its end and ended early; and the rule itself on hand-made requests."""

from __future__ import annotations

import random

from tracetune.capacity.levels import LevelRunner
from tracetune.capacity.response import repeat_rule
from tracetune.capacity.step import CUT_MISS_ERROR, CapacityOptions, DecidedBy, MissedSLO
from tracetune.capacity.virtual import VirtualSend
from tracetune.engine_adapter.sim.model import SimModel
from tracetune.replay.metrics import parse_slos, summarize
from tracetune.replay.types import InFlight, PreparedRequest, ReplayOptions

SLOS = tuple(parse_slos("ttft:p95<2s,tpot:p95<200ms"))


def trace(n: int = 60, seed: int = 1) -> list[PreparedRequest]:
    """A request a second, outputs of 20-60 tokens."""
    rng = random.Random(seed)
    return [PreparedRequest(index=i, id=None, scheduled_s=float(i), input_tokens=100.0,
                            max_tokens=rng.choice([20, 60])) for i in range(n)]


def level(slots: int, *, end_on_slo_miss: bool):
    options = CapacityOptions(slos=SLOS, level_lifetimes=1, level_requests=60)
    runner = LevelRunner("http://simulated", "sim", trace(), ReplayOptions(), options,
                         send=VirtualSend(SimModel(slots=slots, ttft_s=0.3, tpot_s=0.05, alpha=0.0)))
    step = runner.level(1.0, abandon=False, end_on_slo_miss=end_on_slo_miss)
    return step, runner.results[1.0]


def test_a_level_that_certainly_misses_the_slo_ends_with_lower_bounds_and_a_clear_fail():
    """One slot for a request a second of 1-3 s: the queue grows and TTFT with it. Ended early, the level
    is a clear fail (no repeat needed), its requests in flight are cut (not failures), and its TTFT p95 is
    a lower bound of the full run's that is already past the SLO."""
    full, full_run = level(1, end_on_slo_miss=False)
    ended, ended_run = level(1, end_on_slo_miss=True)
    assert not full.passed and not full.abandoned and not full.ended
    assert not ended.passed and ended.abandoned and ended.decided_by == DecidedBy.SLO_MISSED
    assert ended_run.duration_s < full_run.duration_s / 2
    assert ended.ended.startswith("TTFT p95 at least ") and ended.ended.endswith(" against 2 s")
    assert repeat_rule(ended, 0.95)[1].startswith("clear fail: abandoned"), repeat_rule(ended, 0.95)
    cut = [r for r in ended_run.records if r.error == CUT_MISS_ERROR]
    assert len(cut) == ended.cut > 0 and all(r.cut and not r.success for r in cut) and ended.errors == 0
    full_summary, ended_summary = summarize(full_run, SLOS), summarize(ended_run, SLOS)
    assert ended_summary.errors == 0 and ended_summary.ended and not full_summary.ended
    least, truth = (s.estimate("ttft", "p95").value for s in (ended_summary, full_summary))
    assert 2.0 < least <= truth and not ended_summary.slo_met[str(SLOS[0])]
    assert f"ended with {ended.cut} in flight: TTFT p95 at least" in ended.line()


def test_a_level_that_keeps_the_slo_runs_to_its_end():
    step, run = level(16, end_on_slo_miss=True)
    assert step.passed and not step.abandoned and not step.ended and not run.abandoned


def test_the_rule_counts_unsent_requests_as_instant_and_never_decides_tpot():
    """Of 100 planned, 5 waiting 10 s for their first token leave the p95 open (the 95 others may all
    be instant); 6 decide it. A TPOT target alone is never certain: an unfinished request's is unknown."""
    waiting = [InFlight(send=0.0, scheduled_s=0.0) for _ in range(6)]
    assert not MissedSLO(SLOS, planned=100)([], waiting[:5], now=10.0)
    rule = MissedSLO(SLOS, planned=100)
    assert rule([], waiting, now=10.0) and rule.said == "TTFT p95 at least 10 s against 2 s"
    assert not MissedSLO(parse_slos("tpot:p95<1ms"), planned=100)([], waiting * 20, now=10.0)
    answered = [InFlight(send=0.0, first_output=0.1, scheduled_s=0.0) for _ in range(6)]
    assert not MissedSLO(SLOS, planned=100)([], answered, now=10.0)  # their first tokens came in time
