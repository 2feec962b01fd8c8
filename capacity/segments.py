"""The parts of a long trace that a load level replays, chosen one by one until they decide whether
the whole trace would pass at that load.

A load level k is defined on the whole trace (its arrival times divided by k). Replaying a one-hour
recording at every level costs an hour a level; replaying its first minute measures whatever that
minute happened to hold (on a bursty production trace, 26.9x the rate the whole trace holds). So a
level replays a few *windows* of the trace, each as long as the level's window (`capacity.sustain`):

1. The trace is cut into consecutive windows of that length, the grid aligned so that one window
   is the **busiest** stretch of the trace (the most arrivals in any window-long stretch). Each
   window's *load* is its arrivals per second counted with its lead-in (below): a quiet window
   right after a burst inherits the burst's queue, and its load says so.
2. The busiest window is always replayed first, then the window with the most tokens (input +
   output) where that is another one: misses concentrate where the load peaks.
3. The whole trace's attainment at this level is the request-weighted mean of its windows'. A
   window not replayed is bounded by the windows replayed on either side of its load, on the one
   assumption the rule rests on: a window with more load attains no more than one with less. That
   bounds the whole trace's attainment, [low, high], and that of its last third, which a level
   replaying the whole trace must meet on its own (`capacity.sustain`). When both `low`s reach the
   attainment target the level passes; when a `high` falls short, it fails. Otherwise the next
   window replayed is the one at the middle (by requests) of the load gap whose windows leave the
   most attainment undecided, up to `MAX_PARTS` windows; still undecided then, the level is decided
   by the estimate (each window's attainment interpolated by load between the replayed ones) and
   says so.
4. Percentile targets are read from the replayed requests, each window's requests weighted by the
   trace's requests it stands for (the windows nearest to it in load).
5. Each window is preceded by the stretch of the trace just before it (`LEAD_IN` of a window),
   replayed unmeasured, so that the engine enters it with the batch the trace would have built.

Why it predicts the whole trace: the whole trace's attainment is exactly the weighted mean of its
windows', and the bounds hold wherever attainment falls as the load rises. Where it cannot: a
backlog carried across many windows (a queue that never drains between peaks: the lead-in carries
only the moments before a window), windows of equal load that differ in kind (the load axis is
requests/s; the busiest-by-tokens window covers the heaviest mix), and bursts shorter than a
request's life, which a window replays as recorded but whose effect depends on what was in flight.
Levels far from the capacity are decided by one or two windows (the busiest passes with room to
spare, or a middle window fails outright); levels near it replay more.

A trace no longer than `MIN_WINDOWS` windows is replayed whole (looped where shorter than one
window, `capacity.sustain.looped`): the parts would cost about as much.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

import numpy as np
from typing_extensions import TypedDict  # pydantic reads typing's own only from Python 3.12

from tracetune.capacity.sustain import LAST_PART
from tracetune.replay.profile import arrival_period
from tracetune.replay.types import PreparedRequest
from tracetune.stored import Record

MIN_WINDOWS = 4  # a trace of at most this many windows is replayed whole
MAX_PARTS = 6  # windows a level replays at most
LEAD_IN = 0.5  # share of a window replayed before each part, unmeasured


@dataclasses.dataclass(frozen=True)
class Windows:
    """A trace cut into windows of `length_s` trace seconds (k = 1)."""

    length_s: float
    edges: np.ndarray  # window i is [edges[i], edges[i + 1])
    counts: np.ndarray  # arrivals in each window
    lead_counts: np.ndarray  # arrivals in the lead-in before each window (LEAD_IN of a window)
    tokens: np.ndarray  # input + output tokens of those arrivals
    mean_rps: float  # the whole trace's
    mean_tps: float

    @property
    def n(self) -> int:
        return int(self.counts.size)

    @property
    def requests(self) -> int:
        return int(self.counts.sum())

    @property
    def widths(self) -> np.ndarray:
        return np.diff(self.edges)

    @property
    def load(self) -> np.ndarray:
        """Arrivals per second of each window with its lead-in: what the engine was sent before and
        while the window's own requests arrived (a quiet window after a burst inherits its queue)."""
        return np.asarray((self.counts + self.lead_counts) / (self.widths + LEAD_IN * self.length_s))

    @property
    def full(self) -> np.ndarray:
        return np.asarray(self.widths >= self.length_s * (1 - 1e-9))

    @property
    def last_part(self) -> np.ndarray:
        """The windows of the trace's last third (by their middle), whose attainment a whole-trace
        level must meet on its own (`capacity.sustain.LAST_PART`)."""
        middle = (self.edges[:-1] + self.edges[1:]) / 2
        return np.asarray(middle >= self.edges[0] + (self.edges[-1] - self.edges[0]) * (1 - LAST_PART))

    def part(self, cell: int, kind: str) -> Part:
        return Part(kind, cell, float(self.edges[cell]), float(self.edges[cell + 1]), int(self.counts[cell]),
                    float(self.counts[cell] / self.widths[cell] / self.mean_rps),
                    float(self.tokens[cell] / self.widths[cell] / self.mean_tps))


