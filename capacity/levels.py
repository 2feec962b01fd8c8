"""Capacity on a real engine: load levels replayed against one running engine (warm-up once, the engine
drained and its prefix cache emptied before each level, each level as long as `capacity.sustain` says,
the trace looped where it is shorter, a level abandoned once its outcome is certain), driven by the
search of `capacity.step`."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Protocol

import numpy as np

from tracetune.capacity import segments, sustain
from tracetune.capacity.parts import PartOutcome, judge_parts, miss_budget
from tracetune.capacity.response import wilson_top
from tracetune.capacity.search import search_capacity
from tracetune.capacity.step import (
    CUT_ERROR,
    CUT_MISS_ERROR,
    CapacityOptions,
    CapacityResult,
    DecidedBy,
    MissCounter,
    MissedSLO,
    Step,
    allowed_misses,
    at_scale,
    judge,
    offered_rates,
    percentile_targets_met,
)
from tracetune.errors import InputError
from tracetune.replay.send import MetricsSource, replay
from tracetune.replay.types import InFlight, PreparedRequest, ReplayOptions, ReplayResult, RequestRecord, StopWhen

if TYPE_CHECKING:
    from tracetune.replay.client_procs import ClientPool
    from tracetune.replay.machine import Share, Watch


class LevelEngine(MetricsSource, Protocol):
    """An engine as the levels use it: counters to wait on, and a prefix cache to empty
    (`engine_adapter.base.Engine` meets it)."""

    def reset_prefix_cache(self) -> None: ...


def machine_watch(options: CapacityOptions, process_group: int | None, engine_cores: int, *,
                  watched: bool = True) -> Watch | None:
    """The levels' account of this machine's cores (`replay.machine.Watch`) for an engine tracetune started
    (its process group), or None: the check is off, the engine is not ours (its processes cannot be told
    from other work) or its speed does not depend on the cores (`watched` False: a simulator)."""
    from tracetune.replay.machine import Watch

    if not options.machine_check or not watched or process_group is None:
        return None
    return Watch(process_group, engine_cores)


def settle(engine: LevelEngine, *, reset_prefix_cache: bool, timeout_s: float = 30.0) -> None:
    """Before a level: wait until the engine runs and queues nothing (an abandoned level leaves
    aborted requests behind for a moment), then empty its prefix cache, so every level starts
    alike. Engines without metrics are not waited for."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            m = engine.metrics()
        except Exception:  # no /metrics (an endpoint we do not run): nothing to wait for
            break
        if m.requests_running + m.requests_waiting == 0:
            break
        time.sleep(0.1)
    if reset_prefix_cache:
        engine.reset_prefix_cache()


