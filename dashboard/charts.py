"""Plotly figures for the dashboard, built from `dashboard.data` views (no Streamlit here)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, TypedDict

from tracetune.capacity.step import CapacityResult
from tracetune.dashboard import capacity, judged
from tracetune.dashboard.banners import on_random_weights
from tracetune.dashboard.data import StudyView, TrialView, diff_text, front_line
from tracetune.dashboard.metrics import display_value, metric_label, quality_text
from tracetune.dashboard.progress import ProgressPoint
from tracetune.dashboard.records import latency_cdfs, request_records, timeline
from tracetune.dashboard.study_view import REFERENCE_TITLE

if TYPE_CHECKING:
    import plotly.graph_objects as go


class MarkerStyle(TypedDict):
    """How a kind of point is drawn: its legend name, colour, plotly symbol and size."""

    name: str
    color: str
    symbol: str
    size: float


class CategoryStyle(MarkerStyle):
    opacity: float


STYLE: dict[str, CategoryStyle] = {
    "pareto": dict(name="Pareto front", color="#1f6feb", symbol="circle", size=15, opacity=1.0),
    "tie": dict(name="tied with the front, inside the intervals", color="#1f6feb", symbol="circle-open", size=13,
                opacity=0.9),
    "dominated": dict(name="dominated", color="#8c959f", symbol="circle", size=10, opacity=0.7),
    "infeasible": dict(name="violates SLO / quality gate", color="#d97706", symbol="x", size=12, opacity=0.9),
    # named per study by `_outside_gate_name`
    "outside_gate": dict(name="outside the quality gate", color="#dc2626", symbol="diamond-x", size=15, opacity=1.0),
}
REFERENCE_STYLE: MarkerStyle = dict(name="reference (unquantized)", color="#16a34a", symbol="star", size=20)
PALETTE = ["#1f6feb", "#d97706", "#16a34a", "#9333ea"]


# -- thresholds ----------------------------------------------------------------------------------
def thresholds(study: StudyView) -> dict[str, list[tuple[str, float]]]:
    """Lines to draw per metric: SLOs (`ttft:p99<500ms` -> ttft_p99 at 0.5 s) and the quality gate."""
    out: dict[str, list[tuple[str, float]]] = {}
    for slo in study.parsed_slos:
        out.setdefault(f"{slo.metric}_{slo.stat}", []).append((f"SLO {slo}", slo.threshold_s))
    if study.max_quality_loss is not None:
        out.setdefault("quality_loss", []).append((f"quality gate {study.max_quality_loss:g}", study.max_quality_loss))
    gate = study.quality_gate
    if gate is not None and gate.unit != "nats":
        metric = {"kld": "kld", "ppl": "ppl_change", "top1": "top1_agreement"}[gate.unit]
        out.setdefault(metric, []).append((f"quality gate {gate} (beyond the noise floor)", gate.limit))
    return out


def floor_band(study: StudyView, metric: str) -> tuple[float, float] | None:
    """The range of a quality metric that the reference's own noise covers (drawn as a band): what a
    configuration measures inside it cannot be told apart from the reference."""
    floor = study.noise_floor
    unit = {"quality_loss": "nll", "kld": "kld", "ppl_change": "ppl", "top1_agreement": "top1"}.get(metric)
    if unit not in floor:
        return None
    est = floor[unit]
    if unit == "top1":
        return min(1.0, est.low), 1.0
    return min(0.0, est.low), max(0.0, est.high)


def _hover(study: StudyView, t: TrialView) -> str:
    values = "<br>".join(f"{o}: {display_value(o, t.metric(o))}" for o in study.objectives)
    diff = diff_text(t.diff).replace(", ", "<br>  ")
    beaten = f"<br>{study.reference_name} beat it on every objective" if t.beaten_by_reference else ""
    gate = f"<br><b>{judged.gate_phrase(t.gate_decision)} {study.gate_words}</b>" if t.outside_gate else ""
    why = "".join(f"<br>{v}" for v in t.violations
                  if not v.startswith(("outside the quality gate", "undecided against the quality gate")))
    quality = "not measurable (random weights)" if on_random_weights(study) else \
        quality_text(t.quality).replace(" · ", "<br>  ")
    return (f"<b>trial {t.number}</b> ({t.category}){beaten}{gate}{why}<br>{values}<br>quality: "
            f"{quality}<br>config vs reference:<br>  {diff}")


def _reference_hover(study: StudyView, axes: Sequence[str], ref: Sequence[float]) -> str:
    hover = "<b>reference</b> (unquantized weights, auto KV cache, no speculation)<br>" + "<br>".join(
        f"{a}: {display_value(a, v)}" for a, v in zip(axes, ref))
    if study.decision is not None and study.decision.reference_is_best:
        hover += f"<br><b>best by {study.decision.by}</b>: no trial beats {study.reference_name}"
    elif study.decision is not None and study.decision.reference_breach:
        hover += f"<br><b>breaks the SLO</b>: {study.decision.reference_breach} (the reference, not a candidate)"
    return hover


def chart_category(t: TrialView) -> str:
    """How a trial is drawn: its category, except that a point whose quality breaks the gate is
    drawn as outside it (a front point of a study without a gate, or one only the gate kept off)."""
    if (t.category in ("pareto", "tie") and t.outside_gate) or (t.category == "infeasible" and t.only_the_gate):
        return "outside_gate"
    return t.category


def _outside_gate_name(study: StudyView) -> str:
    if study.gate_off:
        words = {judged.gate_phrase(t.gate_decision) for t in study.trials if t.outside_gate}
        where = "undecided against" if words == {"undecided against"} else \
            "outside or undecided against" if len(words) > 1 else "outside"
        return f"on the front, {where} the default gate {study.shown_gate} (no gate set)"
    return f"outside the quality gate {study.shown_gate} only (SLOs kept)"


def _scaled(values: Sequence[float], name: str) -> list[float | None]:
    _, factor = metric_label(name)
    return [None if v is None or math.isnan(v) else v * factor for v in values]


def pareto_figure(study: StudyView, x: str, y: str, z: str | None = None):
    """Trials on two (or three) metrics: front, dominated and infeasible trials in their own styles,
    the reference marked, SLO / quality-gate thresholds as lines, the 2-D front as a staircase."""
    import plotly.graph_objects as go

    fig = go.Figure()
    axes = [x, y] + ([z] if z else [])
    for category, style in STYLE.items():
        trials = [t for t in study.trials if chart_category(t) == category
                  and not any(math.isnan(t.metric(a)) for a in axes)]
        if not trials:
            continue
        coords = {a: _scaled([t.metric(a) for t in trials], a) for a in axes}
        marker = dict(color=style["color"], symbol=style["symbol"], size=style["size"], opacity=style["opacity"],
                      line=dict(width=1.5, color="#0b3d91") if category == "pareto" else
                      dict(width=1.5, color="#7f1d1d") if category == "outside_gate" else dict(width=0))
        name = _outside_gate_name(study) if category == "outside_gate" else style["name"]
        common = dict(mode="markers+text", name=f"{name} ({len(trials)})",
                      text=[f"{t.number}" for t in trials],
                      # a tie often sits on the point it ties with: its label goes below, the other's above
                      textposition="bottom center" if category == "tie" else "top center",
                      hovertext=[_hover(study, t) for t in trials], hoverinfo="text",
                      customdata=[t.number for t in trials])
        if z:
            marker["size"] = style["size"] * 0.6
            fig.add_trace(go.Scatter3d(x=coords[x], y=coords[y], z=coords[z], marker=marker, **common))
        else:
            fig.add_trace(go.Scatter(x=coords[x], y=coords[y], marker=marker, error_x=_error_bars(trials, x),
                                     error_y=_error_bars(trials, y), **common))
    ref = [study.reference_metric(a) for a in axes]
    if not any(math.isnan(v) for v in ref):
        r = {a: _scaled([v], a) for a, v in zip(axes, ref)}
        ref_marker = dict(color=REFERENCE_STYLE["color"], symbol=REFERENCE_STYLE["symbol"],
                          size=REFERENCE_STYLE["size"], line=dict(width=1, color="#14532d"))
        hover = _reference_hover(study, axes, ref)
        ref_common = dict(mode="markers+text", name=REFERENCE_STYLE["name"], text=["ref"],
                          textposition="bottom center", hovertext=[hover], hoverinfo="text")
        if z:
            ref_marker["size"] = 12
            ref_marker["symbol"] = "diamond"
            fig.add_trace(go.Scatter3d(x=r[x], y=r[y], z=r[z], marker=ref_marker, **ref_common))
        else:
            run = [study.reference_run] if study.reference_run is not None else []
            fig.add_trace(go.Scatter(x=r[x], y=r[y], marker=ref_marker, error_x=_error_bars(run, x),
                                     error_y=_error_bars(run, y), **ref_common))
    if not z:
        xs, ys = front_line(study.trials, x, y)
        if len(xs) > 1:
            fig.add_trace(go.Scatter(x=_scaled(xs, x), y=_scaled(ys, y), mode="lines", name="front on these axes",
                                     line=dict(color="#1f6feb", dash="dot", width=1.5), hoverinfo="skip"))
        lines = thresholds(study)
        bands = {a: band for a in (x, y) if (band := floor_band(study, a)) is not None}
        _draw_floor_bands(fig, bands, x, y)
        for label, value in lines.get(x, []):
            fig.add_vline(x=_scaled([value], x)[0], line=dict(color="#dc2626", dash="dash"),
                          annotation_text=label, annotation_position="top left")
        for label, value in lines.get(y, []):
            fig.add_hline(y=_scaled([value], y)[0], line=dict(color="#dc2626", dash="dash"),
                          annotation_text=label, annotation_position="bottom right")
        fig.update_layout(xaxis_title=metric_label(x)[0], yaxis_title=metric_label(y)[0])
        # Room around the points, their error bars, the thresholds and bands, so nothing is cut at the edge.
        for axis, name in (("xaxis", x), ("yaxis", y)):
            values: list[float | None] = [v for trace in fig.data for v in _extent(trace, axis[0])]
            values += [_scaled([value], name)[0] for _, value in lines.get(name, [])]
            values += _scaled(list(bands.get(name, ())), name)
            span = axis_range(values, pad_share=0.12)
            if span:
                fig.update_layout({axis: dict(range=span)})
    else:
        fig.update_layout(scene=dict(xaxis_title=metric_label(x)[0], yaxis_title=metric_label(y)[0],
                                     zaxis_title=metric_label(z)[0], aspectmode="cube"),
                          scene_camera=dict(eye=dict(x=1.6, y=1.6, z=1.1)))
    fig.update_layout(height=680 if z else 600, margin=dict(l=10, r=10, t=40, b=10), legend=LEGEND_BELOW,
                      title=f"study {study.name}: {len([t for t in study.trials if t.measured])} measured of "
                            f"{len(study.trials)} trials", template="plotly_white")
    return fig


# Legends below the plot area, never over the data (plotly grows the margin to fit them).
LEGEND_BELOW = dict(orientation="h", yanchor="top", y=-0.18, xanchor="left", x=0.0)


def axis_range(values: Sequence[float | None], *, log: bool = False, pad_share: float = 0.08) -> list[float] | None:
    """An axis range holding every finite value with a margin (None: nothing to hold). On a log axis
    only positive values count, and the range is in powers of ten, as plotly takes it."""
    finite = [v for v in values if v is not None and math.isfinite(v) and (v > 0 or not log)]
    if not finite:
        return None
    if log:
        finite = [math.log10(v) for v in finite]
    lo, hi = min(finite), max(finite)
    pad = (hi - lo) * pad_share or (0.05 if log else abs(hi) * 0.1 or 1.0)
    return [lo - pad, hi + pad]


def log_ticks(values: Sequence[float]) -> dict[str, list]:
    """Tick values and labels of a log axis over the positive `values`, each a whole number (20, 30, ...
    90 req/s; 1, 2, 5 per decade over a wide range): plotly's own labels inside one decade read "2 ... 9"."""
    positive = [v for v in values if math.isfinite(v) and v > 0]
    if not positive:
        return {}
    lo, hi = min(positive), max(positive)
    leading = range(1, 10) if hi / lo < 30 else (1, 2, 5)
    ticks = [m * 10.0 ** k for k in range(math.floor(math.log10(lo)) - 1, math.ceil(math.log10(hi)) + 1)
             for m in leading if lo / 1.3 <= m * 10.0 ** k <= hi * 1.3]
    return dict(tickvals=ticks, ticktext=[f"{v:g}" for v in ticks]) if len(ticks) >= 2 else {}


