"""The records of a capacity search, as measured and as stored: each load level (`Step`, its
`Outcome`, the test that decided it, `sustain.DecidedBy`, and the windows of the trace it replayed)
and the search's result (`CapacityResult`, its `Verdict`, bracket and caveats), each reading back
what it wrote (`from_dict`). The definitions they record
(good request, attainment, sustained, capacity) are `capacity.step`'s."""

from __future__ import annotations

import dataclasses
import enum
import math
from collections.abc import Mapping
from typing import Annotated, NotRequired

from pydantic import AliasPath, Field, model_validator
from typing_extensions import TypedDict  # pydantic reads typing's own only from Python 3.12

from tracetune.capacity import segments
from tracetune.capacity.sustain import DecidedBy
from tracetune.stored import Record, Stored, number


class Outcome(enum.StrEnum):
    """How a load level ended (a str: stored as its value)."""

    PASS = "pass"
    FAIL = "fail"
    ABANDONED = "abandoned"  # failed before its end: the outcome was certain


class Verdict(enum.StrEnum):
    """How a capacity search ended (a str: stored as its value); OK says nothing about the number."""

    OK = "ok"
    ABOVE_MAX = "above_max"
    BELOW_MIN = "below_min"
    LOAD_INDEPENDENT = "load_independent"
    CLIENT_OVERLOADED = "client_overloaded"
    MAX_STEPS = "max_steps"
    PRUNED = "pruned"
    MACHINE_BUSY = "machine_busy"  # a level failed while other work took the engine's cores, again when retried


class StoredPartOutcome(segments.StoredPart, total=False):
    """A window of the trace a level replayed, as its `Step.parts` stores it: the window and how its
    own replay went (`capacity.parts.PartOutcome.as_dict`)."""

    attainment: float
    good: int
    planned: int
    sent: int
    outcome: Outcome
    abandoned: bool
    duration_s: float
    lag_p99_s: float
    stands_for_requests: int  # the trace's requests and windows it stands for
    stands_for_windows: int


# The failed tests whose words need no numbers (`Step.why`).
_WHY: dict[DecidedBy, str] = {DecidedBy.MISSES: "more misses than the target allows",
                              DecidedBy.LAST_THIRD_MISSES: "more misses in the last third than the target allows",
                              DecidedBy.ATTAINMENT: "below the target",
                              DecidedBy.PERCENTILE_TARGET: "a percentile target missed",
                              DecidedBy.SLO_MISSED: "the SLO certainly missed"}