class StoredPart(TypedDict, total=False):
    """A `Part` as stored (`Part.as_dict`); a level stores it with its outcome (`capacity.result.StoredPartOutcome`)."""

    kind: str
    cell: int
    start_s: float
    end_s: float
    requests: int
    rate_ratio: float
    tokens_ratio: float


@dataclasses.dataclass(frozen=True)
class Part(Record[StoredPart]):
    """One window of the trace a level replays, in trace seconds (k = 1); stored as `StoredPart`."""

    kind: str  # "busiest", "busiest by tokens" or "by load"
    cell: int  # its window's number
    start_s: float
    end_s: float
    requests: int  # the trace's requests inside it
    rate_ratio: float  # its arrival rate over the whole trace's mean
    tokens_ratio: float  # its tokens per second over the whole trace's mean


def clock(seconds: float) -> str:
    """Trace time as m:ss (h:mm:ss past an hour)."""
    s = int(round(seconds))
    h, rem = divmod(s, 3600)
    m, sec = divmod(rem, 60)
    return f"{h}:{m:02d}:{sec:02d}" if h else f"{m}:{sec:02d}"


def request_tokens(r: PreparedRequest) -> float:
    return float(r.input_tokens + r.max_tokens)


def cut(requests: Sequence[PreparedRequest], length_s: float) -> Windows | None:
    """The trace's windows of `length_s` trace seconds, or None when it is no longer than
    MIN_WINDOWS of them (a level then replays it whole)."""
    times = np.asarray([r.scheduled_s for r in requests], dtype=float)
    period = arrival_period(times)
    if times.size < 2 or length_s <= 0 or period <= MIN_WINDOWS * length_s:
        return None
    tokens = np.asarray([request_tokens(r) for r in requests], dtype=float)
    edges = grid(times, length_s, busiest_start(times, length_s))
    at = np.searchsorted(times, edges, side="left")
    at[-1] = times.size  # the last window holds the last arrival
    cum = np.concatenate([[0.0], np.cumsum(tokens)])
    lead = at[:-1] - np.searchsorted(times, edges[:-1] - LEAD_IN * length_s, side="left")
    return Windows(length_s, edges, np.diff(at), lead, np.diff(cum[at]), times.size / period, tokens.sum() / period)


def busiest_start(times: np.ndarray, length_s: float) -> float:
    """The arrival that starts the window of `length_s` holding the most arrivals (the first such)."""
    ends = np.searchsorted(times, times + length_s, side="left")
    return float(times[int(np.argmax(ends - np.arange(times.size)))])


def grid(times: np.ndarray, length_s: float, anchor: float) -> np.ndarray:
    """Window edges `length_s` apart through `anchor`, covering the arrivals (the last window runs
    past the last arrival); a first window shorter than half a window joins its neighbour unless
    that is the anchor's."""
    first, last = float(times[0]), float(times[-1])
    k_lo = int(np.floor((first - anchor) / length_s))
    k_hi = max(int(np.ceil((last - anchor) / length_s + 1e-9)), 1)
    edges = np.unique(np.clip(anchor + np.arange(k_lo, k_hi + 1) * length_s, first, None))
    if edges.size > 3 and edges[1] - edges[0] < length_s / 2 and edges[1] != anchor:
        edges = np.delete(edges, 1)
    return edges


def first_parts(w: Windows) -> list[Part]:
    """The busiest full window by requests, and by tokens where that is another one."""
    by_requests = int(np.argmax(np.where(w.full, w.counts, -1)))
    by_tokens = int(np.argmax(np.where(w.full, w.tokens, -1)))
    parts = [w.part(by_requests, "busiest")]
    if by_tokens != by_requests:
        parts.append(w.part(by_tokens, "busiest by tokens"))
    return parts


def load_curve(w: Windows, measured: Mapping[int, float]) -> tuple[np.ndarray, np.ndarray]:
    """The measured windows' loads (ascending) and their attainment fitted to fall as the load rises
    (isotonic regression weighted by their requests): windows of equal load attain differently, and
    the fit pools the ones that break the assumption instead of trusting either."""
    from scipy.optimize import isotonic_regression

    cells = sorted(measured, key=lambda c: w.load[c])
    values = np.asarray([measured[c] for c in cells], dtype=float)
    weights = np.asarray([max(w.counts[c], 1) for c in cells], dtype=float)
    fit = isotonic_regression(values, weights=weights, increasing=False).x if len(cells) > 1 else values
    return w.load[cells], np.clip(fit, 0.0, 1.0)


