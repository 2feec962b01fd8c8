"""What a trace looks like: its duration and size, arrival rates at several time scales, how bursty
it is, its length quantiles, how much of its input repeats an earlier prefix, and its rate over time.

`tune trace profile FILE` prints it; every capacity search prints its short form; the selection
of a load level's parts (`capacity.segments`) and the check of a first-N cut (`compare`) read it.
Token counts are the trace's own (`input_length`, `output_length`); a request recorded as text has
its input estimated at 4 characters a token (said where it matters: `input_estimated`).
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Sequence

import numpy as np

from tracetune.replay.trace import Trace, TraceRecord
from tracetune.stored import Record

SCALES_S = (1.0, 10.0, 60.0, 600.0)  # time scales of the arrival rates
QUANTILES = (0.5, 0.9, 0.99)
CHARS_PER_TOKEN = 4.0  # an estimate, for requests recorded as text (no tokenizer at hand)
PREFIX_CHUNK = 256  # characters per block when prompts' prefixes are compared
OVER_TIME_BINS = 60  # points of the rate-over-time series
SPARK = "▁▂▃▄▅▆▇█"

# A part of a trace "differs from the whole" when its mean arrival rate is outside RATE_BOUNDS times
# the whole's, a length quantile (p50, p90) moves by more than LENGTH_BOUND of the whole's, or its prefix
# reuse by more than REUSE_BOUND (absolute share).
RATE_BOUNDS = (0.8, 1.25)
LENGTH_BOUND = 0.25
REUSE_BOUND = 0.10


@dataclasses.dataclass(frozen=True)
class Rates(Record[dict[str, float]]):
    """Arrival rates (requests/s) counted in consecutive bins of `scale_s` seconds."""

    scale_s: float
    peak: float
    p90: float
    p50: float


@dataclasses.dataclass(frozen=True)
class Profile(Record[dict[str, object]]):
    """A trace's profile; stored with its study (`tuner.settings.trace_profile`), read there as a dict."""

    requests: int
    duration_s: float  # first to last arrival
    mean_rps: float  # requests over the trace's period (span plus one mean gap: `capacity.sustain.period`)
    rates: tuple[Rates, ...]  # at each time scale the trace spans
    interarrival_cv: float  # std / mean of the gaps between arrivals (1 for a Poisson process)
    input_tokens: dict[str, float]  # mean, p50, p90, p99
    output_tokens: dict[str, float]
    prefix_reuse: float  # share of input (blocks or characters) already sent as a prefix earlier
    input_estimated: bool  # some inputs counted from characters, not tokens
    over_time_s: float  # bin width of `over_time`
    over_time: tuple[float, ...]  # requests/s in consecutive bins from the first arrival

    def peak_ratio(self, scale_s: float) -> float:
        """The peak rate at `scale_s` over the mean rate (nan where the trace is shorter)."""
        for r in self.rates:
            if r.scale_s == scale_s:
                return r.peak / self.mean_rps if self.mean_rps else float("nan")
        return float("nan")

    def short(self) -> str:
        """One line: size, rate, peaks, lengths."""
        peaks = ", ".join(f"{r.peak:.3g}/{_scale(r.scale_s)}" for r in self.rates)
        return (f"trace: {self.requests} requests over {_duration(self.duration_s)}, {self.mean_rps:.3g} req/s "
                f"(peak {peaks}), input p50 {self.input_tokens['p50']:.0f} tokens, output p50 "
                f"{self.output_tokens['p50']:.0f}")

    def lines(self) -> list[str]:
        """The whole profile, for `tune trace profile` (80 columns)."""
        est = " (estimated from characters)" if self.input_estimated else ""
        out = [f"requests      {self.requests}",
               f"duration      {_duration(self.duration_s)}",
               f"mean rate     {self.mean_rps:.3g} req/s",
               f"burstiness    inter-arrival CV {self.interarrival_cv:.2f} (1 = Poisson)",
               "arrival rate  scale   p50      p90      peak     peak/mean"]
        for r in self.rates:
            ratio = r.peak / self.mean_rps if self.mean_rps else float("nan")
            out.append(f"              {_scale(r.scale_s):<6}  {r.p50:<7.3g}  {r.p90:<7.3g}  {r.peak:<7.3g}  "
                       f"{ratio:.2f}x")
        for name, q in (("input tokens", self.input_tokens), ("output tokens", self.output_tokens)):
            out.append(f"{name:<13} mean {q['mean']:.0f}, p50 {q['p50']:.0f}, p90 {q['p90']:.0f}, "
                       f"p99 {q['p99']:.0f}{est if name == 'input tokens' else ''}")
        out.append(f"prefix reuse  {self.prefix_reuse:.0%} of input already sent as an earlier prefix")
        out.append(f"rate over time ({_duration(self.over_time_s)} a mark, peak "
                   f"{max(self.over_time, default=0):.3g} req/s):")
        out.append("  " + sparkline(self.over_time))
        return out


def _scale(seconds: float) -> str:
    return f"{seconds / 60:g}min" if seconds >= 60 else f"{seconds:g}s"


def _duration(seconds: float) -> str:
    if seconds >= 3600:
        return f"{seconds / 3600:.2f} h"
    return f"{seconds / 60:.1f} min" if seconds >= 120 else f"{seconds:.3g} s"


def sparkline(values: Sequence[float]) -> str:
    """`values` as a line of block characters, scaled to their maximum."""
    arr = np.asarray(values, dtype=float)
    if arr.size == 0 or not np.nanmax(arr) > 0:
        return SPARK[0] * arr.size
    idx = np.clip(np.round(arr / np.nanmax(arr) * (len(SPARK) - 1)), 0, len(SPARK) - 1).astype(int)
    return "".join(SPARK[i] for i in idx)