@dataclasses.dataclass
class Step(Record[dict[str, object]]):
    """One load level as measured: `requests` were sent of `planned`, `duration_s` of wall time.
    Stored with its `outcome` (`derived`); a field an older tracetune did not store takes its
    default (NaN for a load, an attainment or a duration)."""

    scale: float = math.nan
    rps: float = math.nan  # offered requests/s at this level
    output_tps: float = math.nan  # offered output tokens/s at this level
    attainment: float = math.nan
    passed: bool = False
    abandoned: bool = False
    requests: int = 0
    planned: int = 0
    good: int = 0
    duration_s: float = math.nan
    lag_p99_s: float = 0.0
    client_overloaded: bool = False
    repeat: bool = False
    errors: int = 0
    client_procs: int = 1
    decided_by: DecidedBy = DecidedBy.NOT_JUDGED  # how the level was decided (`capacity.sustain`)
    window_s: float = 0.0  # the level's length: its requests over its rate
    passes: int = 1  # times the trace was replayed end to end to fill the window
    last_third: float | None = None  # attainment of the requests scheduled in the window's last third
    quarters: list[float] = dataclasses.field(default_factory=list)  # attainment per quarter of the window
    in_flight_trend: list[float] | None = None  # requests in flight at the end: slope/s, 95% low, high, end value
    ttft_trend: list[float] | None = None  # median TTFT at the end (s): slope/s, 95% low, high, end value
    # A level of a long trace replays some of its windows (`capacity.segments`): each with what it stands
    # for and its own verdict; `trace_windows`: the windows the trace was cut into. None: the whole trace.
    parts: list[StoredPartOutcome] | None = None
    trace_windows: int = 0
    attainment_bounds: list[float] | None = None  # the whole trace's, [low, high], from the parts replayed
    undecided: bool = False  # the bounds still straddled the target after the most parts: the estimate decided
    # How close the requests came to the SLO (`capacity.response`): [95% low, value, high], None for infinite.
    slo_ratio: list[float | None] | None = None
    placed_by: str = ""  # the rule that chose this level's load (`capacity.response.place`), "" for a seed
    repeat_rule: str = ""  # for a bracket end: why it was (or was not) measured again
    cut: int = 0  # requests still in flight when the level's outcome was certain, cut and counted as misses
    # Why it ended early with requests in flight and its outcome a fail: the SLO target it certainly
    # missed (`step.MissedSLO`), or its queue certainly rising (`sustain.QueueRising`); "" otherwise.
    ended: str = ""
    cause: str = ""  # a failed level: why, in words with its numbers (`capacity.causes`); "" unexplained
    # Who used the machine's cores while the level ran (`replay.machine.Share.as_dict`, its count of cpus
    # kept whole; None: not accounted), and why it measured the machine rather than the engine ("" when it
    # did not: `replay.machine.busy_reason`).
    machine: dict[str, int | float] | None = None
    machine_busy: str = ""
    quiet_wait_s: float = 0.0  # waited before the level for the machine to be quiet again

    @property
    def not_counted(self) -> bool:
        """A failed level that measured its client or its machine rather than the engine: it says
        nothing about the configuration (`capacity.search` measures it again)."""
        return not self.passed and (self.client_overloaded or bool(self.machine_busy))

    def derived(self) -> dict[str, object]:
        return {"outcome": self.outcome}

    @property
    def outcome(self) -> Outcome:
        """pass, fail or abandoned (failed before its end: the outcome was certain)."""
        return Outcome.ABANDONED if self.abandoned else Outcome.PASS if self.passed else Outcome.FAIL

    def line(self, label: str = "") -> str:
        """This level in one line, for progress output."""
        if self.machine_busy and not self.passed:  # a busy machine starves the client too
            verdict = f"{self.machine_busy}: not counted"
        elif self.client_overloaded and not self.passed:
            verdict = f"client overloaded (schedule lag p99 {self.lag_p99_s * 1000:.0f} ms): not counted"
        else:
            verdict = f"{self.outcome}: {self.why()}" if self.decided_by else "pass" if self.passed else "fail"
        if self.abandoned:
            attained = f"attainment <= {self.attainment:.0%} ({self.requests} of {self.planned} sent)"
        elif self.parts is not None:  # the whole trace's estimate, from the windows' requests
            attained = f"attainment {self.attainment:.0%} ({self.good}/{self.planned} good in the windows)"
        elif self.cut:  # the requests cut in flight count as misses: a lower bound
            attained = f"attainment >= {self.attainment:.0%} ({self.good}/{self.planned} good, {self.cut} cut)"
        else:
            attained = f"attainment {self.attainment:.0%} ({self.good}/{self.planned} good)"
        procs = f" · {self.client_procs} client processes" if self.client_procs > 1 else ""
        if self.ended:
            procs += f" · ended with {self.cut} in flight: {self.ended}"
        elif self.cut:
            procs += f" · ended with {self.cut} in flight, its attainment certain"
        if self.machine_busy and self.passed:
            procs += " · passed on a busy machine (other work took cores)"
        if self.quiet_wait_s:
            procs += f" · after {self.quiet_wait_s:.0f}s waiting for a quiet machine"
        passes = f", {self.passes} passes of the trace" if self.passes > 1 else ""
        if self.parts is not None:
            passes = f", {len(self.parts)} of {self.trace_windows} windows"
        return (f"{label + ': ' if label else ''}load {self.scale:.3g}x = {self.rps:.3g} req/s · {attained} · {verdict}"
                f"{' (repeat)' if self.repeat else ''} · {self.duration_s:.1f}s{passes}{procs}{self.parts_text()}")

    def parts_text(self) -> str:
        """For a level of parts: a second line, each part's window and attainment (the first line
        has the whole trace's attainment bounds they give)."""
        if not self.parts:
            return ""
        texts = [f"{p['kind']} {segments.clock(p['start_s'])}-{segments.clock(p['end_s'])} "
                 f"({p['rate_ratio']:.2g}x rate) {p['attainment']:.0%}" for p in self.parts]
        return f"\n    {len(self.parts)} of {self.trace_windows} windows: " + ", ".join(texts)

    def why(self) -> str:
        """The test that decided, in a few words."""
        last = f"last third {self.last_third:.0%}" if self.last_third is not None else ""
        if self.parts is not None and self.decided_by in (DecidedBy.HELD, DecidedBy.ATTAINMENT, DecidedBy.LAST_THIRD):
            low, high = self.attainment_bounds or (math.nan, math.nan)
            whole = f"whole trace [{low:.0%}, {high:.0%}], {last}"
            return f"{whole}, undecided: estimated" if self.undecided else whole
        if self.decided_by == DecidedBy.HELD:
            return f"held to the end ({last})" if last else "held to the end"
        if self.decided_by == DecidedBy.LAST_THIRD:
            return f"{last}, below the target"
        if self.decided_by == DecidedBy.QUEUE_RISING and self.in_flight_trend:
            slope, low, high = self.in_flight_trend[:3]
            return f"queue still rising, {slope:+.2g} in flight/s [{low:+.2g}, {high:+.2g}]"
        if self.decided_by == DecidedBy.TTFT_RISING and self.ttft_trend:
            slope, low, high = (v * 1000 for v in self.ttft_trend[:3])
            return f"TTFT still rising, {slope:+.3g} ms/s [{low:+.3g}, {high:+.3g}]"
        return _WHY.get(self.decided_by, self.decided_by)