def _extent(trace: go.Scatter, axis: str) -> list[float]:
    """A 2-D trace's coordinates on one axis ("x" or "y"), each widened by its error bar."""
    values = [v for v in (getattr(trace, axis, None) or []) if v is not None]
    bars = getattr(trace, f"error_{axis}", None)
    if bars is None or not bars.visible or bars.array is None:
        return values
    plus, minus = list(bars.array), list(bars.arrayminus if bars.arrayminus is not None else bars.array)
    return values + [v + p for v, p in zip(values, plus)] + [v - m for v, m in zip(values, minus)]


def _error_bars(trials: Sequence[TrialView], metric: str) -> dict[str, str | float | bool | list[float]]:
    """95% intervals as error bars (none where a point was measured without one)."""
    if not trials:
        return dict(visible=False)
    _, factor = metric_label(metric)
    plus: list[float] = []
    minus: list[float] = []
    for t in trials:
        value, interval = t.metric(metric), t.interval(metric)
        if interval is None or math.isnan(value):
            interval = (value, value)  # no bar
        plus.append(max(interval[1] - value, 0.0) * factor if not math.isnan(value) else 0.0)
        minus.append(max(value - interval[0], 0.0) * factor if not math.isnan(value) else 0.0)
    return dict(type="data", symmetric=False, array=plus, arrayminus=minus, thickness=1.2, width=3,
                visible=any(plus) or any(minus))


