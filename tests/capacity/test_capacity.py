"""The capacity search: against scripted engines whose true capacity is known (pure logic), and
one real replay loop against an in-process server with a fixed number of slots (early abandon)."""

from __future__ import annotations

import asyncio
import json
import random
import threading
import time

import pytest
from aiohttp import web

from tracetune.capacity.levels import LevelRunner
from tracetune.capacity.search import search_capacity
from tracetune.capacity.step import (
    CapacityOptions,
    Step,
    allowed_misses,
    at_scale,
    certain_misses,
    offered_rates,
    percentile_targets_met,
)
from tracetune.errors import InputError
from tracetune.replay.metrics import parse_slos
from tracetune.replay.types import InFlight, PreparedRequest, ReplayOptions, RequestRecord

SLOS = tuple(parse_slos("ttft:p99<1s"))


def options(**kw) -> CapacityOptions:
    """The classic rules (doubling, bisection, both ends repeated) unless `rules` says otherwise:
    these tests pin them; tests/capacity/test_response.py has the guided ones."""
    return CapacityOptions(slos=SLOS, **{"rules": "classic", **kw})


def scripted(true_capacity: float, *, noise: float = 0.0, seed: int = 0, cliff_above: float | None = None,
             overloaded_above: float | None = None):
    """A scripted engine: attainment falls off past `true_capacity` (gently, or to zero past a
    cliff); `noise` shifts the level it sees by a random factor each time."""
    rng = random.Random(seed)
    calls: list[tuple[float, bool]] = []

    def measure(scale: float, repeat: bool) -> Step:
        calls.append((scale, repeat))
        seen = scale * (1 + rng.uniform(-noise, noise))
        if cliff_above is not None and seen > cliff_above:
            attainment = 0.0
        else:
            attainment = 1.0 if seen <= true_capacity else max(0.0, 1.0 - (seen / true_capacity - 1.0))
        passed = attainment >= 0.95
        over = overloaded_above is not None and scale > overloaded_above
        return Step(scale=scale, rps=scale * 2, output_tps=scale * 64, attainment=attainment, passed=passed and not over,
                    abandoned=not passed, requests=20, planned=20, good=int(attainment * 20), duration_s=1.0,
                    client_overloaded=over, repeat=repeat)

    return measure, calls


@pytest.mark.parametrize("true", [0.3, 1.0, 1.7, 5.0, 37.0])
def test_smooth_engine_capacity_is_within_the_precision(true):
    measure, calls = scripted(true)
    result = search_capacity(measure, options(precision=0.05), base_rates=(2.0, 64.0))
    # passing means attainment >= 0.95, i.e. a level up to 1.05 x the true capacity
    limit = true * 1.05
    assert result.capacity_scale <= limit + 1e-9
    assert result.bracket_high > limit
    assert result.bracket_high / result.capacity_scale - 1 <= 0.05 + 1e-9
    assert result.verdict == "ok" and not result.unstable
    assert calls[0] == (1.0, False)  # starts at the trace's own rate
    # both ends of the bracket are confirmed by a repeat
    assert sorted(c for c in calls if c[1]) == [(result.capacity_scale, True), (result.bracket_high, True)]
    assert result.capacity_rps == pytest.approx(2.0 * result.capacity_scale)
    assert len(calls) <= 14


def test_cliff_is_found():
    measure, _ = scripted(100.0, cliff_above=3.0)
    result = search_capacity(measure, options(precision=0.05))
    assert 3.0 / 1.05 <= result.capacity_scale <= 3.0 < result.bracket_high


def test_config_that_fails_at_the_trace_rate_is_searched_downward():
    measure, calls = scripted(0.2)
    result = search_capacity(measure, options(), base_rates=(2.0, 64.0))
    assert calls[0][0] == 1.0 and not result.steps[0].passed
    assert 0.2 / 1.05 <= result.capacity_scale <= 0.21
    assert result.headline().startswith("capacity 0.403 req/s [0.403, 0.42] = 0.201x")