# What a search's verdict means for the number, in a few words (verdict OK says nothing).
VERDICT_NOTES = {
    Verdict.ABOVE_MAX: "above the search's ceiling",
    Verdict.BELOW_MIN: "failed even the lowest load",
    Verdict.LOAD_INDEPENDENT: "failed at every load: the misses do not come from the rate",
    Verdict.CLIENT_OVERLOADED: "client-limited (a lower bound)",
    Verdict.MAX_STEPS: "step budget spent",
    Verdict.PRUNED: "pruned: it cannot be on the front (below a configuration at least as good on the "
                    "other objectives, outside the quality gate, or it missed the SLOs at the trace's rate): "
                    "a bracket, not searched further",
    Verdict.MACHINE_BUSY: "machine busy: other work took the engine's cores (a lower bound)",
}


class StoredCapacity(TypedDict):
    """A `CapacityResult` as stored (`CapacityResult.as_dict`), in the order it is written: the
    capacity with its rates and bracket, the search's settings and verdict, then its levels."""

    capacity_scale: float  # 0: not even the lowest level passed
    capacity_rps: float
    capacity_output_tps: float
    capacity_rps_per_gpu: float
    bracket_scale: list[float | None]  # [highest passing, lowest failing (None: none failed above)]
    bracket_rps: list[float | None]
    gpus: int
    attainment_target: float
    precision: float
    slo: list[str]
    unstable: bool
    verdict: Verdict
    base_rps: float
    base_output_tps: float
    capacity_input_tps: float
    search_s: float
    replay_s: float
    steps: list[dict[str, object]]  # `Step.as_dict()` each
    usd_per_1m_output_tokens: NotRequired[float]