@dataclasses.dataclass
class LevelRunner:
    """Replays load levels against one running engine: warm-up once, the prefix cache reset (and
    the engine drained) before each level, early abandon when the outcome is certain."""

    base_url: str
    model: str
    requests: Sequence[PreparedRequest]  # the measured slice at k = 1 (same at every level), warm-up excluded
    replay_options: ReplayOptions
    options: CapacityOptions
    warmup: Sequence[PreparedRequest] = ()  # sent once, before the first level, unmeasured
    engine: LevelEngine | None = None  # supplies metrics() for the engine's counters of each level
    headers: dict[str, str] | None = None
    before_level: Callable[[], None] | None = None
    on_level: Callable[[Step], None] | None = None
    on_progress: Callable[[int, int, int], None] | None = None
    on_record: Callable[[float, RequestRecord], None] | None = None  # (level, a request's record) as each finishes
    results: dict[float, ReplayResult] = dataclasses.field(default_factory=dict)  # one replay per level
    measured: list[tuple[Step, ReplayResult]] = dataclasses.field(default_factory=list)  # every replay, in order
    client_procs: int | None = 1  # client processes per level; None: enough for the level's rate
    engine_cores: int = 0  # cores the engine needs on this machine (left out of the client's)
    lifetime_s: float = 0.0  # a request's lifetime the windows are sized for (the SLO's bound, or measured)
    send: Callable[..., ReplayResult] = replay  # replays one schedule (`replay.send.replay`'s signature)
    # Accounts the machine's cores over each replay (`replay.machine`): a level other work took the
    # engine's cores from is marked (`Step.machine_busy`), and the next level waits for quiet. None: not watched.
    watch: Watch | None = None
    _spans: list[Share] = dataclasses.field(default_factory=list, init=False, repr=False)
    _pool: ClientPool | None = dataclasses.field(default=None, init=False, repr=False)
    _warmed: bool = dataclasses.field(default=False, init=False, repr=False)

    def _warmup_once(self) -> list[PreparedRequest]:
        """The warm-up requests before the first replay of this runner, none after."""
        warmup = [] if self._warmed else list(self.warmup)
        self._warmed = True
        return warmup

    def __post_init__(self) -> None:
        bound = sustain.lifetime_bound(self.options.slos, [r.max_tokens for r in self.requests])
        self.lifetime_s = max(self.lifetime_s, bound)

    def _procs(self, requests: Sequence[PreparedRequest], repeat: bool) -> int:
        """Client processes for a level; a level the client could not keep up with is measured
        again with twice as many, where the machine has the cores."""
        from tracetune.replay.client_procs import auto_client_procs, more_client_procs

        procs = self.client_procs or auto_client_procs(requests, self.engine_cores)
        last = self.measured[-1][0] if self.measured else None
        if repeat and last is not None and last.client_overloaded and not last.passed:
            procs = max(procs, more_client_procs(last.client_procs, self.engine_cores))
        return max(procs, 1)

    def _pool_of(self, procs: int) -> ClientPool | None:
        """A client pool of `procs` processes (kept from level to level), or None for one process."""
        from tracetune.replay.client_procs import ClientPool

        if procs <= 1:
            return None
        if self._pool is None or len(self._pool) != procs:
            self.close()
            self._pool = ClientPool(procs)
        return self._pool

    def close(self) -> None:
        if self._pool is not None:
            self._pool.close()
            self._pool = None

    def window(self, scale: float) -> sustain.Window:
        """How long level `scale` lasts and how many passes of the trace fill it."""
        o = self.options
        return sustain.plan(self.requests, scale, seconds=o.level_seconds, lifetimes=o.level_lifetimes,
                            min_requests=o.level_requests, lifetime_s=self.lifetime_s)

    def describe(self) -> str:
        """The window rule this runner applies, in a sentence or two."""
        o = self.options
        whole = self.windows(o.start_scale) is None
        text = sustain.describe(self.requests, seconds=o.level_seconds, lifetimes=o.level_lifetimes,
                                min_requests=o.level_requests, lifetime_s=self.lifetime_s, looped=whole)
        return text if whole else f"{text}; {segments.describe_rule(len(self.requests))}"

    def windows(self, scale: float) -> segments.Windows | None:
        """The trace cut into windows of level `scale`'s length (`capacity.segments`), or None when the
        level replays the whole trace: it is no longer than a few windows, or this runner replays the
        whole trace at every level."""
        if self.options.whole_trace:
            return None
        o = self.options
        need_s = sustain.needed_seconds(self.requests, scale, seconds=o.level_seconds, lifetimes=o.level_lifetimes,
                                        min_requests=o.level_requests, lifetime_s=self.lifetime_s)
        return segments.cut(self.requests, need_s * scale)

    def level(self, scale: float, repeat: bool = False, *, abandon: bool | None = None,
              end_on_slo_miss: bool = False) -> Step:
        """Measure level `scale` over its window: the whole trace (looped where shorter), or the
        windows of it `capacity.segments` picks. A passing level whose requests lived longer than the
        window was sized for (the SLO bounds no lifetime, or the engine is slower) is measured once
        more, over a window sized by its measured median E2E latency. `end_on_slo_miss` (a whole-trace
        level not abandoned otherwise): it ends once a TTFT or E2E target is certainly missed
        (`capacity.step.MissedSLO`), the requests in flight cut and recorded with their life so far."""
        waited = self._wait_quiet()
        self._spans = []
        windows = self.windows(scale)
        if windows is None:
            window = self.window(scale)
            step, result = self._replay_level(scale, window, repeat, abandon, end_on_slo_miss)
            window_s = window.seconds
        else:
            step, result = self._replay_parts(scale, windows, repeat, abandon)
            window_s = windows.length_s / scale
        lifetime = median_e2e(result.records)
        short = step.passed and self.options.level_lifetimes * lifetime > window_s * (1 + 1e-6)
        if lifetime > self.lifetime_s and step.passed:
            self.lifetime_s = lifetime
        if short:
            step.passed, step.decided_by = False, DecidedBy.WINDOW_SHORT
        self._judge_machine(step, waited)
        self._record(scale, step, result)
        if short:
            step = self.level(scale, repeat, abandon=abandon, end_on_slo_miss=end_on_slo_miss)
        return step

    def _replay_level(self, scale: float, window: sustain.Window, repeat: bool, abandon: bool | None,
                      end_on_slo_miss: bool = False) -> tuple[Step, ReplayResult]:
        requests = at_scale(sustain.looped(self.requests, window.passes), scale)
        last_from = requests[-1].scheduled_s * (1 - sustain.LAST_PART)
        budget = allowed_misses(len(requests), self.options.attainment)
        last_budget = allowed_misses(sum(r.scheduled_s >= last_from for r in requests), self.options.attainment)
        use_abandon = self.options.abandon if abandon is None else abandon
        misses = MissCounter(self.options.slos, last_from_s=last_from)
        why = [DecidedBy.MISSES]
        decided = Ended(DecidedPass(self.options, len(requests), budget, last_budget, misses))
        slo_rule = MissedSLO(self.options.slos, len(requests))
        missed = Ended(slo_rule)
        rising = Ended(sustain.QueueRising(len(requests), requests[-1].scheduled_s, offered_rates(requests)[0]))

        def certain(finished: Sequence[RequestRecord], in_flight: Sequence[InFlight], now: float) -> bool:
            if misses(finished, in_flight, now) > budget:
                return True
            if misses.last > last_budget:
                why[0] = DecidedBy.LAST_THIRD_MISSES
                return True
            return self.options.ends_decided and (rising(finished, in_flight, now) or decided(finished, in_flight, now))

        def slo_missed(finished: Sequence[RequestRecord], in_flight: Sequence[InFlight], now: float) -> bool:
            # Certain, and a clear fail (`capacity.response.repeat_rule`), so that no repeat is needed.
            planned, why[0] = len(requests), DecidedBy.SLO_MISSED
            most = (planned - misses(finished, in_flight, now)) / planned
            return wilson_top(most, planned) < self.options.attainment and missed(finished, in_flight, now)

        stop = certain if use_abandon else slo_missed if end_on_slo_miss else None
        result, duration, procs = self._send(scale, requests, repeat, stop)
        cut, errors = 0, {decided: CUT_ERROR, missed: CUT_MISS_ERROR, rising: sustain.CUT_QUEUE_ERROR}
        ended = next((e for e in errors if e.at is not None), None) if result.abandoned else None
        if ended is not None:
            result, cut = with_cut(result, requests, ended.in_flight, ended.at, errors[ended])
            if self.on_record is not None:  # the requests cut are recorded as the others were
                for record in result.records[-cut:] if cut else []:
                    self.on_record(scale, record)
            # A decided pass, or a queue certainly rising, is judged as a level that ran to its end.
            result.abandoned = ended is missed
        step = judge(result, scale, requests, self.options, duration, repeat=repeat,
                     misses_at_stop=misses.count, abandoned_by=why[0], passes=window.passes,
                     ended_by=DecidedBy.QUEUE_RISING if ended is rising else None)
        step.client_procs, step.cut = procs, cut
        if ended is missed:
            step.ended = slo_rule.said
        elif ended is rising:
            step.ended = "its queue certainly rising"
        return step, result

    def _send(self, scale: float, requests: Sequence[PreparedRequest], repeat: bool,
              stop_when: StopWhen | None) -> tuple[ReplayResult, float, int]:
        """One replay of level `scale`'s schedule on a settled engine (the warm-up before the first):
        its result, wall seconds and client processes."""
        warmup = self._warmup_once()
        if self.before_level is not None:
            self.before_level()
        opts = dataclasses.replace(self.replay_options, warmup_requests=len(warmup), max_requests=None,
                                   max_duration_s=None, time_scale=1.0)
        procs = self._procs(requests, repeat)
        t0 = time.perf_counter()
        on_record = self.on_record
        if self.watch is not None:
            self.watch.start()
        result = self.send(self.base_url, self.model, [*warmup, *requests], opts, engine=self.engine,
                           headers=self.headers, on_progress=self.on_progress, stop_when=stop_when,
                           pool=self._pool_of(procs),
                           on_record=None if on_record is None else lambda r: on_record(scale, r))
        span = self.watch.stop() if self.watch is not None else None
        if span is not None:
            self._spans.append(span)
        return result, time.perf_counter() - t0, procs

    def _wait_quiet(self) -> float:
        """After a level the machine was busy for: wait until it is quiet (`replay.machine.Watch.wait_quiet`);
        the seconds waited."""
        last = self.measured[-1][0] if self.measured else None
        if self.watch is None or last is None or not last.machine_busy:
            return 0.0
        return self.watch.wait_quiet()

    def _judge_machine(self, step: Step, waited_s: float) -> None:
        """The level's machine: its busiest replay's cores, and whether other work took the engine's."""
        from tracetune.replay.machine import busy_reason

        step.quiet_wait_s = waited_s
        if self.watch is None or not self._spans:
            return
        busiest = max(self._spans, key=lambda span: span.others)
        step.machine = busiest.as_dict()
        step.machine_busy = busy_reason(busiest, self.watch.engine_cores)

    def _replay_parts(self, scale: float, windows: segments.Windows, repeat: bool,
                      abandon: bool | None) -> tuple[Step, ReplayResult]:
        """Replay windows of the trace one after another (`capacity.segments`: the busiest first, then
        by load) until the whole trace's attainment bounds decide the level, and judge them as one
        (`capacity.parts.judge_parts`). Abandoned once the misses certain in a window leave the whole
        trace's high bound short of the target."""
        use_abandon = self.options.abandon if abandon is None else abandon
        target = self.options.attainment
        measured: dict[int, float] = {}
        done: list[PartOutcome] = []
        results: list[ReplayResult] = []
        queue = segments.first_parts(windows)
        undecided = None  # the windows still to learn about (None: all)
        while len(done) < segments.MAX_PARTS:
            part = queue.pop(0) if queue else segments.next_part(windows, measured, undecided)
            if part is None:
                break
            budget = miss_budget(windows, measured, part.cell, part.requests, target) if use_abandon else None
            outcome, result = self._replay_part(scale, part, segments.LEAD_IN * windows.length_s, repeat, budget)
            done.append(outcome)
            results.append(result)
            measured[part.cell] = outcome.step.attainment
            if outcome.step.abandoned:
                break
            decided, undecided = segments.decision(windows, measured, target)
            if not queue and decided:
                break
        abandoned = any(d.step.abandoned for d in done)
        step = judge_parts(scale, done, windows, self.options, base_rates=self.base_rates, abandoned=abandoned)
        step.repeat = repeat
        step.client_procs = max((d.step.client_procs for d in done), default=1)
        merged = ReplayResult(records=[r for d in done for r in d.records],
                              duration_s=sum(r.duration_s for r in results), options=results[0].options,
                              abandoned=abandoned, sent=step.requests, planned=step.planned)
        return step, merged

    def _replay_part(self, scale: float, part: segments.Part, lead_in_s: float, repeat: bool,
                     budget: int | None) -> tuple[PartOutcome, ReplayResult]:
        """One window after its lead-in, abandoned when more than `budget` of its requests certainly
        missed; its records and requests with times from the window's start."""
        schedule, n_lead = segments.schedule(self.requests, part, lead_in_s)
        requests = at_scale(schedule, scale)
        start = requests[n_lead].scheduled_s if n_lead < len(requests) else 0.0
        own = [dataclasses.replace(r, scheduled_s=r.scheduled_s - start) for r in requests[n_lead:]]
        misses = MissCounter(self.options.slos, last_from_s=start)

        def certain(finished: Sequence[RequestRecord], in_flight: Sequence[InFlight], now: float) -> bool:
            misses(finished, in_flight, now)
            return budget is not None and misses.last > budget

        result, duration, procs = self._send(scale, requests, repeat, certain if budget is not None else None)
        ids = {r.index for r in own}
        records = [dataclasses.replace(r, scheduled_s=r.scheduled_s - start, send_s=r.send_s - start)
                   for r in result.records if r.index in ids]
        sent_lead = sum(r.index not in ids for r in result.records)
        sent = max((result.sent or len(result.records)) - sent_lead, len(records))
        mine = dataclasses.replace(result, records=records, sent=sent, planned=len(own))
        step = judge(mine, scale, own, self.options, duration, repeat=repeat, misses_at_stop=misses.last)
        step.client_procs = procs
        return PartOutcome(part, step, records, own), result

    def _record(self, scale: float, step: Step, result: ReplayResult) -> None:
        if scale not in self.results or not step.not_counted:
            self.results[scale] = result  # the latest replay of this level the client kept up with
        self.measured.append((step, result))
        if self.on_level is not None:
            self.on_level(step)

    @property
    def base_rates(self) -> tuple[float, float]:
        """(requests/s, output tokens/s) offered at the trace's own rate (k = 1)."""
        return offered_rates(self.requests)

    def search(self, *, seed_steps: Sequence[Step] = (), gpus: int = 1,
               prune_at: float | None = None, seeds_only: bool = False) -> CapacityResult:
        if len(self.requests) < 2 or self.requests[-1].scheduled_s <= self.requests[0].scheduled_s:
            raise InputError("every measured request of the trace arrives at the same moment, so no load level "
                             "differs from another: a capacity search needs a trace with arrival times spread "
                             "over time (or more requests: --max-requests / --max-duration)")
        try:
            result = search_capacity(self.level, self.options, seed_steps=seed_steps, gpus=gpus,
                                     base_rates=self.base_rates, prune_at=prune_at, seeds_only=seeds_only)
        finally:
            self.close()
        prompts = [r.prompt_tokens for res in self.results.values() for r in res.records if r.prompt_tokens]
        result.mean_prompt_tokens = float(np.mean(prompts)) if prompts else 0.0
        return result