def test_config_that_never_passes_has_capacity_zero():
    def measure(scale, repeat):  # lower load helps, but never enough
        attainment = 0.9 * (1 - scale / 2)
        return Step(scale=scale, rps=scale, output_tps=scale, attainment=attainment, passed=False, abandoned=False,
                    requests=100, planned=100, good=int(attainment * 100), duration_s=1.0)

    result = search_capacity(measure, options(min_scale=1 / 16))
    assert result.capacity_scale is None and result.verdict == "below_min"
    assert result.as_dict()["capacity_rps"] == 0.0
    assert "capacity 0" in result.headline()


def test_noise_is_confirmed_or_flagged_never_averaged():
    outcomes = []
    for seed in range(40):
        measure, _ = scripted(4.0, noise=0.08, seed=seed)
        result = search_capacity(measure, options(precision=0.05))
        repeats = [s for s in result.steps if s.repeat]
        assert len(repeats) >= 2
        if result.unstable:
            # a repeat disagreed with the first measurement of its level: a third one decided
            assert "UNSTABLE" in result.headline()
            disagreeing = {s.scale for s in repeats} & {s.scale for s in result.steps if not s.repeat}
            assert any(len({x.passed for x in result.steps if x.scale == k}) == 2 for k in disagreeing)
        else:
            assert {s.scale for s in repeats} == {result.capacity_scale, result.bracket_high}
        outcomes.append(result.unstable)
        # whatever the noise did, the answer stays near the truth (noise +-8%, precision 5%)
        assert 4.0 * 0.85 <= result.capacity_scale <= 4.0 * 1.2
        assert result.capacity_scale < result.bracket_high
    assert any(outcomes) and not all(outcomes)  # the noise does bite sometimes, and is caught


def first_measurement_of(measure, scale: float, **changes):
    """`measure`, except that its first measurement of `scale` comes out with `changes` applied."""
    pending = {"first": True}

    def changed(k, repeat):
        step = measure(k, repeat)
        if k == scale and pending["first"]:
            pending["first"] = False
            for name, value in changes.items():
                setattr(step, name, value)
        return step

    return changed


def test_a_single_unlucky_failure_at_the_trace_rate_does_not_decide():
    # the engine carries 3x, but the first measurement of 1x fails (one outlier request)
    measure, calls = scripted(3.0)
    result = search_capacity(first_measurement_of(measure, 1.0, passed=False), options())
    assert result.unstable and 2.85 <= result.capacity_scale <= 3.15
    assert [s.passed for s in result.steps if s.scale == 1.0] == [False, True, True]


def test_seeded_start_skips_the_climb():
    measure, calls = scripted(40.0)
    cold = search_capacity(measure, options())
    warm_measure, warm_calls = scripted(40.0)
    warm = search_capacity(warm_measure, options(start_scale=38.0))
    assert warm.capacity_scale == pytest.approx(cold.capacity_scale, rel=0.06)
    assert len(warm_calls) < len(calls)
    assert warm_calls[0][0] == 38.0


def test_seed_steps_are_reused_not_measured_again():
    measure, calls = scripted(3.0)
    first = measure(1.0, False)
    calls.clear()
    result = search_capacity(measure, options(), seed_steps=[first])
    assert (1.0, False) not in calls and result.steps[0] is first


def test_client_overload_stops_the_search_with_a_verdict():
    measure, calls = scripted(50.0, overloaded_above=6.0)
    result = search_capacity(measure, options())
    assert result.verdict == "client_overloaded"
    assert result.capacity_scale == 4.0 and result.bracket_high == 8.0
    assert calls.count((8.0, False)) == 2  # measured once more before giving up
    assert "lower bound" in result.headline()


def test_a_passing_retry_after_client_overload_counts():
    measure, _ = scripted(3.0)
    result = search_capacity(first_measurement_of(measure, 4.0, client_overloaded=True), options())
    assert result.verdict == "ok" and 2.85 <= result.capacity_scale <= 3.15
    assert sum(1 for s in result.steps if s.scale == 4.0) == 2


def test_never_fails_up_to_the_ceiling():
    measure, _ = scripted(1e6)
    result = search_capacity(measure, options(max_scale=16))
    assert result.verdict == "above_max" and result.capacity_scale == 16 and result.bracket_high is None