@dataclasses.dataclass
class CapacityResult(Record[StoredCapacity]):
    """A capacity search's result; stored as `StoredCapacity`, its rates beside its fields (`derived`).
    A field an older tracetune did not store takes its default (its base rate: the capacity it
    offered over its scale)."""

    attainment_target: float = 0.95
    precision: float = 0.05
    slos: Annotated[list[str], Field(alias="slo")] = dataclasses.field(default_factory=list)
    steps: list[Step] = dataclasses.field(default_factory=list)
    capacity_scale: float | None = None  # highest passing level (None: not even the lowest level passed)
    # Lowest failing level above it (None: no level failed up to the maximum), stored in the bracket.
    bracket_high: Annotated[float | None, Field(validation_alias=AliasPath("bracket_scale", 1), exclude=True)] = None
    base_rps: float = 0.0  # offered requests/s at k = 1
    base_output_tps: float = 0.0
    gpus: int = 1
    # Of the requests measured, as the engine counted them; stored as the input tokens/s at capacity.
    mean_prompt_tokens: Annotated[float, Field(exclude=True)] = 0.0
    unstable: bool = False
    verdict: Verdict = Verdict.OK
    search_s: float = 0.0
    # $ per 1M output tokens at capacity: never stored by the search, set by a reader that knows the
    # study's --gpu-hour-cost (`dashboard.data.with_costs`), so cost reads like any other metric.
    usd_per_1m_output_tokens: float | None = None

    unset_omitted = ("usd_per_1m_output_tokens",)
    stored_order = tuple(StoredCapacity.__annotations__)  # that of every result stored so far

    @model_validator(mode="before")
    @classmethod
    def _from_rates(cls, stored: object) -> object:
        """The fields stored as rates read back from them, the derived ones recomputed from these
        to the same digits: a capacity of 0 as None, the base rate (an older tracetune stored the
        capacity's alone) and the mean prompt (stored as the input rate)."""
        if not isinstance(stored, Mapping):
            return stored
        scale = number(stored.get("capacity_scale"))
        level = scale if math.isfinite(scale) and scale > 0 else None
        base_rps = number(stored.get("base_rps"))
        if not math.isfinite(base_rps):
            base_rps = number(stored.get("capacity_rps")) / level if level else 0.0
        input_tps = number(stored.get("capacity_input_tps"))
        return {**stored, "capacity_scale": level, "base_rps": base_rps,
                "mean_prompt_tokens": _ratio(input_tps, (level or 0.0) * base_rps)}

    @property
    def capacity_rps(self) -> float:
        return (self.capacity_scale or 0.0) * self.base_rps

    @property
    def capacity_output_tps(self) -> float:
        return (self.capacity_scale or 0.0) * self.base_output_tps

    @property
    def capacity_rps_per_gpu(self) -> float:
        return self.capacity_rps / max(self.gpus, 1)

    @property
    def replay_s(self) -> float:
        return sum(s.duration_s for s in self.steps)

    def derived(self) -> dict[str, object]:
        """Its rates and bracket."""
        low = self.capacity_scale or 0.0
        return {"capacity_scale": low, "capacity_rps": self.capacity_rps,
                "capacity_output_tps": self.capacity_output_tps, "capacity_rps_per_gpu": self.capacity_rps_per_gpu,
                "bracket_scale": [low, self.bracket_high], "bracket_rps": list(self.bracket_rps()),
                "capacity_input_tps": self.capacity_rps * self.mean_prompt_tokens, "replay_s": self.replay_s}

    @property
    def bracket_high_rps(self) -> float | None:
        """The lowest failing level above capacity in requests/s (None: no level failed above)."""
        return None if self.bracket_high is None else self.bracket_high * self.base_rps

    def bracket_rps(self) -> tuple[float, float | None]:
        """[highest passing, lowest failing] offered requests/s (high None: nothing failed above)."""
        return self.capacity_rps, self.bracket_high_rps

    def bracket_text(self, *, per_gpu: bool = False) -> str:
        """`[3.2, 3.6] req/s` (or per GPU); an open bracket `[3.2, -)` when no level failed above."""
        low, high = self.bracket_rps()
        gpus = max(self.gpus, 1) if per_gpu else 1
        top = "-)" if high is None else f"{high / gpus:.3g}]"
        return f"[{low / gpus:.3g}, {top} req/s" + (" per GPU" if per_gpu else "")

    def failed_at(self) -> Step | None:
        """The failed level that bounds the capacity from above: the last measured at `bracket_high`
        (None: no level failed above)."""
        failed = [s for s in self.steps if s.scale == self.bracket_high and not s.passed]
        return failed[-1] if failed else None

    def failure_text(self) -> str:
        """Why the level bounding the capacity failed, with its load: "fails 1.33x the trace's rate:
        about 15 requests in flight for 8 slots: ..." ("" without such a level, or its cause)."""
        step = self.failed_at()
        return f"fails {step.scale:.3g}x the trace's rate: {step.cause}" if step is not None and step.cause else ""

    def caveats(self) -> list[str]:
        """What a reader must know before trusting the number: unstable, client-limited, ..."""
        out = ["unstable (a repeated level disagreed with its first measurement)"] if self.unstable else []
        note = VERDICT_NOTES.get(self.verdict)
        return out + [note] if note else out

    def confirmation(self) -> str:
        """How the failing level at the top of the bracket stands: "confirmed by a repeat", or a
        clear fail the guided rules did not repeat (`capacity.response.repeat_rule`)."""
        top = [s for s in self.steps if self.bracket_high is not None and math.isclose(s.scale, self.bracket_high)]
        if any(s.repeat for s in top) or not top:
            return "confirmed by a repeat"
        clear = any(s.repeat_rule.startswith("clear") for s in top)
        return "a clear fail, so not repeated" if clear else "not repeated"

    def headline(self) -> str:
        """One line for people: capacity with its bracket and how sure it is."""
        if self.capacity_scale is None and self.verdict == Verdict.CLIENT_OVERLOADED:
            return (f"capacity not measurable: the client could not keep the schedule at "
                    f"{self.bracket_high:g}x the trace's rate (schedule lag p99 "
                    f"{max(s.lag_p99_s for s in self.steps) * 1000:.0f} ms)")
        if self.verdict == Verdict.MACHINE_BUSY:
            busy = [s for s in self.steps if s.machine_busy and not s.passed]
            low = f"at least {self.capacity_rps:.3g} req/s" if self.capacity_scale else "not measurable"
            return (f"capacity {low}: other work on this machine took the engine's cores at "
                    f"{self.bracket_high:g}x the trace's rate, again after waiting for quiet "
                    f"({busy[-1].machine_busy if busy else 'machine busy'})")
        if self.capacity_scale is None and self.verdict == Verdict.LOAD_INDEPENDENT:
            return (f"capacity 0: fails at every load tried, down to {min(s.scale for s in self.steps):g}x the "
                    f"trace's rate, and lowering the load did not help: the misses do not come from the rate "
                    f"(e.g. bursts of the trace this config cannot serve within the SLO)")
        if self.verdict == Verdict.PRUNED and self.bracket_high is not None:  # pruned at a failing level
            low = f"{self.capacity_rps:.3g}" if self.capacity_scale else "0"
            high = self.bracket_high * self.base_rps
            return (f"pruned: fails {self.bracket_high:.3g}x the trace's rate ({high:.3g} "
                    f"req/s, {self.confirmation()}), where the configuration cannot be on the front (an "
                    f"incumbent as good on every other objective passes, or it missed the SLOs at the trace's rate): "
                    f"capacity [{low}, {high:.3g}] req/s, not searched further")
        if self.verdict == Verdict.PRUNED and self.capacity_scale is not None:  # no level failed: a lower bound
            return (f"capacity at least {self.capacity_rps:.3g} req/s = {self.capacity_scale:.3g}x the trace's rate "
                    f"(pruned: the trial cannot be on the front whatever its capacity, so it was searched no "
                    f"further)")
        if self.capacity_scale is None:
            return (f"capacity 0: not even {min(s.scale for s in self.steps):g}x the trace's rate met the SLO "
                    f"({self.attainment_target:.0%} attainment; the search goes no lower)") if self.steps \
                else "capacity not measured"
        top = "" if self.bracket_high is None else f", {self.bracket_high * self.base_rps:.3g}"
        text = (f"capacity {self.capacity_rps:.3g} req/s [{self.capacity_rps:.3g}{top}] = {self.capacity_scale:.3g}x "
                f"the trace's rate, {self.capacity_output_tps:.3g} output tok/s")
        if self.gpus > 1:
            text += f", {self.capacity_rps_per_gpu:.3g} req/s per GPU"
        notes = {Verdict.ABOVE_MAX: f"never failed up to {self.capacity_scale:g}x (the search's ceiling)",
                 Verdict.CLIENT_OVERLOADED: "the client could not keep the schedule above this level: a lower bound",
                 Verdict.MAX_STEPS: "step budget spent before the bracket reached the precision"}
        if self.verdict in notes:
            text += f" · {notes[self.verdict]}"
        if self.unstable:
            text += " · UNSTABLE: a repeated level disagreed with its first measurement (a third decided)"
        return text


