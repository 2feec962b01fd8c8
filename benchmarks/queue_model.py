"""A serving engine whose latency is a known queueing model, simulated in virtual time: `slots`
requests served at once, first come first served; a request's first token comes `ttft_s` after it
gets a slot, then one token every `tpot_s`. With it a capacity over a one-hour trace is computed in
seconds, so the whole trace's truth can be set beside what a level replaying parts of it predicts.

`QueueModel.send` has the signature of `replay.send.replay` and returns what a replay of the same
schedule against such a server would record (its `duration_s` is the wall time the replay would
take), honouring `stop_when` as the real client does (checked as requests finish).
"""

from __future__ import annotations

import dataclasses
import heapq
from collections.abc import Sequence
from typing import Any

from tracetune.replay.types import InFlight, PreparedRequest, ReplayOptions, ReplayResult, RequestRecord

CHECK_EVERY = 25  # finished requests between two calls of stop_when


@dataclasses.dataclass(frozen=True)
class QueueModel:
    slots: int = 8
    ttft_s: float = 0.020
    tpot_s: float = 0.005

    def times(self, requests: Sequence[PreparedRequest]) -> list[tuple[float, float, float]]:
        """(arrival, first token, end) of each request, in schedule order."""
        free = [0.0] * self.slots
        out = []
        for r in requests:
            start = max(r.scheduled_s, heapq.heappop(free))
            first = start + self.ttft_s
            end = first + self.tpot_s * max(r.max_tokens - 1, 0)
            heapq.heappush(free, end)
            out.append((r.scheduled_s, first, end))
        return out

    def send(self, base_url: str, model: str, requests: Sequence[PreparedRequest], options: ReplayOptions,
             *, stop_when: Any = None, **_: Any) -> ReplayResult:
        warm = options.warmup_requests
        measured = list(requests[warm:])
        times = self.times(measured)
        order = sorted(range(len(measured)), key=lambda i: times[i][2])
        finished: list[RequestRecord] = []
        stop_at = None
        for done, i in enumerate(order, 1):
            finished.append(_record(measured[i], *times[i]))
            if stop_when is not None and done % CHECK_EVERY == 0:
                now = times[i][2]
                live = [InFlight(send=a, first_output=f if f <= now else None, scheduled_s=a)
                        for a, f, e in times if a <= now < e]
                if stop_when(finished, live, now):
                    stop_at = now
                    break
        if stop_at is None:
            duration = max((e for _, _, e in times), default=0.0)
            return ReplayResult(records=finished, duration_s=duration, options=options, sent=len(measured),
                                planned=len(measured))
        sent = sum(a <= stop_at for a, _, _ in times)
        return ReplayResult(records=finished, duration_s=stop_at, options=options, abandoned=True, sent=sent,
                            planned=len(measured))


def _record(r: PreparedRequest, arrival: float, first: float, end: float) -> RequestRecord:
    return RequestRecord(index=r.index, id=r.id, scheduled_s=r.scheduled_s, send_s=arrival, lag_s=0.0, success=True,
                         error="", ttft_s=first - arrival, e2e_s=end - arrival, itl_s=[],
                         prompt_tokens=int(r.input_tokens), output_tokens=r.max_tokens,
                         requested_tokens=r.max_tokens, finish_reason="length")
