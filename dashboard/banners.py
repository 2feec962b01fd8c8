"""The banners above the Pareto and Export pages: the quality probe too noisy, a study run without a
gate (and how the default gate judges its front, from the intervals), and the verdict: the engine's
defaults winning, nothing meeting the SLO (by how much), the best trade the gate turned down, a best
or front trial whose speculation's acceptance may not hold on real traffic."""

from __future__ import annotations

import streamlit as st

from tracetune.dashboard import data, judged
from tracetune.quality.gate import random_weights
from tracetune.tuner.front import Decision


def on_random_weights(study: data.StudyView) -> bool:
    """The study measured on random weights: speed only, no quality number, gate or floor on any page."""
    return random_weights(study.reference.get("config") if study.reference else None)


def _gate_off(study: data.StudyView) -> None:
    """A study run without a gate: which front trials the default gate would not pass (outside it, or
    undecided: their interval reaches both sides of its limit)."""
    front = [t for t in study.trials if t.outside_gate and t.category in ("pareto", "tie")]
    outside = [t.label for t in front if judged.gate_phrase(t.gate_decision) == "outside"]
    undecided = [t.label for t in front if t.label not in outside]
    judged_by = ([f"front trial(s) {', '.join(outside)} are outside it"] if outside else []) + (
        [f"front trial(s) {', '.join(undecided)} are undecided (their 95% interval reaches both sides of its limit: a "
         "longer probe decides)"] if undecided else [])
    st.warning(f"No quality gate: this study was run with `--max-quality-loss none`, so a configuration is on the "
               f"front whatever it costs in quality. Judged by the default gate {study.shown_gate}, "
               + ("; ".join(judged_by) + " (drawn as red diamonds)." if judged_by else
                  "every front trial is within it."), icon=":material/report:")


def _speculation_caveat(decision: Decision) -> bool:
    """The verdict says a caveat on the speculation of the best trial or of a front trial."""
    labels = ([decision.best.label] if decision.best is not None else []) + decision.trials_on_front
    return any(label in decision.speculation_words for label in labels)


def verdict(study: data.StudyView) -> None:
    """The quality probe when it is too noisy; the missing gate; the verdict (the engine's defaults winning,
    nothing meeting the SLO, the best trade the gate turned down, a caveat on a best or front trial's
    speculation), and which trials the defaults beat."""
    check = study.quality_check
    if "too noisy" in check:
        st.warning(check[:1].upper() + check[1:], icon=":material/blur_on:")
    if study.gate_off and not on_random_weights(study):
        _gate_off(study)
    decision = study.decision
    if decision is None:
        return
    if not decision.reference_feasible and decision.best is None:
        st.error(decision.verdict()[:1].upper() + decision.verdict()[1:], icon=":material/block:")
    elif decision.reference_is_best:
        st.warning(decision.verdict()[:1].upper() + decision.verdict()[1:], icon=":material/star:")
    elif decision.beyond_gate is not None or _speculation_caveat(decision):
        st.warning("Verdict: " + decision.verdict(), icon=":material/report:")
    if decision.dominated_by_reference:
        beaten = [study.trial(n) for n in decision.dominated_by_reference if isinstance(n, int)]
        ties = [t.number for t in beaten if t.tied]
        tied = f" (trial(s) {', '.join(map(str, ties))} only inside the 95% intervals: drawn as ties)" if ties else ""
        st.info(f"{study.reference_name} beat trial(s) {', '.join(str(t.number) for t in beaten)} on every objective: "
                f"not on the front{tied}.")