def _draw_floor_bands(fig: go.Figure, bands: dict[str, tuple[float, float]], x: str, y: str) -> None:
    """The reference's own noise on a quality axis, as a grey band (a line where it is zero wide)."""
    style = dict(fillcolor="#94a3b8", opacity=0.25, line=dict(color="#64748b", width=1, dash="dot"), layer="below",
                 annotation_text="noise floor (reference vs itself)")
    if x in bands:
        lo, hi = _scaled(list(bands[x]), x)
        fig.add_vrect(x0=lo, x1=hi, annotation_position="bottom left", **style)
    if y in bands:
        lo, hi = _scaled(list(bands[y]), y)
        fig.add_hrect(y0=lo, y1=hi, annotation_position="top left", **style)


def cdf_figure(trials: Sequence[TrialView], metric: str, titles: Sequence[str] = ()):
    """Empirical CDF of one latency (ttft | itl | e2e) for one or more trials, in ms; `titles`: each
    trial's name in the legend (`StudyView.title`; default: its label, as the tables show it)."""
    import plotly.graph_objects as go

    fig = go.Figure()
    longest = 0.0
    for i, t in enumerate(trials):
        xs, ys = latency_cdfs(request_records(t))[metric]
        longest = max([longest, *(v * 1000 for v in xs if math.isfinite(v))])
        fig.add_trace(go.Scatter(x=[v * 1000 for v in xs], y=ys, mode="lines", line_shape="hv",
                                 name=titles[i] if titles else t.label,
                                 line=dict(color=PALETTE[i % len(PALETTE)], width=2,
                                           dash="dash" if t.is_reference else "solid")))
    fig.update_layout(title=f"{metric.upper()} CDF", xaxis_title=f"{metric.upper()} (ms)",
                      yaxis_title="fraction of requests", yaxis_range=[0, 1.02], height=320,
                      # a margin past the slowest request: each curve's last step is seen reaching 1
                      xaxis_range=[0, longest * 1.06] if longest > 0 else None,
                      margin=dict(l=10, r=10, t=40, b=10), template="plotly_white", showlegend=len(trials) > 1,
                      legend=LEGEND_BELOW)
    return fig


