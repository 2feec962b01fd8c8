"""A level that measured the machine rather than the engine (`Step.machine_busy`): never counted as
the configuration's failure, measured again once the machine is quiet, and a search whose levels stay
busy ends with verdict machine_busy, a lower bound (`capacity.search`, `capacity.levels`)."""

from __future__ import annotations

import dataclasses

from tracetune.capacity.levels import LevelRunner
from tracetune.capacity.search import BUSY_RETRIES, search_capacity
from tracetune.capacity.step import CapacityOptions, Step, Verdict
from tracetune.capacity.virtual import VirtualSend
from tracetune.engine_adapter.sim.model import SimModel
from tracetune.replay.machine import Share
from tracetune.replay.metrics import Summary, parse_slos
from tracetune.replay.types import PreparedRequest, ReplayOptions
from tracetune.tuner.measure import machine_busy_reason

OPTIONS = CapacityOptions(slos=tuple(parse_slos("ttft:p99<2s")), precision=0.1)
BUSY = "machine busy: other work took 1.0 of the 2 cores the engine needs"


def engine(capacity: float, busy_at: set[float], *, always: bool = False):
    """A scripted engine of true capacity `capacity`; a level in `busy_at` fails on a busy machine
    the first time (every time with `always`)."""
    calls: list[tuple[float, bool]] = []

    def measure(scale: float, repeat: bool) -> Step:
        busy = scale in busy_at and (always or not any(s == scale for s, _ in calls))
        calls.append((scale, repeat))
        passed = scale <= capacity and not busy
        return Step(scale=scale, rps=scale, output_tps=scale * 10, attainment=1.0 if passed else 0.2, passed=passed,
                    abandoned=False, requests=20, planned=20, good=20 if passed else 4, duration_s=1.0,
                    repeat=repeat, machine_busy=BUSY if busy else "")

    return measure, calls


def test_a_busy_failure_is_measured_again_and_the_answer_is_the_quiet_one():
    quiet, _ = engine(3.0, set())
    busy, calls = engine(3.0, {2.0})
    expected = search_capacity(quiet, OPTIONS)
    got = search_capacity(busy, OPTIONS)
    assert (got.capacity_scale, got.bracket_high, got.verdict) == (expected.capacity_scale, expected.bracket_high,
                                                                  Verdict.OK)
    first, again = [s for s in got.steps if s.scale == 2.0][:2]
    assert first.not_counted and again.placed_by == "busy retry" and again.passed
    assert "machine busy" in first.line() and "not counted" in first.line()


def test_a_level_busy_every_time_ends_the_search_with_a_lower_bound():
    measure, calls = engine(8.0, {2.0}, always=True)
    got = search_capacity(measure, OPTIONS)
    assert got.verdict == Verdict.MACHINE_BUSY
    assert calls.count((2.0, False)) == 1 + BUSY_RETRIES
    assert got.capacity_scale == 1.0 and got.bracket_high == 2.0  # never 2.0's failure: a bound, said so
    assert "at least" in got.headline() and "other work on this machine took the engine's cores" in got.headline()
    assert any("machine busy" in c for c in got.caveats())
    summary = Summary.from_dict({"requests": 20, "capacity": got.as_dict()})
    assert machine_busy_reason(summary).startswith("unmeasurable: capacity at least")
    quiet = search_capacity(engine(3.0, set())[0], OPTIONS)
    assert machine_busy_reason(Summary.from_dict({"requests": 20, "capacity": quiet.as_dict()})) == ""


def test_a_busy_trace_rate_level_is_measured_again_even_when_it_passed():
    """The first level's numbers are the trial's latency objectives: a busy one is not kept."""
    measure, calls = engine(3.0, set())
    seed = dataclasses.replace(measure(1.0, False), machine_busy=BUSY)
    got = search_capacity(measure, OPTIONS, seed_steps=[seed])
    assert calls[:2] == [(1.0, False), (1.0, False)] and got.steps[1].placed_by == "busy retry"


class BusyOnce:
    """A machine watch whose first span is busy (a program burned a core), the others quiet."""

    def __init__(self) -> None:
        self.engine_cores, self.spans, self.waits = 2, 0, 0

    def start(self) -> None:
        pass

    def stop(self) -> Share:
        self.spans += 1
        others = 1.0 if self.spans == 1 else 0.0
        return Share(seconds=10.0, cpus=2, engine=1.0, client=0.2, others=others, steal=0.0,
                     idle=max(0.8 - others, 0.0))

    def wait_quiet(self) -> float:
        self.waits += 1
        return 5.0


def test_levels_mark_a_busy_replay_and_the_next_waits_for_quiet():
    requests = [PreparedRequest(index=i, id=None, scheduled_s=float(i), max_tokens=20) for i in range(40)]
    watch = BusyOnce()
    runner = LevelRunner("http://simulated", "sim", requests, ReplayOptions(),
                         dataclasses.replace(OPTIONS, level_requests=40, level_lifetimes=1),
                         send=VirtualSend(SimModel(slots=8, ttft_s=0.2, tpot_s=0.02, alpha=0.01)),
                         watch=watch)  # type: ignore[arg-type]
    first, second = runner.level(1.0), runner.level(1.0)
    assert first.machine_busy.startswith("machine busy: other work took 1.0 of the 2 cores")
    assert first.machine is not None and first.machine["others"] == 1.0
    assert second.machine_busy == "" and second.quiet_wait_s == 5.0 and watch.waits == 1


def test_the_dashboard_draws_a_busy_failure_apart_and_says_why():
    from tracetune.dashboard.capacity import LevelKind, step_kind, steps

    measure, _ = engine(3.0, {2.0})
    got = search_capacity(measure, OPTIONS)
    busy = [s for s in got.steps if s.machine_busy]
    assert busy and step_kind(busy[0]) is LevelKind.MACHINE_BUSY
    assert step_kind(dataclasses.replace(busy[0], passed=True)) is LevelKind.PASSED  # a busy pass counts
    assert any(BUSY in level.hover for level in steps(got))