def test_step_budget():
    measure, calls = scripted(3.3)
    result = search_capacity(measure, options(max_steps=4, precision=0.001))
    assert result.verdict == "max_steps" and len(calls) == 4  # no budget left to confirm either


@pytest.mark.parametrize("bad", [dict(attainment=0), dict(attainment=1.5), dict(precision=0), dict(start_scale=1e9)])
def test_bad_options(bad):
    with pytest.raises(InputError):
        options(**bad)
    with pytest.raises(InputError, match="--slo"):
        CapacityOptions(slos=())


# -- definitions -----------------------------------------------------------------------------------
def record(i, *, ttft=0.1, success=True, e2e=0.5, tokens=10):
    return RequestRecord(index=i, id=None, scheduled_s=0, send_s=0, lag_s=0, success=success, error="" if success else "x",
                         ttft_s=ttft if success else None, e2e_s=e2e, itl_s=[], prompt_tokens=5, output_tokens=tokens,
                         requested_tokens=tokens, finish_reason="length")


def test_allowed_misses_and_certain_misses():
    assert allowed_misses(20, 0.95) == 1 and allowed_misses(19, 0.95) == 0 and allowed_misses(100, 0.9) == 10
    finished = [record(0), record(1, ttft=2.0), record(2, success=False)]
    live = [InFlight(send=0.0), InFlight(send=0.0, first_output=0.5), InFlight(send=9.5)]
    # 2 finished misses + 1 in flight with no first output after 10 s (TTFT 1 s); the one that
    # already has its first token and the one sent 0.5 s ago are not certain misses
    assert certain_misses(finished, live, 10.0, SLOS) == 3
    # the running count judges each finished request once, and agrees with the full count
    from tracetune.capacity.step import MissCounter

    counter = MissCounter(SLOS)
    growing = []
    for rec in finished:
        growing.append(rec)
        assert counter(growing, live, 10.0) == certain_misses(growing, live, 10.0, SLOS)
    assert counter.judged == 3


def test_percentile_targets_count_unfinished_requests_as_misses():
    slos = parse_slos("ttft:p50<1s")
    fast = [record(i) for i in range(10)]
    assert percentile_targets_met(fast, 10, slos)
    assert not percentile_targets_met(fast[:4], 10, slos)  # 6 never finished: the median is infinite


def test_rates_and_scaling():
    reqs = [PreparedRequest(index=i, id=None, scheduled_s=2.0 + i, max_tokens=8, prompt="p") for i in range(5)]
    assert offered_rates(reqs) == (1.0, 8.0)
    fast = at_scale(reqs, 4.0)
    assert [r.scheduled_s for r in fast] == [0, 0.25, 0.5, 0.75, 1.0]
    assert offered_rates(fast) == (4.0, 32.0)
    assert [r.scheduled_s for r in at_scale(reqs, 0.5)] == [0, 2, 4, 6, 8]  # same requests, slower


# -- early abandon on a real replay loop -----------------------------------------------------------
class SlotServer:
    """An engine with `slots` concurrent requests, each `service_s` long; the rest wait in a queue:
    its capacity is slots / service_s requests per second."""

    def __init__(self, slots: int, service_s: float):
        self.slots, self.service_s = slots, service_s
        self.started = 0
        self.cancelled = 0
        self.base_url = ""
        self._ready = threading.Event()

    async def handle(self, request):
        await request.json()
        async with self._sem:
            self.started += 1
            response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await response.prepare(request)
            try:
                await asyncio.sleep(self.service_s / 2)
                await response.write(b'data: {"choices": [{"text": "a"}]}\n\n')
                await asyncio.sleep(self.service_s / 2)
                usage = {"prompt_tokens": 3, "completion_tokens": 2}
                await response.write(b'data: {"choices": [{"text": "b"}]}\n\n')
                await response.write(f"data: {json.dumps({'choices': [], 'usage': usage})}\n\ndata: [DONE]\n\n".encode())
            except (asyncio.CancelledError, ConnectionResetError):
                self.cancelled += 1  # the client hung up: an abandoned level
            return response

    def _serve(self):
        async def main():
            self._sem = asyncio.Semaphore(self.slots)
            app = web.Application()
            app.router.add_post("/v1/completions", self.handle)
            runner = web.AppRunner(app, access_log=None)
            await runner.setup()
            site = web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
            self.base_url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"
            self._stop = asyncio.Event()
            self._ready.set()
            await self._stop.wait()
            await runner.cleanup()

        self._loop = asyncio.new_event_loop()
        self._loop.run_until_complete(main())

    def __enter__(self):
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()
        self._ready.wait(10)
        return self

    def __exit__(self, *exc):
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)