def timeline_figure(trial: TrialView) -> go.Figure:
    """Send time (since replay start) vs latency per request: E2E and TTFT, failures in red."""
    import plotly.graph_objects as go

    rows = timeline(request_records(trial))
    fig = go.Figure()
    ok = [r for r in rows if r.success]
    bad = [r for r in rows if not r.success]
    hover = [f"request {r.index}<br>sent {r.send_s:.2f} s<br>TTFT {display_value('ttft_p50', r.ttft_s)}"
             f"<br>E2E {display_value('e2e_p50', r.e2e_s)}<br>{r.output_tokens} output tokens" for r in ok]
    fig.add_trace(go.Scatter(x=[r.send_s for r in ok], y=[r.e2e_s * 1000 for r in ok], mode="markers",
                             name="E2E", marker=dict(color="#1f6feb", size=9), hovertext=hover, hoverinfo="text"))
    fig.add_trace(go.Scatter(x=[r.send_s for r in ok], y=[(r.ttft_s or 0) * 1000 for r in ok], mode="markers",
                             name="TTFT", marker=dict(color="#d97706", size=7, symbol="diamond"), hovertext=hover,
                             hoverinfo="text"))
    if bad:
        fig.add_trace(go.Scatter(x=[r.send_s for r in bad], y=[r.e2e_s * 1000 for r in bad], mode="markers",
                                 name="failed", marker=dict(color="#dc2626", size=10, symbol="x"),
                                 hovertext=[r.error[:200] for r in bad], hoverinfo="text"))
    fig.update_layout(title="request timeline", xaxis_title="send time since replay start (s)",
                      yaxis_title="latency (ms)", height=340, margin=dict(l=10, r=10, t=40, b=10),
                      template="plotly_white", legend=LEGEND_BELOW)
    return fig