class DecidedPass:
    """A level's pass decided before its last requests finish (`capacity.sustain`, "A level that
    ends when decided"): every request was sent, every one in flight has its first token, and the
    level passes its attainment, last-third and percentile targets even if every request in flight
    misses. The requests still in flight then no longer hold the level open: they are cut, and
    recorded as misses with their first token and the life they had (a lower bound of their E2E),
    so the held-to-the-end tests read the same queue and TTFT they would have."""

    def __init__(self, options: CapacityOptions, planned: int, budget: int, last_budget: int,
                 misses: MissCounter) -> None:
        self.options, self.planned, self.budget, self.last_budget = options, planned, budget, last_budget
        self.misses = misses

    def __call__(self, finished: Sequence[RequestRecord], in_flight: Sequence[InFlight], now: float) -> bool:
        if len(finished) + len(in_flight) < self.planned or any(f.first_output is None for f in in_flight):
            return False
        last_from = self.misses.last_from_s
        late_last = self.misses.last - self.misses.finished_last  # late in flight, in the last third
        late = self.misses.count - self.misses.finished_misses
        if self.misses.count + len(in_flight) - late > self.budget:
            return False
        if self.misses.last + sum(f.scheduled_s >= last_from for f in in_flight) - late_last > self.last_budget:
            return False
        return percentile_targets_met(finished, self.planned, self.options.slos)