# -- a stored result (`CapacityResult.as_dict()`) in words -------------------------------------------
def bracket_rps(cap: Stored | None) -> tuple[float, float | None]:
    """A stored result's [highest passing, lowest failing] offered requests/s (`CapacityResult.bracket_rps`)."""
    return CapacityResult.from_dict(cap).bracket_rps() if cap else (math.nan, None)


def bracket_text(cap: Stored | None, *, per_gpu: bool = False) -> str:
    """A stored result's bracket in words (`CapacityResult.bracket_text`; "" without one)."""
    return CapacityResult.from_dict(cap).bracket_text(per_gpu=per_gpu) if cap else ""


def failure_cause(cap: Stored | None) -> str:
    """A stored result's cause of the failed level that bounds it (`CapacityResult.failed_at`; "" without one)."""
    step = CapacityResult.from_dict(cap).failed_at() if cap else None
    return step.cause if step is not None else ""


def caveats(cap: Stored | None) -> list[str]:
    """A stored result's caveats (`CapacityResult.caveats`; none without one)."""
    return CapacityResult.from_dict(cap).caveats() if cap else []


def _ratio(value: float, per: float) -> float:
    """`value / per` such that `per * ratio` gives `value` back exactly (0 where it cannot be
    derived): a stored product read back into its factor, so writing it again changes no digit."""
    if not (math.isfinite(value) and per > 0):
        return 0.0
    ratio = value / per
    for _ in range(2):
        if per * ratio == value:
            break
        ratio = math.nextafter(ratio, math.inf if per * ratio < value else -math.inf)
    return ratio
