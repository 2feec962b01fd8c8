"""A serving engine whose latency is a known queueing model, simulated in virtual time: `slots`
requests served at once, first come first served; a request's first token comes `ttft_s` after it
gets a slot, then one token every `tpot_s` (times 1 + `alpha` per other request holding a slot;
0 here). With it a capacity over a one-hour trace is computed in seconds, so the whole trace's
truth can be set beside what a level replaying parts of it predicts.

The model is the simulated engine's (`tracetune.engine_adapter.sim.model.SimModel`, whose server
`tune --engine sim` starts); `QueueModel` gives it the benchmarks' defaults (8 slots, 20 ms to the
first token, 5 ms a token) and `send`, which has the signature of `replay.send.replay` and returns
what a replay of the same schedule against such a server would record (`capacity.virtual`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from tracetune.capacity.virtual import CHECK_EVERY, VirtualSend
from tracetune.engine_adapter.sim.model import SimModel
from tracetune.replay.types import PreparedRequest, ReplayOptions, ReplayResult, StopWhen

__all__ = ["CHECK_EVERY", "QueueModel"]


@dataclasses.dataclass(frozen=True)
class QueueModel(SimModel):
    slots: int = 8
    ttft_s: float = 0.020
    tpot_s: float = 0.005

    def send(self, base_url: str, model: str, requests: Sequence[PreparedRequest], options: ReplayOptions,
             *, stop_when: StopWhen | None = None, **_: object) -> ReplayResult:
        return VirtualSend(self)(base_url, model, requests, options, stop_when=stop_when)