class Ended:
    """A stop rule (`StopWhen`: `DecidedPass`, `MissedSLO`, `QueueRising`) that keeps the clock reading it stopped at
    and what was in flight then (cut: `with_cut`)."""

    def __init__(self, check: DecidedPass | MissedSLO | sustain.QueueRising) -> None:
        self.check = check
        self.at: float | None = None
        self.in_flight: list[InFlight] = []

    def __call__(self, finished: Sequence[RequestRecord], in_flight: Sequence[InFlight], now: float) -> bool:
        if not self.check(finished, in_flight, now):
            return False
        self.at, self.in_flight = now, list(in_flight)
        return True


def with_cut(result: ReplayResult, requests: Sequence[PreparedRequest], in_flight: Sequence[InFlight],
             at: float | None, error: str) -> tuple[ReplayResult, int]:
    """The replay with the requests `in_flight` when it stopped (at clock reading `at`) recorded as
    cut (`error`, a `CUT_PREFIX` one: a miss, not a failure); and how many."""
    assert at is not None
    done = {r.index for r in result.records}
    unfinished: dict[float, list[PreparedRequest]] = {}
    for r in requests:
        if r.index not in done:
            unfinished.setdefault(r.scheduled_s, []).append(r)

    def request_of(live: InFlight) -> PreparedRequest | None:
        waiting = unfinished.get(live.scheduled_s)
        return waiting.pop(0) if waiting else None

    cut = [_cut_record(f, request_of(f), at, error) for f in in_flight]
    records = [*result.records, *cut]
    return dataclasses.replace(result, records=records, sent=len(records)), len(cut)


def _cut_record(live: InFlight, request: PreparedRequest | None, now: float, error: str) -> RequestRecord:
    """A request in flight when its level's outcome was certain: a miss that says why it was cut, with
    its first token and its life so far, sent when it was (`InFlight.sent_s`)."""
    first = None if live.first_output is None else live.first_output - live.send
    return RequestRecord(index=request.index if request else -1, id=request.id if request else None,
                         scheduled_s=live.scheduled_s, send_s=live.sent_s, lag_s=live.sent_s - live.scheduled_s,
                         success=False,
                         error=error, ttft_s=first, e2e_s=now - live.send, itl_s=[], prompt_tokens=None,
                         output_tokens=None, requested_tokens=request.max_tokens if request else 0,
                         finish_reason=None)


def median_e2e(records: Sequence[RequestRecord]) -> float:
    """The median E2E latency of a level's successful requests (0 when none succeeded)."""
    done = [r.e2e_s for r in records if r.success]
    return float(np.median(done)) if done else 0.0
