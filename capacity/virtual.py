"""Capacity against a timing model in virtual time: a replay of a schedule as a perfectly punctual
server of that model would serve it (`VirtualSend`, with `replay.send.replay`'s signature, for
`LevelRunner.send`), and the whole trace's true capacity under tune's own level rules
(`true_capacity`): the highest load whose whole-trace replay passes, found to `precision`. A
one-hour trace's truth takes seconds. The model is any with `times` (the simulated engine's
`engine_adapter.sim.model.SimModel`); benchmarks set the truth beside what a level replaying parts
of the trace, or a study on the live server, found."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Protocol

from tracetune.capacity.levels import LevelRunner
from tracetune.capacity.step import CapacityOptions
from tracetune.replay.types import InFlight, PreparedRequest, ReplayOptions, ReplayResult, RequestRecord, StopWhen

CHECK_EVERY = 25  # finished requests between two calls of stop_when


class TimingModel(Protocol):
    """A server's latency as a model: (arrival, first token, end) of each request of a schedule."""

    def times(self, requests: Sequence[PreparedRequest]) -> list[tuple[float, float, float]]: ...


@dataclasses.dataclass(frozen=True)
class VirtualSend:
    """What a replay of a schedule against a server of `model` records: every request succeeds with
    its `max_tokens` tokens, its duration is the wall time the replay would take, and `stop_when`
    is honoured as the real client honours it (checked as requests finish)."""

    model: TimingModel

    def __call__(self, base_url: str, model: str, requests: Sequence[PreparedRequest], options: ReplayOptions,
                 *, stop_when: StopWhen | None = None, **_: object) -> ReplayResult:
        measured = list(requests[options.warmup_requests:])
        times = self.model.times(measured)
        finished: list[RequestRecord] = []
        last_arrival = max((a for a, _, _ in times), default=0.0)
        for done, i in enumerate(sorted(range(len(measured)), key=lambda i: times[i][2]), 1):
            finished.append(_record(measured[i], *times[i]))
            # Every few finishes, and at each once every request arrived (a level's tail, where a
            # pass may be decided with the last requests in flight).
            if stop_when is not None and (done % CHECK_EVERY == 0 or times[i][2] >= last_arrival):
                now = times[i][2]
                live = [InFlight(send=a, first_output=f if f <= now else None, scheduled_s=a)
                        for a, f, e in times if a <= now < e]
                if stop_when(finished, live, now):
                    sent = sum(a <= now for a, _, _ in times)
                    return ReplayResult(records=finished, duration_s=now, options=options, abandoned=True, sent=sent,
                                        planned=len(measured))
        duration = max((e for _, _, e in times), default=0.0)
        return ReplayResult(records=finished, duration_s=duration, options=options, sent=len(measured),
                            planned=len(measured))


def _record(r: PreparedRequest, arrival: float, first: float, end: float) -> RequestRecord:
    return RequestRecord(index=r.index, id=r.id, scheduled_s=r.scheduled_s, send_s=arrival, lag_s=0.0, success=True,
                         error="", ttft_s=first - arrival, e2e_s=end - arrival, itl_s=[],
                         prompt_tokens=int(r.input_tokens), output_tokens=r.max_tokens,
                         requested_tokens=r.max_tokens, finish_reason="length")


@dataclasses.dataclass(frozen=True)
class TrueCapacity:
    """The whole trace's capacity on a model: the highest passing load (times the trace's rate; 0
    when not even the lowest level passes) and the trace's own rate, requests/s."""

    scale: float
    base_rps: float

    @property
    def rps(self) -> float:
        return self.scale * self.base_rps


def true_capacity(requests: Sequence[PreparedRequest], options: CapacityOptions, model: TimingModel, *,
                  replay_options: ReplayOptions | None = None, precision: float = 0.01) -> TrueCapacity:
    """The highest load k (the trace's arrival times divided by k) whose whole-trace replay on `model`
    passes `options`' rules (SLOs, attainment, the sustained-level checks), found by tune's own search
    to `precision`, unconfirmed (a virtual replay repeats exactly)."""
    rules = dataclasses.replace(options, precision=precision, confirm=False, whole_trace=True, start_scale=1.0)
    runner = LevelRunner("http://virtual", "model", requests, replay_options or ReplayOptions(), rules,
                         send=VirtualSend(model))
    result = runner.search()
    return TrueCapacity(scale=result.capacity_scale or 0.0, base_rps=runner.base_rates[0])
