"""Capacity at the SLO as the dashboard shows it: plain functions over the `capacity` dict the tuner
stores in a run's summary (`capacity.step.CapacityResult.as_dict()`), no Streamlit, no plotly.

Capacity is the highest load (the trace replayed k times faster) at which the SLO still holds for
the attainment target's share of requests; it is a bracket [highest pass, lowest fail], found by a
search of load levels ("steps") that this module turns into rows for tables and charts.
"""

from __future__ import annotations

import math
from typing import Any

# The bracket and its caveats are written one way, by the module that defines them.
from tracetune.capacity.step import bracket_rps, bracket_text, number  # noqa: F401  (bracket_rps: for the charts)
from tracetune.capacity.step import caveats as flags


def capacity_of(summary: dict[str, Any] | None) -> dict[str, Any] | None:
    """The stored capacity result of a run (None when the run has none)."""
    cap = (summary or {}).get("capacity")
    return cap if isinstance(cap, dict) and cap.get("steps") is not None else None


def table_columns(summary: dict[str, Any] | None) -> dict[str, str]:
    """The Trials table's extra capacity columns for one run ('' when it has no capacity)."""
    cap = capacity_of(summary)
    text = bracket_text(cap, per_gpu=True)  # per GPU, like the capacity column
    if cap and int(cap.get("gpus") or 1) > 1:
        text += f" ({bracket_text(cap)} on {int(cap['gpus'])} GPUs)"
    return {"capacity bracket": text, "capacity notes": "; ".join(flags(cap))}


def step_kind(step: dict[str, Any]) -> str:
    """passed | failed | abandoned | client-limited: how a load level ended."""
    if step.get("passed"):
        return "passed"
    if step.get("client_overloaded"):
        return "client-limited"
    return "abandoned" if step.get("abandoned") else "failed"


def steps(cap: dict[str, Any] | None) -> list[dict[str, Any]]:
    """The measured load levels in the order measured, each with its kind and a hover line."""
    out = []
    for i, step in enumerate((cap or {}).get("steps") or []):
        kind = step_kind(step)
        sent = step.get("requests", 0)
        planned = step.get("planned", 0)
        # An abandoned level stopped once it could no longer pass: its attainment is the most it could reach.
        attained = (f"attainment <= {number(step.get('attainment')):.0%} (abandoned after {sent} of {planned} sent: "
                    f"more certain misses than the target allows)" if step.get("abandoned") else
                    f"attainment {number(step.get('attainment')):.0%} ({step.get('good', '?')}/{planned} good)")
        hover = (f"step {i + 1}: load {number(step.get('scale')):.3g}x = {number(step.get('rps')):.3g} req/s"
                 f"<br>{attained}<br>{kind}" + (" (repeat)" if step.get("repeat") else "")
                 + f"<br>schedule lag p99 {number(step.get('lag_p99_s')) * 1000:.0f} ms")
        out.append({"index": i, "scale": number(step.get("scale")), "rps": number(step.get("rps")),
                    "attainment": number(step.get("attainment")), "kind": kind, "repeat": bool(step.get("repeat")),
                    "hover": hover})
    return out


def capacity_point(cap: dict[str, Any] | None) -> tuple[float, float] | None:
    """(offered req/s, attainment) of the capacity level (None when no level passed)."""
    if not cap or not cap.get("capacity_scale"):
        return None
    scale = number(cap["capacity_scale"])
    passing = [s for s in steps(cap) if s["kind"] == "passed" and math.isclose(s["scale"], scale, rel_tol=1e-6)]
    if not passing:
        return number(cap.get("capacity_rps")), number(cap.get("attainment_target"))
    return passing[-1]["rps"], passing[-1]["attainment"]


def headline(cap: dict[str, Any] | None) -> str:
    """Capacity in one line: per GPU, total, bracket, load factor, the SLO it holds, and its flags."""
    if not cap:
        return "capacity not measured"
    gpus = max(int(cap.get("gpus") or 1), 1)
    slo = ", ".join(cap.get("slo") or []) or "the SLO"
    target = number(cap.get("attainment_target"))
    text = (f"capacity {number(cap.get('capacity_rps_per_gpu')):.3g} req/s per GPU"
            + (f" ({number(cap.get('capacity_rps')):.3g} req/s on {gpus} GPUs)" if gpus > 1 else "")
            + f", bracket {bracket_text(cap)}, {number(cap.get('capacity_scale')):.3g}x the trace's rate, "
            f"with {target:.0%} of requests within {slo}")
    notes = flags(cap)
    return text + (" · " + "; ".join(notes) if notes else "")


def header_lines(cap: dict[str, Any] | None) -> list[str]:
    """Export comment lines: the SLO, the attainment target, the capacity and its bracket."""
    if not cap:
        return []
    gpus = max(int(cap.get("gpus") or 1), 1)
    lines = [f"SLO: {', '.join(cap.get('slo') or []) or '-'}; attainment target "
             f"{number(cap.get('attainment_target')):.0%} of requests",
             f"capacity at the SLO: {number(cap.get('capacity_rps')):.3g} req/s on {gpus} GPU(s) "
             f"= {number(cap.get('capacity_rps_per_gpu')):.3g} req/s per GPU "
             f"({number(cap.get('capacity_scale')):.3g}x the trace's rate); bracket {bracket_text(cap)}"
             + (f" = {bracket_text(cap, per_gpu=True)}" if gpus > 1 else "")]
    notes = flags(cap)
    if notes:
        lines.append("capacity caveats: " + "; ".join(notes))
    return lines
