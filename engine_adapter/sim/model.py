"""The simulated engine's truth, defined once: a queueing model of its latency (`SimModel`, run by
`Core`) and the synthetic quality loss of each precision (`PRECISIONS`).

`slots` requests are served at once, first come first served. A request that gets a slot has its
first token `ttft_s` later; after it, every request decoding advances one token per
`tpot_s * (1 + alpha * (busy - 1))` seconds, `busy` being the requests holding a slot (prefilling
or decoding): with `alpha` > 0 a fuller batch decodes every request more slowly, as real engines
do. A request of n tokens frees its slot when its n-th token is out.

`Core` is that model as a state advanced in time: the simulated server (`server.py`) advances it to
the wall clock as requests arrive and streams each request's tokens as the core says they are out;
`SimModel.times` runs the same core over a whole schedule in virtual time, which is what a replay
against a perfectly punctual server would record (`capacity.virtual` turns it into a replay and the
whole trace's true capacity). Every decoding request advances at one shared rate, so the core keeps
one progress count for all of them and its cost grows with the requests, not their tokens.
"""

from __future__ import annotations

import collections
import dataclasses
import heapq
import math
from collections.abc import Sequence
from typing import Protocol

# (arrival, first token, end) of one request, in seconds on the model's clock.
Times = tuple[float, float, float]


@dataclasses.dataclass(frozen=True)
class Precision:
    """One precision the simulated engine serves in: how much faster it runs than bf16 (its TTFT and
    TPOT are multiplied by `speed`) and what it costs in quality (mean NLL increase per token, nats)."""

    speed: float
    loss_nats: float

    @property
    def ppl_change(self) -> float:
        """The perplexity change its loss is (+0.4% for 0.004 nats a token)."""
        return math.expm1(self.loss_nats)


# bf16 is the reference (no loss); fp8 is within the default gate (+1% perplexity), int4 is not.
PRECISIONS: dict[str, Precision] = {
    "bf16": Precision(speed=1.0, loss_nats=0.0),
    "fp8": Precision(speed=0.7, loss_nats=0.004),
    "int4": Precision(speed=0.5, loss_nats=0.025),
}


class Timed(Protocol):
    """What the model reads of a request: when it arrives and how many tokens it generates
    (`replay.types.PreparedRequest` meets it)."""

    @property
    def scheduled_s(self) -> float: ...

    @property
    def max_tokens(self) -> int: ...


@dataclasses.dataclass(frozen=True)
class SimModel:
    """The queueing model (the module's docstring): slots, seconds to the first token, seconds a token
    with one request decoding, and the slow-down per other request holding a slot."""

    slots: int = 8
    ttft_s: float = 0.05
    tpot_s: float = 0.01
    alpha: float = 0.0

    def tpot_at(self, busy: int) -> float:
        """Seconds a token while `busy` requests hold a slot."""
        return self.tpot_s * (1.0 + self.alpha * max(busy - 1, 0))

    def times(self, requests: Sequence[Timed]) -> list[Times]:
        """(arrival, first token, end) of each request, in the order given (served in arrival order)."""
        core = Core(self)
        for i in sorted(range(len(requests)), key=lambda i: requests[i].scheduled_s):
            core.arrive(requests[i].scheduled_s, i, requests[i].max_tokens)
        core.advance(math.inf)
        return [core.times(i) for i in range(len(requests))]


@dataclasses.dataclass
class _Request:
    arrival: float
    tokens: int
    first: float | None = None
    end: float | None = None
    progress_at_first: float = 0.0  # the core's progress when its first token came out


