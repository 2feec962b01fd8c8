"""Capacity at the SLO as the dashboard shows it: plain functions over a run's capacity search
(`capacity.step.CapacityResult`, read back from the summary it is stored in), no Streamlit, no plotly.

Capacity is the highest load (the trace replayed k times faster) at which the SLO still holds for
the attainment target's share of requests; it is a bracket [highest pass, lowest fail], found by a
search of load levels ("steps") that this module turns into rows for tables and charts.
"""

from __future__ import annotations

import dataclasses
import enum
import math

from tracetune.capacity.step import CapacityResult, Outcome, Step
from tracetune.replay.metrics import Summary


def capacity_of(summary: Summary | None) -> CapacityResult | None:
    """The capacity result of a run (None when the run has none)."""
    cap = summary.capacity if summary is not None else None
    return CapacityResult.from_dict(cap) if isinstance(cap, dict) and cap.get("steps") is not None else None


def flags(cap: CapacityResult | None) -> list[str]:
    """What a reader must know before trusting the number (`CapacityResult.caveats`; none without one)."""
    return cap.caveats() if cap else []


def bracket_text(cap: CapacityResult | None, *, per_gpu: bool = False) -> str:
    """The bracket in words (`CapacityResult.bracket_text`; "" without one)."""
    return cap.bracket_text(per_gpu=per_gpu) if cap else ""


def table_columns(summary: Summary | None) -> dict[str, str]:
    """The Trials table's extra capacity columns for one run ('' when it has no capacity)."""
    cap = capacity_of(summary)
    text = bracket_text(cap, per_gpu=True)  # per GPU, like the capacity column
    if cap and cap.gpus > 1:
        text += f" ({cap.bracket_text()} on {cap.gpus} GPUs)"
    return {"capacity bracket": text, "capacity notes": "; ".join(flags(cap))}


class LevelKind(enum.StrEnum):
    """How a load level ended, as the chart draws it: its `Step.outcome`, a client-limited level apart."""

    PASSED = "passed"
    FAILED = "failed"
    ABANDONED = "abandoned"
    CLIENT_LIMITED = "client-limited"
    MACHINE_BUSY = "machine busy"


_KIND = {Outcome.PASS: LevelKind.PASSED, Outcome.FAIL: LevelKind.FAILED, Outcome.ABANDONED: LevelKind.ABANDONED}


def step_kind(step: Step) -> LevelKind:
    """passed | failed | abandoned | client-limited | machine busy: how a load level ended (a level that
    did not pass because the client could not keep its schedule is client-limited, one during which other
    work took the engine's cores is machine busy, whatever its outcome)."""
    if step.outcome is not Outcome.PASS and step.machine_busy:  # a busy machine starves the client too
        return LevelKind.MACHINE_BUSY
    if step.outcome is not Outcome.PASS and step.client_overloaded:
        return LevelKind.CLIENT_LIMITED
    return _KIND[step.outcome]


@dataclasses.dataclass(frozen=True)
class Level:
    """One measured load level as a chart point: its place in the search, load, attainment, kind, hover line."""

    index: int
    scale: float
    rps: float
    attainment: float
    kind: LevelKind
    repeat: bool
    hover: str


def steps(cap: CapacityResult | None) -> list[Level]:
    """The measured load levels in the order measured, each with its kind and a hover line."""
    out = []
    for i, step in enumerate(cap.steps if cap else []):
        kind = step_kind(step)
        # An abandoned level stopped once it could no longer pass: its attainment is the most it could reach.
        attained = (f"attainment <= {step.attainment:.0%} (abandoned after {step.requests} of {step.planned} sent: "
                    f"more certain misses than the target allows)" if step.abandoned else
                    f"attainment {step.attainment:.0%} ({step.good}/{step.planned} good)")
        hover = (f"step {i + 1}: load {step.scale:.3g}x = {step.rps:.3g} req/s"
                 f"<br>{attained}<br>{kind}" + (" (repeat)" if step.repeat else "")
                 + f"<br>schedule lag p99 {step.lag_p99_s * 1000:.0f} ms"
                 + (f"<br>{step.machine_busy}" if step.machine_busy else ""))
        out.append(Level(i, step.scale, step.rps, step.attainment, kind, step.repeat, hover))
    return out


def capacity_point(cap: CapacityResult | None) -> tuple[float, float] | None:
    """(offered req/s, attainment) of the capacity level (None when no level passed)."""
    if not cap or not cap.capacity_scale:
        return None
    scale = cap.capacity_scale
    passing = [s for s in steps(cap) if s.kind == LevelKind.PASSED and math.isclose(s.scale, scale, rel_tol=1e-6)]
    if not passing:
        return cap.capacity_rps, cap.attainment_target
    return passing[-1].rps, passing[-1].attainment


def headline(cap: CapacityResult | None) -> str:
    """Capacity in one line: per GPU, total, bracket, load factor, the SLO it holds, and its flags."""
    if not cap:
        return "capacity not measured"
    slo = ", ".join(cap.slos) or "the SLO"
    text = (f"capacity {cap.capacity_rps_per_gpu:.3g} req/s per GPU"
            + (f" ({cap.capacity_rps:.3g} req/s on {cap.gpus} GPUs)" if cap.gpus > 1 else "")
            + f", bracket {cap.bracket_text()}, {cap.capacity_scale or 0.0:.3g}x the trace's rate, "
            f"with {cap.attainment_target:.0%} of requests within {slo}")
    notes = flags(cap)
    return text + (" · " + "; ".join(notes) if notes else "")


def header_lines(cap: CapacityResult | None) -> list[str]:
    """Export comment lines: the SLO, the attainment target, the capacity and its bracket."""
    if not cap:
        return []
    lines = [f"SLO: {', '.join(cap.slos) or '-'}; attainment target {cap.attainment_target:.0%} of requests",
             f"capacity at the SLO: {cap.capacity_rps:.3g} req/s on {cap.gpus} GPU(s) "
             f"= {cap.capacity_rps_per_gpu:.3g} req/s per GPU "
             f"({cap.capacity_scale or 0.0:.3g}x the trace's rate); bracket {cap.bracket_text()}"
             + (f" = {cap.bracket_text(per_gpu=True)}" if cap.gpus > 1 else "")]
    notes = flags(cap)
    if notes:
        lines.append("capacity caveats: " + "; ".join(notes))
    return lines