@pytest.mark.slow  # levels replayed in real time (about 30 s)
def test_level_runner_finds_a_slot_servers_capacity_and_abandons_hopeless_levels():
    # 8 slots x 0.1 s = 80 req/s. The trace offers 30 req/s for 4 s (120 requests): capacity ~2.7x,
    # a little more while the queue a level builds stays under the 300 ms TTFT.
    requests = [PreparedRequest(index=i, id=None, scheduled_s=i / 30, max_tokens=2, prompt="p") for i in range(120)]
    # Levels of 4 s (the trace looped): this test is about abandoning, not about steady state.
    opts = CapacityOptions(slos=tuple(parse_slos("ttft:p99<300ms")), precision=0.25, max_scale=32, level_seconds=4,
                           level_requests=0)
    steps = []
    with SlotServer(slots=8, service_s=0.1) as server:
        runner = LevelRunner(server.base_url, "m", requests, ReplayOptions(), opts,
                             on_level=steps.append)
        t0 = time.perf_counter()
        result = runner.search()
        elapsed = time.perf_counter() - t0
    assert 2.0 <= result.capacity_scale <= 6.0, result.as_dict()
    assert result.capacity_rps == pytest.approx(result.capacity_scale * 30.0, rel=0.01)
    failed = [s for s in steps if not s.passed]
    assert failed and any(s.abandoned and s.requests < s.planned for s in failed), [s.as_dict() for s in steps]
    assert server.cancelled > 0  # what was in flight when a level was abandoned was cancelled
    assert elapsed < 60


def test_a_trace_whose_requests_all_arrive_at_once_cannot_be_searched():
    burst = [PreparedRequest(index=i, id=None, scheduled_s=3.0, max_tokens=2, prompt="p") for i in range(8)]
    runner = LevelRunner("http://127.0.0.1:9", "m", burst, ReplayOptions(), options())
    with pytest.raises(InputError, match="same moment"):
        runner.search()


def test_a_seed_level_the_client_failed_is_measured_again():
    measure, calls = scripted(3.0)
    seed = measure(1.0, False)
    seed.client_overloaded, seed.passed = True, False
    calls.clear()
    result = search_capacity(measure, options(), seed_steps=[seed])
    assert calls[0] == (1.0, False) and result.verdict == "ok" and 2.85 <= result.capacity_scale <= 3.15


def test_a_client_that_cannot_keep_up_at_the_first_level_gives_no_capacity():
    measure, _ = scripted(3.0, overloaded_above=0.5)
    seed = measure(1.0, False)
    result = search_capacity(measure, options(), seed_steps=[seed])
    assert result.capacity_scale is None and result.verdict == "client_overloaded"
    assert result.headline().startswith("capacity not measurable: the client could not keep the schedule at 1x")


def test_lag_bound():
    assert options().lag_bound_s == 0.05  # 5% of the 1 s TTFT threshold
    assert CapacityOptions(slos=tuple(parse_slos("tpot:p99<100ms"))).lag_bound_s == 0.010


def test_misses_that_do_not_depend_on_the_load_stop_the_descent():
    calls = []

    def bursty(scale, repeat):  # the same 6 of 20 requests miss at any rate
        calls.append(scale)
        return Step(scale=scale, rps=scale, output_tps=scale, attainment=0.7, passed=False, abandoned=True,
                    requests=20, planned=20, good=14, duration_s=1.0 / scale)

    result = search_capacity(bursty, options())
    assert calls == [1.0, 0.5, 0.25] and result.verdict == "load_independent" and result.capacity_scale is None
    assert "lowering the load did not help" in result.headline()


