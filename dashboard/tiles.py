"""Trial detail's tiles: the objectives with their units and the difference from the engine's defaults,
quality against the reference in the one vocabulary (not measurable on random weights), with the
gate's word on its interval, and a speculative trial's acceptance probe with its caveats."""

from __future__ import annotations

import math

import streamlit as st
from streamlit.delta_generator import DeltaGenerator

from tracetune.dashboard import data, metrics, records
from tracetune.dashboard.banners import on_random_weights
from tracetune.quality.gate import random_weights, verdict
from tracetune.quality.probe import StoredQuality
from tracetune.replay.metrics import StoredEstimate


def tile_value(name: str, value: float) -> str:
    """An objective on a tile: with its unit, at most 4 significant digits; the quality loss (nats per
    token) as the perplexity change it means, as everywhere else it is shown."""
    if math.isnan(value):
        return "-"
    if name == "quality_loss":
        return f"{math.expm1(value) * 100:+.2f}% ppl"
    metric = metrics.METRIC.get(name)
    if metric is not None and metric.unit:  # short enough for a tile (the table and axis labels say it in full)
        return f"{value:.4g} {metric.unit}"
    return metrics.display_value(name, value)


def metric_delta(study: data.StudyView, trial: data.TrialView, name: str) -> str | None:
    ref = study.reference_metric(name)
    value = trial.metric(name)
    if math.isnan(ref) or math.isnan(value):
        return None
    if name == "quality_loss":
        return f"{(math.expm1(value) - math.expm1(ref)) * 100:+.2f} points of perplexity vs reference"
    if abs(value - ref) <= 1e-9 * max(abs(value), abs(ref), 1e-9):  # the same, to rounding
        return None
    _, factor = metrics.metric_label(name)
    if factor == 1000.0:
        return f"{(value - ref) * 1000:+.0f} ms vs reference"
    return f"{value - ref:+.3g} vs reference"


def _quality_metric(column: DeltaGenerator, label: str, estimate: StoredEstimate | None, fmt: str) -> None:
    """One quality unit, its unit in the value, with its 95% interval (the vocabulary of the table,
    best.json and exports)."""
    if not estimate:
        column.metric(label, "-")
        return
    low, high = estimate.get("ci_low", estimate["value"]), estimate.get("ci_high", estimate["value"])
    column.metric(label, fmt.format(estimate["value"]), help=f"95% CI [{fmt.format(low)}, {fmt.format(high)}]")


def quality_section(study: data.StudyView, t: data.TrialView) -> None:
    """Quality vs the reference in the one vocabulary (perplexity change, KLD, top-1, each with its
    95% interval) beside the NLL increase the objective reads, and the gate's word on it."""
    st.markdown("**Quality vs the reference**")
    if on_random_weights(study) or random_weights(t.config):
        st.caption("not measurable: measured on random weights (load_format dummy), which give speed, never "
                   "quality; measure quality with the real weights")
        return
    q: StoredQuality = t.quality or {}
    # two tiles a row: four in half the page cut their values short
    k1, k2 = st.columns(2)
    _quality_metric(k1, "perplexity change", q.get("ppl_change"), "{:+.2%}")
    _quality_metric(k2, "top-1 agreement", q.get("top1_agreement"), "{:.1%}")
    k3, k4 = st.columns(2)
    _quality_metric(k3, "KL divergence", q.get("kld"), "{:.4f} nats/token")
    _quality_metric(k4, "NLL increase", q.get("nll_delta_per_token"), "{:+.4f} nats/token")
    if t.is_reference:
        st.caption(f"the reference: {study.reference_name}, against which every trial's quality is measured")
        return
    st.caption(metrics.quality_text(q) + " (95% intervals)")
    if q and t.gate_decision is not None:
        st.caption(t.gate_decision.text(study.gate_words))
    accuracy = q.get("accuracy")
    if accuracy is not None:
        st.caption(f"accuracy on labelled prompts: {accuracy['value']:.1%}")
    st.caption(f"{q.get('n_prompts', '?')} probe texts"
               + (f", {q['n_tokens']} tokens" if q.get("n_tokens") else "")
               + (f" · {verdict(q)}" if verdict(q) else "")
               + (f" · measured for trial {q['reused_from']} (same quality key)"
                  if q.get("reused_from") is not None else ""))


def _percent(value: float | int | None) -> str:
    return "-" if value is None else f"{value:.1%}"


def acceptance_section(t: data.TrialView) -> None:
    """The acceptance probe (`replay.acceptance`; nothing without one): draft acceptance with natural
    stops beside forced to the recorded lengths, the share accepted past the natural end, and how many
    probe prompts were the trace's own text. The replay's own figure is the engine counters' above."""
    figures = records.acceptance_figures(t)
    acceptance = t.acceptance
    if figures is None or acceptance is None:
        return
    st.markdown("**Acceptance probe** (the trace's prompts, one at a time, greedy)")
    k1, k2 = st.columns(2)
    k1.metric("acceptance, natural stops", _percent(figures["natural_rate"]),
              help=f"accepted {figures['natural_accepted']:.0f} of {figures['natural_drafted']:.0f} draft tokens, "
                   f"each output stopped where the model stops (up to its recorded length)")
    k2.metric("acceptance, forced lengths", _percent(figures["forced_rate"]),
              help=f"accepted {figures['forced_accepted']:.0f} of {figures['forced_drafted']:.0f} draft tokens, "
                   f"each output forced to its recorded length (ignore-EOS), as the replay sends it")
    k3, k4 = st.columns(2)
    k3.metric("accepted past the natural end", _percent(figures["past_end_share"]),
              help="of the draft tokens accepted forced, the share accepted after the model's natural end "
                   f"({figures['ended']} of {figures['prompts']} prompts ended before their recorded length)")
    k4.metric("probe prompts recorded", f"{figures['recorded']} of {figures['prompts']}",
              help=f"{figures['recorded']} the trace's own text, {figures['synthesized']} synthesized to its lengths")
    st.caption(acceptance.words())


def speculation_warnings(t: data.TrialView) -> None:
    """Each reason its speculation's acceptance may not hold on real traffic, as a warning."""
    for caveat in t.speculation_caveats:
        st.warning(f"Speculation: acceptance may not hold on your traffic: {caveat}.", icon=":material/report:")