# How each kind of load level is drawn on the attainment-versus-load chart.
STEP_STYLE = {
    "passed": dict(symbol="circle", size=10),
    "failed": dict(symbol="x", size=11),
    "abandoned": dict(symbol="triangle-down-open", size=12),
    "client-limited": dict(symbol="diamond-open", size=12),
    "machine busy": dict(symbol="square-open", size=12),
}


def capacity_curves(study: StudyView, trials: Sequence[TrialView]) -> list[tuple[str, CapacityResult]]:
    """(label, capacity result) for each trial that has one, then the reference's when it has one."""
    curves = [(study.title(t), t.capacity) for t in trials if t.measured and not t.is_reference]
    curves.append((study.reference_title, capacity.capacity_of(study.reference_summary)))
    return [(label, cap) for label, cap in curves if cap]


def _curve_traces(label: str, cap: CapacityResult, color: str, dash: str) -> list[go.Scatter]:
    """One run's search: a line through its levels in load order, a marker per level by how it
    ended, repeats ringed, and its capacity as a star."""
    import plotly.graph_objects as go

    steps = capacity.steps(cap)
    line = sorted((s for s in steps if not s.repeat), key=lambda s: s.scale)
    traces = [go.Scatter(x=[s.rps for s in line], y=[s.attainment for s in line], mode="lines", name=label,
                         line=dict(color=color, dash=dash, width=1.5), hoverinfo="skip", legendgroup=label)]
    for kind, style in STEP_STYLE.items():
        chosen = [s for s in steps if s.kind == kind]
        if chosen:
            traces.append(go.Scatter(
                x=[s.rps for s in chosen], y=[s.attainment for s in chosen], mode="markers",
                name=f"{label}: {kind} ({len(chosen)})", legendgroup=label, hovertext=[s.hover for s in chosen],
                hoverinfo="text", marker=dict(color=color, line=dict(width=1.5, color=color), **style)))
    repeats = [s for s in steps if s.repeat]
    if repeats:
        traces.append(go.Scatter(x=[s.rps for s in repeats], y=[s.attainment for s in repeats], mode="markers",
                                 name=f"{label}: repeat ({len(repeats)})", legendgroup=label, hoverinfo="skip",
                                 marker=dict(symbol="circle-open", size=20, color=color, line=dict(width=2))))
    point = capacity.capacity_point(cap)
    if point:
        traces.append(go.Scatter(x=[point[0]], y=[point[1]], mode="markers", legendgroup=label,
                                 name=f"{label}: capacity {point[0]:.3g} req/s", hovertext=[capacity.headline(cap)],
                                 hoverinfo="text", marker=dict(symbol="star", size=22, color=color,
                                                               line=dict(width=1.5, color="#111827"))))
    return traces