def window_bounds(w: Windows, measured: Mapping[int, float]) -> tuple[np.ndarray, np.ndarray]:
    """Each window's attainment bounds from the load curve of the measured windows: no more than at
    any measured load below its own, no less than at any above (measured windows: their own)."""
    low, high = np.zeros(w.n), np.ones(w.n)
    for x, value in zip(*load_curve(w, measured)):
        low = np.where(w.load <= x, np.maximum(low, value), low)
        high = np.where(w.load >= x, np.minimum(high, value), high)
    for cell, value in measured.items():
        low[cell] = high[cell] = value
    return low, high


def _mean(w: Windows, values: np.ndarray, mask: np.ndarray | None) -> float:
    counts = w.counts if mask is None else w.counts * mask
    return float(counts @ values / counts.sum()) if counts.sum() else 1.0


def bounds(w: Windows, measured: Mapping[int, float], mask: np.ndarray | None = None) -> tuple[float, float]:
    """The attainment bounds, [low, high], of the whole trace (or of the windows `mask` selects)."""
    low, high = window_bounds(w, measured)
    return _mean(w, low, mask), _mean(w, high, mask)


def estimate(w: Windows, measured: Mapping[int, float], mask: np.ndarray | None = None) -> float:
    """The whole trace's attainment (or that of the windows `mask` selects) with each window's
    interpolated by load between the measured windows (a window quieter than all of them: toward 1
    at no load), within its bounds."""
    loads, fit = load_curve(w, measured)
    xs, ys = np.concatenate([[0.0], loads]), np.concatenate([[1.0], fit])
    low, high = window_bounds(w, measured)
    return _mean(w, np.clip(np.interp(w.load, xs, ys), low, high), mask)


def decision(w: Windows, measured: Mapping[int, float], target: float) -> tuple[str, np.ndarray | None]:
    """What the measured windows decide of a whole-trace level with attainment `target`, over the whole
    trace and over its last third: "pass", "fail", or "" (undecided) with the windows still to learn
    about (None: the whole trace)."""
    whole_low, whole_high = bounds(w, measured)
    last = w.last_part
    last_low, last_high = bounds(w, measured, last)
    if whole_high < target or last_high < target:
        return "fail", None
    if whole_low >= target and last_low >= target:
        return "pass", None
    return "", None if whole_low < target else last


def next_part(w: Windows, measured: Mapping[int, float], mask: np.ndarray | None = None) -> Part | None:
    """The window to replay next (among those `mask` selects, None: all): in the load gap between
    measured windows whose windows leave the most attainment undecided, the one at its middle by
    requests (None: nothing left to learn)."""
    low, high = window_bounds(w, measured)
    among = np.ones(w.n, dtype=bool) if mask is None else mask
    open_cells = [c for c in range(w.n) if c not in measured and w.full[c] and w.counts[c] > 0 and among[c]]
    if not open_cells:
        return None
    marks = sorted(float(w.load[c]) for c in measured)
    gap = np.searchsorted(marks, w.load, side="left")  # windows between the same two measured loads
    spread = np.bincount(gap, weights=w.counts * (high - low) * among, minlength=len(marks) + 1)
    best = int(np.argmax(spread))
    if spread[best] <= 0:
        return None
    cells = sorted((c for c in open_cells if gap[c] == best), key=lambda c: w.load[c])
    if not cells:
        return None
    mass = np.cumsum([w.counts[c] for c in cells])
    return w.part(cells[int(np.searchsorted(mass, mass[-1] / 2))], "by load")


def stands_for(w: Windows, measured: Sequence[int]) -> dict[int, tuple[int, int]]:
    """For each measured window: the trace's requests and windows it stands for (every window goes to
    the measured one nearest in load, the busier one on a tie)."""
    out = {cell: (0, 0) for cell in measured}
    for c in range(w.n):
        nearest = min(measured, key=lambda m: (abs(w.load[m] - w.load[c]), -w.load[m]))
        requests, windows = out[nearest]
        out[nearest] = (requests + int(w.counts[c]), windows + 1)
    return out


def schedule(requests: Sequence[PreparedRequest], part: Part, lead_in_s: float) -> tuple[list[PreparedRequest], int]:
    """The requests a part sends, in trace seconds: the lead-in's (the `lead_in_s` before it,
    unmeasured) then its own; and how many lead the way."""
    lead = [r for r in requests if part.start_s - lead_in_s <= r.scheduled_s < part.start_s]
    own = [r for r in requests if part.start_s <= r.scheduled_s < part.end_s]
    return lead + own, len(lead)


def describe_rule(requests: int) -> str:
    """The selection rule in one sentence, for the start of a search."""
    return (f"the trace ({requests} requests) is longer than {MIN_WINDOWS} windows, so a level replays "
            f"windows of it, each after a lead-in of {LEAD_IN:.0%} of a window: the busiest (by requests, "
            f"and by tokens), then others by load until the whole trace's attainment, bounded by the "
            f"windows replayed, is decided (at most {MAX_PARTS})")
