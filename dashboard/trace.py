"""The trace a study replayed, as the dashboard shows it: its rate over time (the profile the main job
keeps with the study, `replay.profile`) with the windows a trial's load levels replayed marked on it
(`capacity.segments`: the busiest, the one with most tokens, the others by load). Plain functions and
one plotly figure; the page is `views.page_detail`."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from tracetune.dashboard import capacity
from tracetune.dashboard.storage import optuna_storage
from tracetune.replay.metrics import Summary
from tracetune.stored import Stored, listed, number
from tracetune.tuner.trial_record import StudyAttr

if TYPE_CHECKING:
    import plotly.graph_objects as go

KIND_COLORS = {"busiest": "rgba(214, 39, 40, 0.25)", "busiest by tokens": "rgba(255, 127, 14, 0.25)",
               "by load": "rgba(31, 119, 180, 0.18)"}


def stored_profile(url: str, name: str) -> Stored | None:
    """The trace profile kept with study `name` (`replay.profile.TraceProfile.as_dict()`; None for a
    study from before it was kept)."""
    import optuna

    study = optuna.load_study(study_name=name, storage=optuna_storage(url))
    found = study.user_attrs.get(StudyAttr.TRACE_PROFILE)
    return found if isinstance(found, dict) and found.get("over_time") else None


@dataclasses.dataclass
class Window:
    """A window of the trace that load levels replayed (`capacity.segments`), and the levels (k) that did."""

    start_s: float
    end_s: float
    kind: str  # busiest | busiest by tokens | by load
    levels: list[float] = dataclasses.field(default_factory=list)


def parts_replayed(summary: Summary | None) -> list[Window]:
    """Every window of the trace a run's load levels replayed, once each, with the levels (k) that
    replayed it; empty when every level replayed the whole trace."""
    seen: dict[tuple[float, float], Window] = {}
    cap = capacity.capacity_of(summary)
    for step in cap.steps if cap else []:
        for part in step.parts or []:
            key = (round(float(part["start_s"]), 3), round(float(part["end_s"]), 3))
            seen.setdefault(key, Window(key[0], key[1], str(part["kind"]))).levels.append(step.scale or 0.0)
    return sorted(seen.values(), key=lambda p: p.start_s)


def rate_figure(profile: Stored, parts: list[Window], title: str) -> go.Figure:
    """The trace's arrivals per second over time (minutes), the replayed windows shaded by kind."""
    import plotly.graph_objects as go

    width = number(profile["over_time_s"])
    rates = [number(v) for v in listed(profile["over_time"])]
    minutes = [(i + 0.5) * width / 60 for i in range(len(rates))]
    fig = go.Figure(go.Scatter(x=minutes, y=rates, mode="lines", line={"shape": "hvh", "color": "#444"},
                               name="arrivals/s", hovertemplate="%{x:.1f} min: %{y:.3g} req/s<extra></extra>"))
    for kind, color in KIND_COLORS.items():
        mine = [p for p in parts if p.kind == kind]
        for p in mine:
            fig.add_vrect(x0=p.start_s / 60, x1=p.end_s / 60, fillcolor=color, line_width=0, layer="below")
        if mine:  # one legend entry per kind
            fig.add_trace(go.Scatter(x=[None], y=[None], mode="markers", name=f"{kind} ({len(mine)})",
                                     marker={"size": 12, "symbol": "square", "color": color}))
    top = max(rates, default=0.0)
    fig.update_layout(title=title, xaxis_title="trace time (min)", yaxis_title="arrivals per second",
                      yaxis_range=[0, top * 1.1 if top > 0 else 1], height=320,
                      legend={"orientation": "h", "y": -0.3}, margin={"t": 50, "b": 10})
    return fig


def caption(profile: Stored, parts: list[Window]) -> str:
    """What the chart shows, in a line: the trace and what the levels replayed of it."""
    trace = (f"{profile['requests']} requests over {number(profile['duration_s']) / 60:.1f} min, "
             f"{number(profile['mean_rps']):.3g} req/s on average")
    if not parts:
        return f"The trace: {trace}. Every load level replayed the whole trace."
    return (f"The trace: {trace}. Shaded: the {len(parts)} windows this run's load levels replayed (each level "
            f"replays the busiest window, then windows by load until the whole trace's attainment is decided).")