def input_tokens(record: TraceRecord) -> tuple[float, bool]:
    """A request's input length in tokens, and whether it was estimated from characters."""
    if record.input_length is not None:
        return float(record.input_length), False
    return max(len(prompt_text(record)) / CHARS_PER_TOKEN, 1.0), True


def prompt_text(record: TraceRecord) -> str:
    if record.prompt is not None:
        return record.prompt
    return "\n".join(m.content for m in record.messages or [])


def quantiles(values: np.ndarray) -> dict[str, float]:
    if values.size == 0:
        return {"mean": 0.0, **{f"p{round(q * 100)}": 0.0 for q in QUANTILES}}
    qs = np.quantile(values, QUANTILES)
    return {"mean": float(values.mean()), **{f"p{round(q * 100)}": float(v) for q, v in zip(QUANTILES, qs)}}


def bin_rates(times: np.ndarray, scale_s: float, start: float, end: float) -> np.ndarray:
    """Requests/s in consecutive bins of `scale_s` from `start` (the last bin ends at or after `end`)."""
    n_bins = max(int(np.ceil((end - start) / scale_s - 1e-9)), 1)
    counts, _ = np.histogram(times, bins=n_bins, range=(start, start + n_bins * scale_s))
    return counts / scale_s


def prefix_reuse(records: Sequence[TraceRecord]) -> float:
    """Share of input already sent as a prefix of an earlier request: by `hash_ids` blocks where the
    trace has them, else by blocks of PREFIX_CHUNK characters of the prompt's text."""
    seen: set[object] = set()
    total = reused = 0
    for r in records:
        for key in _prefix_keys(r):
            total += 1
            if key in seen:
                reused += 1
            else:
                seen.add(key)
    return reused / total if total else 0.0


def _prefix_keys(record: TraceRecord) -> list[object]:
    """One key per block, each naming the whole prefix up to that block's end."""
    if record.hash_ids is not None:
        return [("ids", *record.hash_ids[: i + 1]) for i in range(len(record.hash_ids))]
    if record.input_length is not None:
        return []
    text = prompt_text(record)
    digest = hashlib.blake2b(digest_size=16)
    keys: list[object] = []
    for start in range(0, len(text), PREFIX_CHUNK):
        digest.update(text[start:start + PREFIX_CHUNK].encode("utf-8", "replace"))
        keys.append(digest.copy().digest())
    return keys


def arrival_period(times: np.ndarray) -> float:
    """The span of the arrivals plus their mean gap between distinct instants (`capacity.sustain.period`)."""
    instants = np.unique(np.round(times, 3))
    if instants.size < 2:
        return 0.0
    return float(instants[-1] - instants[0]) * instants.size / (instants.size - 1)


def profile_records(records: Sequence[TraceRecord]) -> Profile:
    """The profile of `records` (their timestamps as they are: a part keeps its place in the trace)."""
    times = np.asarray([r.timestamp for r in records], dtype=float)
    inputs = [input_tokens(r) for r in records]
    start, end = (float(times.min()), float(times.max())) if times.size else (0.0, 0.0)
    period = arrival_period(times)
    mean_rps = len(records) / period if period > 0 else float(len(records))
    gaps = np.diff(times)
    cv = float(gaps.std() / gaps.mean()) if gaps.size and gaps.mean() > 0 else 0.0
    rates = []
    for scale in SCALES_S:
        if scale <= max(end - start, 0.0) or scale == SCALES_S[0]:
            binned = bin_rates(times, scale, start, end)
            rates.append(Rates(scale, float(binned.max()), float(np.quantile(binned, 0.9)),
                               float(np.quantile(binned, 0.5))))
    width = max((end - start) / OVER_TIME_BINS, 1.0)
    return Profile(
        requests=len(records), duration_s=end - start, mean_rps=mean_rps, rates=tuple(rates),
        interarrival_cv=cv, input_tokens=quantiles(np.asarray([v for v, _ in inputs], dtype=float)),
        output_tokens=quantiles(np.asarray([r.output_length for r in records], dtype=float)),
        prefix_reuse=prefix_reuse(records), input_estimated=any(est for _, est in inputs),
        over_time_s=width, over_time=tuple(float(v) for v in bin_rates(times, width, start, end)))


def profile(trace: Trace) -> Profile:
    return profile_records(trace.records)


def compare(part: Profile, whole: Profile) -> list[str]:
    """How `part` differs from `whole` beyond the stated bounds, one phrase each (empty: alike)."""
    out = []
    if whole.mean_rps > 0:
        ratio = part.mean_rps / whole.mean_rps
        if not RATE_BOUNDS[0] <= ratio <= RATE_BOUNDS[1]:
            out.append(f"mean rate {part.mean_rps:.3g} req/s vs {whole.mean_rps:.3g} ({ratio:.2f}x)")
    for name, a, b in (("input", part.input_tokens, whole.input_tokens),
                       ("output", part.output_tokens, whole.output_tokens)):
        for q in ("p50", "p90"):
            if b[q] > 0 and abs(a[q] / b[q] - 1) > LENGTH_BOUND:
                out.append(f"{name} {q} {a[q]:.0f} vs {b[q]:.0f} tokens")
    if abs(part.prefix_reuse - whole.prefix_reuse) > REUSE_BOUND:
        out.append(f"prefix reuse {part.prefix_reuse:.0%} vs {whole.prefix_reuse:.0%}")
    return out


def bounds_text() -> str:
    """The rule `compare` applies, in words."""
    return (f"mean rate within {RATE_BOUNDS[0]:g}-{RATE_BOUNDS[1]:g}x the whole's, input and output p50/p90 "
            f"within {LENGTH_BOUND:.0%}, prefix reuse within {REUSE_BOUND * 100:.0f} points")