# -- early stop: a level an incumbent passes ---------------------------------------------------------
def test_a_config_below_the_prune_level_stops_after_it_fails_twice():
    measure, calls = scripted(2.0)
    result = search_capacity(measure, options(), base_rates=(2.0, 64.0), prune_at=4.0)
    assert result.verdict == "pruned"
    assert calls == [(4.0, False), (4.0, True)]  # the prune level, then its repeat: nothing else
    assert result.capacity_scale is None and result.bracket_high == 4.0
    assert result.headline().startswith("pruned: fails 4x the trace's rate (8 req/s")
    assert result.as_dict()["verdict"] == "pruned"


def test_a_config_above_the_prune_level_is_searched_as_usual():
    measure, calls = scripted(6.0)
    pruned = search_capacity(measure, options(precision=0.05), prune_at=4.0)
    assert pruned.verdict == "ok" and calls[0] == (4.0, False)
    assert 6.0 / 1.05 <= pruned.capacity_scale <= 6.0 * 1.05 < pruned.bracket_high * 1.05


def test_a_seed_level_that_already_failed_below_the_prune_level_is_only_confirmed():
    measure, calls = scripted(0.5)
    seed = measure(1.0, False)
    calls.clear()
    result = search_capacity(measure, options(), seed_steps=[seed], prune_at=3.0)
    assert result.verdict == "pruned" and result.bracket_high == 1.0
    assert calls == [(1.0, True)]


def test_a_prune_failure_the_repeat_overturns_does_not_prune():
    outcomes = iter([False, True, True])  # fails once at the prune level, then passes twice

    def measure(scale, repeat):
        passed = next(outcomes) if scale == 4.0 and len(seen) < 3 else scale <= 5.0
        seen.append((scale, repeat))
        return Step(scale=scale, rps=scale, output_tps=scale, attainment=1.0 if passed else 0.5, passed=passed,
                    abandoned=False, requests=20, planned=20, good=20 if passed else 10, duration_s=1.0, repeat=repeat)

    seen: list = []
    result = search_capacity(measure, options(precision=0.1), prune_at=4.0)
    assert result.verdict == "ok" and result.unstable
    assert 4.0 <= result.capacity_scale <= 5.0 < result.bracket_high


def test_a_capacity_result_reads_back_what_it_stored():
    """`CapacityResult.from_dict` and `Step.from_dict` invert `as_dict`: the stored JSON is the same after a
    round trip (the derived rates recomputed to the same digits), verdicts and outcomes as their enums."""
    from tracetune.capacity.step import CapacityResult, DecidedBy, Outcome, Step, Verdict

    steps = [Step(scale=1.0, rps=3.1, output_tps=310.0, attainment=1.0, passed=True, abandoned=False, requests=50,
                  planned=50, good=50, duration_s=20.0, decided_by=DecidedBy.HELD, last_third=1.0, quarters=[1.0] * 4,
                  ttft_trend=[0.001, -0.002, 0.004, 0.2]),
             Step(scale=2.0, rps=6.2, output_tps=620.0, attainment=0.4, passed=False, abandoned=True, requests=20,
                  planned=50, good=18, duration_s=4.0, decided_by=DecidedBy.MISSES,
                  parts=[{"kind": "peak", "start_s": 0.0, "end_s": 30.0, "rate_ratio": 1.4, "attainment": 0.4}],
                  trace_windows=6, attainment_bounds=[0.3, 0.5])]
    for scale, high, verdict in ((1.0, 2.0, "ok"), (None, 1.0, "load_independent"), (1.0, None, "above_max")):
        result = CapacityResult(attainment_target=0.95, precision=0.05, slos=["ttft:p99<2000ms"], steps=steps,
                                capacity_scale=scale, bracket_high=high, base_rps=3.1, base_output_tps=310.0 / 3,
                                gpus=2, mean_prompt_tokens=123.7, verdict=Verdict(verdict), search_s=31.5)
        stored = json.loads(json.dumps(result.as_dict()))
        back = CapacityResult.from_dict(stored)
        assert json.loads(json.dumps(back.as_dict())) == stored
        assert back.verdict is Verdict(verdict) and back.capacity_scale == scale
        assert back.bracket_rps() == (result.capacity_rps, None if high is None else high * 3.1)
    assert [s.outcome for s in back.steps] == [Outcome.PASS, Outcome.ABANDONED]
    assert stored["steps"][1]["outcome"] == "abandoned" and stored["verdict"] == "above_max"