def attainment_figure(curves: Sequence[tuple[str, CapacityResult]], title: str = "attainment versus load") -> go.Figure:
    """Attainment (share of requests within the SLO) at each load level a capacity search measured,
    one curve per run, the attainment target as a line and each run's capacity as a star; a single
    run's bracket [highest pass, lowest fail] is shaded."""
    import plotly.graph_objects as go

    fig = go.Figure()
    colors = iter(PALETTE * 4)
    for label, cap in curves:
        is_ref = label.startswith(f"{REFERENCE_TITLE} (")  # `StudyView.reference_title`
        for trace in _curve_traces(label, cap, REFERENCE_STYLE["color"] if is_ref else next(colors),
                                   "dash" if is_ref else "solid"):
            fig.add_trace(trace)
    if curves:
        target = curves[0][1].attainment_target
        slo = ", ".join(curves[0][1].slos)
        fig.add_hline(y=target, line=dict(color="#dc2626", dash="dash"), annotation_position="bottom right",
                      annotation_text=f"target {target:.0%} within {slo}" if slo else f"target {target:.0%}")
    loads = [s.rps for _, cap in curves for s in capacity.steps(cap)]
    loads += [p[0] for _, cap in curves if (p := capacity.capacity_point(cap))]
    if len(curves) == 1:
        low, high = curves[0][1].bracket_rps()
        # a bracket is drawn only with two finite, positive ends (never a raw 0 or inf on a log axis)
        if high is not None and all(math.isfinite(v) and v > 0 for v in (low, high)) and high > low:
            fig.add_vrect(x0=low, x1=high, fillcolor="#1f6feb", opacity=0.08, line_width=0,
                          annotation_text="bracket", annotation_position="top left")
            loads += [low, high]
    positive = [v for v in loads if math.isfinite(v) and v > 0]
    log = bool(positive) and len(positive) == len([v for v in loads if math.isfinite(v)]) \
        and max(positive) / min(positive) > 4
    fig.update_layout(title=title, xaxis_title="offered load (req/s)" + (", log scale" if log else ""),
                      xaxis=dict(type="log" if log else "linear", range=axis_range(loads, log=log),
                                 **(log_ticks(loads) if log else {})),
                      yaxis_title="attainment (requests within the SLO)",
                      yaxis=dict(range=attainment_range(curves), tickformat=".0%"), height=400,
                      margin=dict(l=10, r=10, t=40, b=10), template="plotly_white", legend=LEGEND_BELOW)
    return fig


def attainment_range(curves: Sequence[tuple[str, CapacityResult]]) -> list[float]:
    """The attainment axis zoomed to the band the levels and the target line occupy (95-100% when
    every level is near the target), never beyond [0, 1] plus a margin."""
    values = [s.attainment for _, cap in curves for s in capacity.steps(cap) if math.isfinite(s.attainment)]
    values += [cap.attainment_target for _, cap in curves]
    lo = min(values, default=0.0)
    pad = max((1.0 - lo) * 0.1, 0.005)
    return [max(0.0, lo - pad), 1.0 + pad]


def figure_summary(fig: go.Figure) -> dict[str, int]:
    """Points per named trace (for tests and captions)."""
    out = {}
    for trace in fig.data:
        out[trace.name] = len(trace.x) if trace.x is not None else 0
    return out


def progress_figure(rows: Sequence[ProgressPoint]) -> go.Figure:
    """The hypervolume of the front after each trial (the reference first), a marker per trial in
    its category's colour: when the search found something, and when it stopped finding."""
    import plotly.graph_objects as go

    fig = go.Figure()
    labels = ["ref" if r["trial"] < 0 else str(r["trial"]) for r in rows]
    fig.add_trace(go.Scatter(x=labels, y=[r["hypervolume"] for r in rows], mode="lines", line_shape="hv",
                             name="front's hypervolume", line=dict(color="#1f6feb", width=2), hoverinfo="skip"))
    for category in dict.fromkeys(r["category"] for r in rows):
        style = STYLE.get(category, dict(name=category, color="#8c959f", symbol="circle-open"))
        chosen = [(label, r) for label, r in zip(labels, rows) if r["category"] == category]
        fig.add_trace(go.Scatter(x=[c[0] for c in chosen], y=[c[1]["hypervolume"] for c in chosen], mode="markers",
                                 name=style["name"], marker=dict(color=style["color"], symbol=style["symbol"], size=9)))
    fig.update_layout(title="search progress: hypervolume of the front (objectives scaled to [0, 1])",
                      xaxis_title="trial", yaxis_title="hypervolume", xaxis_type="category", height=340,
                      margin=dict(l=10, r=10, t=40, b=10), template="plotly_white")
    return fig


def importance_figure(importances: dict[str, dict[str, float]]):
    """Per objective, each searched parameter's share of its variation (PED-ANOVA)."""
    import plotly.graph_objects as go

    fig = go.Figure()
    for i, (objective, values) in enumerate(importances.items()):
        fig.add_trace(go.Bar(name=objective, x=list(values), y=list(values.values()),
                             marker_color=PALETTE[i % len(PALETTE)]))
    fig.update_layout(title="parameter importance per objective", barmode="group", yaxis_title="importance",
                      height=340, margin=dict(l=10, r=10, t=40, b=10), template="plotly_white")
    return fig