class Core:
    """The model as a state: requests waiting, prefilling and decoding at time `now`. Arrivals must
    come in time order (`arrive` advances to the arrival first); a request is kept, finished or not,
    until `forget`."""

    def __init__(self, model: SimModel) -> None:
        self.model = model
        self.now = 0.0
        self.progress = 0.0  # tokens each decoding request has advanced since the start
        self.requests: dict[int, _Request] = {}
        self.waiting: collections.deque[int] = collections.deque()
        self.prefilling: list[tuple[float, int]] = []  # heap of (first token's time, key)
        self.decoding: list[tuple[float, int]] = []  # heap of (progress at its last token, key)

    @property
    def busy(self) -> int:
        """Requests holding a slot."""
        return len(self.prefilling) + len(self.decoding)

    def _rate(self) -> float:
        """Tokens a second each decoding request advances now."""
        return 1.0 / self.model.tpot_at(self.busy) if self.decoding else 0.0

    def arrive(self, now: float, key: int, tokens: int) -> None:
        """Request `key` of `tokens` tokens (at least 1) arrives at `now`."""
        self.advance(now)
        self.requests[key] = _Request(arrival=self.now, tokens=max(int(tokens), 1))
        self.waiting.append(key)
        self._admit()

    def abort(self, key: int) -> None:
        """Request `key` leaves unfinished (its client hung up): its slot is freed, it is forgotten."""
        request = self.requests.pop(key, None)
        if request is None or request.end is not None:
            return
        if key in self.waiting:
            self.waiting.remove(key)
        self.prefilling = [e for e in self.prefilling if e[1] != key]
        self.decoding = [e for e in self.decoding if e[1] != key]
        heapq.heapify(self.prefilling)
        heapq.heapify(self.decoding)
        self._admit()

    def forget(self, key: int) -> None:
        """Drop finished request `key` (the server has sent it)."""
        self.requests.pop(key, None)

    def times(self, key: int) -> Times:
        """(arrival, first token, end) of finished request `key`."""
        request = self.requests[key]
        assert request.first is not None and request.end is not None, f"request {key} has not finished"
        return request.arrival, request.first, request.end

    def _admit(self) -> None:
        while self.waiting and self.busy < self.model.slots:
            heapq.heappush(self.prefilling, (self.now + self.model.ttft_s, self.waiting.popleft()))

    def _at_progress(self, progress: float) -> float:
        """When decoding reaches `progress`, if nothing arrives before."""
        rate = self._rate()
        return math.inf if rate == 0.0 else self.now + max(progress - self.progress, 0.0) / rate

    def next_event(self) -> float:
        """When the next first token or end comes, if nothing arrives before (a wait may end there)."""
        first_at = self.prefilling[0][0] if self.prefilling else math.inf
        return min(first_at, self._at_progress(self.decoding[0][0]) if self.decoding else math.inf)

    def advance(self, until: float) -> None:
        """Run the model up to `until`: first tokens, ends, and the waiting requests they admit."""
        while True:
            first_at = self.prefilling[0][0] if self.prefilling else math.inf
            end_at = self._at_progress(self.decoding[0][0]) if self.decoding else math.inf
            at = min(first_at, end_at)
            if at > until or math.isinf(at):
                break
            self._move(at)
            if end_at <= first_at:
                self._finish(heapq.heappop(self.decoding)[1])
            else:
                self._first_token(heapq.heappop(self.prefilling)[1])
        if math.isfinite(until) and until > self.now:
            self._move(until)

    def _move(self, at: float) -> None:
        self.progress += (at - self.now) * self._rate()
        self.now = at

    def _first_token(self, key: int) -> None:
        request = self.requests[key]
        request.first, request.progress_at_first = self.now, self.progress
        if request.tokens == 1:
            self._finish(key)
        else:
            heapq.heappush(self.decoding, (self.progress + request.tokens - 1, key))

    def _finish(self, key: int) -> None:
        self.requests[key].end = self.now
        self._admit()

    def emitted(self, key: int) -> int:
        """Tokens request `key` has out by now."""
        request = self.requests[key]
        if request.end is not None:
            return request.tokens
        if request.first is None:
            return 0
        return min(request.tokens - 1, 1 + int(self.progress - request.progress_at_first + 1e-9))

    def finished(self, key: int) -> bool:
        return self.requests[key].end is not None

    def next_token(self, key: int) -> float:
        """When request `key`'s next token comes out, if nothing arrives before (inf while it waits)."""
        request = self.requests[key]
        if request.end is not None:
            return math.inf
        if request.first is None:
            return next((at for at, k in self.prefilling if k == key), math.inf)
        return self._at_progress(request.progress_at_first + self.emitted(key))

    def end(self, key: int) -> float:
        """When request `key` ends, if nothing arrives before (inf before its first token)."""
        request = self.requests[key]
        if request.end is not None:
            return request.end
        if request.first is None:
            return math.inf
        return self._at_progress(request.progress_at_first + request.tokens - 1)
