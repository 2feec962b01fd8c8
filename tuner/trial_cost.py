"""Where a trial's wall time goes: its engine's start, its load levels (the trace's rate and the
capacity search, the engine drained between them), its quality and acceptance probes, and its
engine's stop. The run that measures a configuration keeps the clock (`tuner.measure`); the split
is stored in the trial's summary (`cost`), printed after each trial with an estimate of the time
left for the trials asked, and shown in the dashboard's trial detail."""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Iterator, Mapping, Sequence

# Trials whose wall times lie within this factor of each other give one estimate of the time left, not a range.
SAME_PACE = 1.5
# The stored keys, in the order they are shown, and their words.
PARTS = {"start_s": "engine start", "levels_s": "levels", "probe_s": "quality probe",
         "acceptance_s": "acceptance probe", "stop_s": "stop"}


@dataclasses.dataclass
class CostClock:
    """Wall seconds per part of one engine run; `measure_s` holds the levels and probes together
    until `as_dict` splits them."""

    seconds: dict[str, float] = dataclasses.field(default_factory=dict)
    t0: float = dataclasses.field(default_factory=time.perf_counter)

    @contextlib.contextmanager
    def part(self, key: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[key] = self.seconds.get(key, 0.0) + time.perf_counter() - start

    def as_dict(self) -> dict[str, float]:
        """{start_s, levels_s, probe_s, acceptance_s, stop_s, wall_s}: the levels are what the
        measuring took besides the probes."""
        s = self.seconds
        probes = s.get("probe_s", 0.0) + s.get("acceptance_s", 0.0)
        out = {"start_s": s.get("start_s", 0.0), "levels_s": max(s.get("measure_s", 0.0) - probes, 0.0),
               "probe_s": s.get("probe_s", 0.0), "acceptance_s": s.get("acceptance_s", 0.0),
               "stop_s": s.get("stop_s", 0.0)}
        return {**out, "wall_s": time.perf_counter() - self.t0}


def duration(seconds: float) -> str:
    """42s, 3m05s, 1h02m."""
    whole = int(round(seconds))
    if whole < 60:
        return f"{whole}s"
    if whole < 3600:
        return f"{whole // 60}m{whole % 60:02d}s"
    return f"{whole // 3600}h{whole % 3600 // 60:02d}m"


def cost_text(cost: Mapping[str, float] | None, levels: int | None = None) -> str:
    """`engine start 24s · levels 2m10s (6) · quality probe 18s` ("" without a split); parts under a
    second are left out."""
    if not cost:
        return ""
    shown = []
    for key, words in PARTS.items():
        value = cost.get(key, 0.0)
        if value >= 0.5:
            count = f" ({levels})" if key == "levels_s" and levels else ""
            shown.append(f"{words} {duration(value)}{count}")
    return " · ".join(shown)


def time_left(walls: Sequence[float], remaining: int, *, full_s: float | None = None) -> str:
    """The time the `remaining` trials may take at the pace of the trials ended so far (`walls`): "about
    12m left for 3 more trials" where they took about the same, else a range, e.g. "36s to 19m left for
    2 more trials (a trial so far: 18s to 9m30s, the reference's included)": a trial stopped early
    takes seconds, one searched to the end many minutes, and which comes next is not known. `full_s`:
    the reference's wall time (searched to the end, unless it missed the SLO at the trace's rate).
    "" when none is left or no trial ended yet."""
    if remaining <= 0 or not walls:
        return ""
    trials = "trial" if remaining == 1 else "trials"
    low, high = min(walls), max([*walls, full_s or 0.0])
    if high <= SAME_PACE * low:
        return f"about {duration(sum(walls) / len(walls) * remaining)} left for {remaining} more {trials}"
    note = ", the reference's included" if full_s is not None and full_s > max(walls) else ""
    return (f"{duration(low * remaining)} to {duration(high * remaining)} left for {remaining} more {trials} "
            f"(a trial so far: {duration(low)} to {duration(high)}{note})")