def test_a_capacity_result_is_stored_in_the_order_and_types_it_always_was():
    """An export is byte for byte what an earlier tracetune wrote: the result's keys in their order (its
    rates before its levels), a level's fields then its outcome, a machine's count of cpus whole."""
    from tracetune.capacity.step import CapacityResult, Outcome, Step

    part = {"kind": "busiest", "cell": 2, "start_s": 60.0, "end_s": 90.0, "requests": 40, "rate_ratio": 2.0,
            "tokens_ratio": 2.1, "attainment": 0.9, "good": 36, "planned": 40, "sent": 40, "outcome": Outcome.FAIL}
    step = Step(scale=1.0, rps=2.0, output_tps=20.0, attainment=0.9, passed=False, abandoned=False, requests=40,
                planned=40, good=36, duration_s=30.0, parts=[part],
                machine={"seconds": 30.0, "cpus": 2, "engine": 1.5, "client": 0.2, "others": 0.3, "steal": 0.0,
                         "idle": 0.0})
    result = CapacityResult(slos=["ttft:p99<2000ms"], steps=[step], capacity_scale=None, bracket_high=1.0,
                            base_rps=2.0, base_output_tps=20.0, usd_per_1m_output_tokens=1.5)
    text = json.dumps(result.as_dict())
    assert list(json.loads(text)) == [
        "capacity_scale", "capacity_rps", "capacity_output_tps", "capacity_rps_per_gpu", "bracket_scale",
        "bracket_rps", "gpus", "attainment_target", "precision", "slo", "unstable", "verdict", "base_rps",
        "base_output_tps", "capacity_input_tps", "search_s", "replay_s", "steps", "usd_per_1m_output_tokens"]
    stored = json.loads(text)["steps"][0]
    assert list(stored)[:3] == ["scale", "rps", "output_tps"] and list(stored)[-1] == "outcome"
    assert '"cpus": 2,' in text and '"capacity_scale": 0.0,' in text and '"bracket_scale": [0.0, 1.0]' in text
    back = CapacityResult.from_dict(json.loads(text))
    assert json.dumps(back.as_dict()) == text
    assert back.steps[0].parts is not None and back.steps[0].parts[0]["outcome"] is Outcome.FAIL


def test_a_capacity_result_of_an_older_tracetune_reads_with_defaults():
    """An older study's result: steps without the sustain fields, no input rate, no base rate (derived from the
    capacity it offered), no gpus or verdict."""
    from tracetune.capacity.step import CapacityResult, Outcome, Verdict

    old = {"capacity_scale": 2.0, "capacity_rps": 5.0, "bracket_scale": [2.0, 2.5], "bracket_rps": [5.0, 6.25],
           "attainment_target": 0.95, "precision": 0.05, "slo": ["ttft:p99<2000ms"],
           "steps": [{"scale": 2.0, "rps": 5.0, "attainment": 0.97, "passed": True, "abandoned": False,
                      "requests": 50, "planned": 50, "duration_s": 10.0},
                     {"scale": 2.5, "rps": 6.25, "attainment": 0.5, "passed": False, "abandoned": False}]}
    cap = CapacityResult.from_dict(old)
    assert cap.base_rps == 2.5 and cap.gpus == 1 and cap.verdict is Verdict.OK and not cap.unstable
    assert cap.bracket_rps() == (5.0, 6.25) and cap.bracket_text() == "[5, 6.25] req/s"
    assert cap.mean_prompt_tokens == 0.0 and cap.usd_per_1m_output_tokens is None
    assert [s.outcome for s in cap.steps] == [Outcome.PASS, Outcome.FAIL]
    assert cap.steps[1].requests == 0 and cap.steps[0].decided_by == "" and cap.steps[0].parts is None
    assert CapacityResult.from_dict({**old, "capacity_scale": 0.0}).capacity_scale is None
