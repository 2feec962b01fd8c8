"""The dashboard's pages (the sidebar and routing: `app.py`). Thin: every number and figure comes from
dashboard.data / tables / charts / export."""

from __future__ import annotations

import shlex

import streamlit as st

from tracetune.dashboard import (
    banners,
    capacity,
    charts,
    data,
    judged,
    metrics,
    progress,
    records,
    storage,
    tables,
    tiles,
    trace,
)
from tracetune.dashboard.export import ExportOptions, export, image_of
from tracetune.dashboard.export.pick import ReferenceIsBest, best_rule, best_trial, parse_pick, pick_for
from tracetune.dashboard.export_formats import FORMATS, export_format
from tracetune.errors import TuneError
from tracetune.stored import Stored, listed, mapping
from tracetune.tuner import trial_cost

PAGES = ("Pareto", "Trials", "Trial detail", "Compare", "Export")


@st.cache_data(ttl=2, show_spinner=False)
def load(url: str, name: str) -> data.StudyView:
    return data.load_study(url, name)


@st.cache_data(ttl=10, show_spinner=False)
def studies(url: str) -> list[str]:
    return storage.study_names(url)


def _trial_label(study: data.StudyView, number: int) -> str:
    t = study.trial(number)
    return f"{study.title(t)} · {t.category}" + (f" · {data.diff_text(t.diff)}" if t.diff else "")


def _pick_trial(study: data.StudyView, label: str, options: list[int], default: int | None, key: str) -> int | None:
    if not options:
        return None
    index = options.index(default) if default in options else 0
    return st.selectbox(label, options, index=index, key=key, format_func=lambda n: _trial_label(study, n))


def _default_trial(study: data.StudyView) -> int | None:
    try:
        return best_trial(study).number
    except ReferenceIsBest:
        return data.REFERENCE_RUN if study.reference_run is not None else None
    except TuneError:  # nothing on the front yet
        pass
    measured = study.front + [t for t in study.trials if t.measured]
    return measured[0].number if measured else (study.trials[0].number if study.trials else None)


def _front_table(study: data.StudyView) -> None:
    """The front as a decision: standing, objectives and quality cost with intervals, what is apart."""
    rows = tables.front_table(study)
    if not rows:
        return
    gate = "" if banners.on_random_weights(study) else ", and what the quality gate alone kept off it"
    st.markdown(f"**The front, as a decision** ({study.reference_name}, the front, its ties{gate})")
    st.dataframe(rows, hide_index=True, key="front_table",
                 column_config={"standing": st.column_config.TextColumn(width="medium"),
                                "quality vs defaults": st.column_config.TextColumn(width="large"),
                                "statistically": st.column_config.TextColumn(width="medium")})
    st.caption("Two runs are statistically apart when their 95% intervals do not overlap on at least one objective "
               f"(an interval is never read narrower than +-{data.MIN_HALF_WIDTH:.0%} of its value); a tie is "
               "dominated only inside the intervals.")


def _capacity_chart(study: data.StudyView, trials: list[data.TrialView], key: str) -> None:
    """Attainment versus load for the trials that measured capacity, with the reference's curve."""
    if not any(capacity.capacity_of(t.summary) for t in trials if t.measured):
        return
    curves = charts.capacity_curves(study, trials)
    title = "attainment versus load: " + " vs ".join(label for label, _ in curves)
    st.plotly_chart(charts.attainment_figure(curves, title), key=key)


@st.cache_data(ttl=60, show_spinner=False)
def _trace_profile(url: str, name: str) -> Stored | None:
    return trace.stored_profile(url, name)


def _trace_chart(study: data.StudyView, t: data.TrialView) -> None:
    """The trace's rate over time and the windows this trial's load levels replayed."""
    profile = _trace_profile(study.storage, study.name)
    if profile is None:
        return
    parts = trace.parts_replayed(t.summary)
    st.plotly_chart(trace.rate_figure(profile, parts, "the trace over time, and what the load levels replayed"),
                    key="detail_trace")
    st.caption(trace.caption(profile, parts))


# -- pages ---------------------------------------------------------------------------------------
def page_pareto(study: data.StudyView) -> None:
    names = list(metrics.METRICS)
    objectives = study.objectives
    c1, c2, c3, c4 = st.columns([3, 3, 1, 3])

    def index(position: int, fallback: str) -> int:
        name = objectives[position] if len(objectives) > position else fallback
        return names.index(name) if name in names else names.index(fallback)

    x = c1.selectbox("x axis", names, index=index(0, "ttft_p99"), key="pareto_x")
    y = c2.selectbox("y axis", names, index=index(1, "output_tps"), key="pareto_y")
    three_d = c3.toggle("3-D", value=False, key="pareto_3d")
    z = None
    if three_d:
        z = c4.selectbox("z axis", names, index=index(2, "quality_loss"), key="pareto_z")
    banners.verdict(study)
    fig = charts.pareto_figure(study, x, y, z)
    if z:
        st.plotly_chart(fig, key="pareto_chart_3d")
    else:
        event = st.plotly_chart(fig, key="pareto_chart", on_select="rerun", selection_mode=("points",))
        state = mapping(event)  # the chart's selection state (Streamlit's plotly event)
        points = [mapping(p).get("customdata") for p in listed(mapping(state.get("selection")).get("points"))]
        numbers = [int(n[0] if isinstance(n, list) else n) for n in points
                   if isinstance(n, list | int | float | str) and n != []]
        if numbers:
            chosen = study.trial(numbers[0])
            st.session_state["detail_default"] = chosen.number
            st.info(f"Selected trial {chosen.number} ({chosen.category}): {data.diff_text(chosen.diff)}. "
                    f"Trial detail and Export now open on it.")
    _front_table(study)
    counts = {c: sum(1 for t in study.trials if t.category == c) for c in data.CATEGORIES}
    failed = [t for t in study.trials if t.category in ("failed", "pruned", "running", "queued")]
    line = " (the dotted line is the front on the two axes shown)" if len(data.front_on(study.trials, [x, y])) > 1 \
        else ""
    st.caption(f"{counts['pareto']} on the Pareto front of {', '.join(objectives)} (feasible, not dominated by "
               f"another trial or by {study.reference_name}; bars: 95% intervals) · "
               f"{counts['tie']} tied with it inside the intervals · "
               f"{counts['dominated']} dominated · {counts['infeasible']} violate an SLO"
               + ("" if banners.on_random_weights(study) else " or the quality gate") + " · "
               f"{counts['failed']} failed, rejected or interrupted (no measurements, listed below) · "
               f"{counts['running']} running · {counts['queued']} queued"
               + (f" · {counts['pruned']} pruned (capacity search stopped early where it could no longer reach "
                  f"the front; listed below)" if counts["pruned"] else "")
               + (f" · {counts['duplicate']} duplicates of earlier trials (not run again)"
                  if counts["duplicate"] else "")
               + ". Hover a point for its config"
               + ("." if three_d else f"; click it to open it in Trial detail and Export{line}."))
    if failed:
        causes = tables.failure_causes(failed)
        with st.expander(f"Failed, interrupted, pruned, running and queued trials ({len(failed)}, {len(causes)} "
                         f"causes) — not on the chart"):
            st.dataframe(causes, hide_index=True, key="failed_table")
    _search_progress(study)


@st.cache_data(ttl=600, show_spinner=False)
def _importances(url: str, name: str, measured: tuple[int, ...]) -> dict[str, dict[str, float]]:
    """Parameter importance, computed again only when another trial has been measured (the page
    re-renders every few seconds under live refresh; this reads the study once more and fits a model)."""
    return progress.param_importances(load(url, name))


def _search_progress(study: data.StudyView) -> None:
    """Hypervolume of the front after each trial, and which parameters moved each objective."""
    rows = progress.search_progress(study)
    if len(rows) < 2:
        return
    with st.expander("Search progress and parameter importance"):
        st.plotly_chart(charts.progress_figure(rows), key="progress_chart")
        importances = _importances(study.storage, study.name, tuple(t.number for t in study.trials if t.measured))
        if importances:
            st.plotly_chart(charts.importance_figure(importances), key="importance_chart")
        else:
            st.caption("parameter importance needs at least 4 measured trials with different values")


def _table_frame(study: data.StudyView, rows: list[dict], columns: list[str] | None = None):
    import pandas as pd

    frame = pd.DataFrame(rows)
    if columns is not None:
        frame = frame[[c for c in columns if c in frame.columns]]
    if "trial" in frame.columns:  # one type for the column: the reference's row reads "ref"
        frame["trial"] = [("ref" if n == data.REFERENCE_RUN else str(n)) for n in frame["trial"]]
    renames = {}
    for col in frame.columns:
        label, factor = metrics.metric_label(col)
        if col in metrics.METRICS and factor != 1.0:
            frame[col] = frame[col] * factor
            renames[col] = label
    return frame.rename(columns=renames)


def _column_config(frame) -> dict:
    config = {"differs from reference": st.column_config.TextColumn(width="medium"),
              "why": st.column_config.TextColumn(width="large"),
              "quality vs defaults": st.column_config.TextColumn(width="medium"),
              "speculation caveat": st.column_config.TextColumn(width="large"),
              "worker": st.column_config.TextColumn(width="medium"),
              "startup_s": st.column_config.NumberColumn("engine start (s)", format="%.0f")}
    for col in frame.columns:
        if col.endswith("(ms)"):
            config[col] = st.column_config.NumberColumn(col, format="%.0f")
        elif col in ("output_tps", "request_tps", "goodput", "spec_accepted_length"):
            config[col] = st.column_config.NumberColumn(col, format="%.2f")
        elif col in ("quality_loss",):
            config[col] = st.column_config.NumberColumn(col, format="%+.4f")
        elif col in ("error_rate", "spec_acceptance_rate", "spec_natural_rate"):
            config[col] = st.column_config.NumberColumn(col, format="percent")
        elif col.startswith("capacity") and col in metrics.METRICS:
            config[col] = st.column_config.NumberColumn(metrics.metric_label(col)[0], format="%.3f")
        elif col in ("capacity bracket", "capacity notes", "95% intervals", "based on"):
            config[col] = st.column_config.TextColumn(col, width="medium")
    return config


def page_trials(study: data.StudyView) -> None:
    c1, c2, c3 = st.columns([3, 2, 3])
    text = c1.text_input("Constraints", key="trials_filter", placeholder="e.g. ttft_p99<500ms and output_tps>20",
                         help="METRIC OP NUMBER joined by 'and'; latencies in seconds or with ms/s. "
                              "Trials without a value for a metric are left out.")
    categories = c2.multiselect("Show", list(data.CATEGORIES), default=list(data.CATEGORIES), key="trials_categories")
    try:
        conditions = tables.parse_conditions(text, what="constraints")
    except TuneError as exc:
        st.error(str(exc))
        conditions = []
    trials = tables.filter_trials(study.candidates, conditions, categories=categories)
    if conditions:
        st.caption(f"{len(trials)} of {len(study.candidates)} candidates (the reference included) meet "
                   + " and ".join(map(str, conditions)))
    if not trials:
        st.info("No trial meets " + (" and ".join(map(str, conditions)) if conditions else "the chosen categories"))
        return
    rows = tables.trial_table(study, tables.sort_for_table(trials))
    default = tables.decision_columns(study)
    more = c3.multiselect("More columns", [c for c in rows[0] if c not in default], key="trials_more",
                          help="capacity, throughput and latency extras, speculation, intervals, sample sizes")
    frame = _table_frame(study, rows, default + more)
    st.dataframe(frame, hide_index=True, key="trials_table", column_config=_column_config(frame),
                 height=min(35 * (len(frame) + 1) + 3, 740))
    if study.reference_run is not None:
        st.caption(f"Row `ref`: the reference, {study.reference_name} (unquantized weights, auto KV cache, no "
                   "speculation), a candidate like any trial. Click a column header to sort.")


def page_detail(study: data.StudyView) -> None:
    numbers = [t.number for t in study.candidates]
    default = st.session_state.get("detail_default", _default_trial(study))
    number = _pick_trial(study, "Trial", numbers, default, key="detail_trial")
    if number is None:
        st.info("no trials yet")
        return
    t = study.trial(number)
    title = study.title(t)
    st.subheader(f"{title[:1].upper()}{title[1:]} — {t.status}" + (f" ({t.category})" if t.measured else ""))
    if t.measured:
        cols = st.columns(len(study.objectives) + 2)
        for col, name in zip(cols, study.objectives):
            # green when better than the reference, red when worse, whichever way the metric points
            col.metric(name, tiles.tile_value(name, t.metric(name)), tiles.metric_delta(study, t, name),
                       delta_color="inverse" if metrics.METRICS.get(name) == "minimize" else "normal",
                       help=(f"95% interval {metrics.display_interval(name, t.interval(name))}"
                             if t.interval(name) else None))
        cols[-2].metric("engine start", f"{t.startup_s:.0f} s" if t.startup_s else "-")
        cols[-1].metric("trial wall time", f"{t.wall_s:.0f} s" if t.wall_s else "-")
        split = trial_cost.cost_text(t.summary.cost if t.summary is not None else None)
        if split:
            st.caption(f"Where its time went: {split}")
        if capacity.capacity_of(t.summary):
            st.caption(capacity.headline(capacity.capacity_of(t.summary)))
        if t.beaten_by_reference:
            st.warning(f"{study.reference_name} beat trial {t.number} on every objective: keep the defaults over it.")
    _status_note(study, t)
    if t.worker and t.status != "running":  # a running trial's note names its worker
        st.caption(data.worker_note(t, 2 * study.heartbeat_s))
    if t.measured:
        tiles.speculation_warnings(t)
    if not t.is_reference:
        st.markdown("**Differs from the reference:** " + (data.diff_text(t.diff) if t.config else
                                                           ", ".join(f"{k}={v}" for k, v in t.params.items())))
    if t.measured:
        ref = study.reference_run
        overlay = [t, ref] if ref is not None and not t.is_reference and ref.requests_jsonl else [t]
        c1, c2, c3 = st.columns(3)
        for col, metric in zip((c1, c2, c3), ("ttft", "itl", "e2e")):
            col.plotly_chart(charts.cdf_figure(overlay, metric, [study.title(u) for u in overlay]),
                             key=f"detail_cdf_{metric}")
        st.plotly_chart(charts.timeline_figure(t), key="detail_timeline")
        _capacity_chart(study, [t], key="detail_capacity")
        _trace_chart(study, t)
        left, right = st.columns(2)
        with left:
            _engine_counters(t)
            tiles.acceptance_section(t)
        with right:
            tiles.quality_section(study, t)
    with st.expander("Full engine config", expanded=False):
        st.json(t.config or t.params)
    if t.log_tail:
        with st.expander("Engine log tail", expanded=not t.measured):
            st.code(t.log_tail[-6000:], language=None)


def _status_note(study: data.StudyView, t: data.TrialView) -> None:
    """Why a trial is where it is: off the front for a constraint, interrupted, queued, running, failed."""
    if t.measured:
        if t.violations:
            st.warning("Off the front: " + "; ".join(t.violations) + ".", icon=":material/block:")
        elif t.outside_gate:
            phrase = judged.gate_phrase(t.gate_decision)
            st.warning(f"{phrase[:1].upper()}{phrase[1:]} {study.gate_words}: {metrics.quality_text(t.quality)}.",
                       icon=":material/report:")
    elif t.status == "running":
        st.info(data.worker_note(t, 2 * study.heartbeat_s))
    elif t.status in ("interrupted", "queued"):
        st.warning(t.failure_reason or t.status)
    else:
        st.error(t.failure_reason or "no reason stored")


def _engine_counters(t: data.TrialView) -> None:
    st.markdown("**Engine counters** (measured phase)")
    counters = records.engine_counters(t)
    k1, k2, k3, k4 = st.columns(4)
    rate = counters["prefix_cache_hit_rate"]
    k1.metric("prefix-cache hit rate", "-" if rate is None else f"{rate:.1%}",
              help=f"hits {counters['prefix_cache_hits']} of {counters['prefix_cache_queries']} queried tokens")
    acc, length = counters["spec_decode_acceptance_rate"], counters["spec_decode_mean_accepted_length"]
    k2.metric("speculative acceptance", "-" if acc is None else f"{acc:.1%}",
              help=f"accepted {counters['spec_decode_accepted_tokens']} of {counters['spec_decode_draft_tokens']} "
                   f"draft tokens in the replay (outputs forced to their recorded lengths)")
    k3.metric("mean accepted length", "-" if length is None else f"{length:.2f}",
              help=f"1 + accepted tokens per draft ({counters['spec_decode_drafts']} drafts): tokens one "
                   f"verification step yields")
    k4.metric("preemptions", "-" if counters["preemptions"] is None else f"{counters['preemptions']:.0f}")


def page_compare(study: data.StudyView) -> None:
    measured = [t.number for t in study.candidates if t.config]
    if len(measured) < 1:
        st.info("no trial with a config yet")
        return
    front = [t.number for t in study.front]
    a = _pick_trial(study, "A", measured, front[0] if front else measured[0], key="compare_a")
    others = [n for n in measured if n != a] or measured
    # B defaults to the reference: what a trial changes against the engine's defaults
    b = _pick_trial(study, "B", others, data.REFERENCE_RUN if data.REFERENCE_RUN in others else others[0],
                    key="compare_b")
    if a is None or b is None:  # not reached: `measured` holds at least one run
        return
    ta, tb = study.trial(a), study.trial(b)
    rows = tables.compare(study, ta, tb)
    only_diff = st.toggle("only differences", value=False, key="compare_only_diff")
    shown = [r for r in rows if r["differs"] or not only_diff]
    st.dataframe([{"": ("≠" if r["differs"] else ""), "field": r["field"], study.title(ta): r["a"],
                   study.title(tb): r["b"]}
                  for r in shown], hide_index=True, key="compare_table", height=min(38 * (len(shown) + 1), 700))
    both = [t for t in (ta, tb) if t.measured]
    if both:
        c1, c2, c3 = st.columns(3)
        for col, metric in zip((c1, c2, c3), ("ttft", "itl", "e2e")):
            col.plotly_chart(charts.cdf_figure(both, metric, [study.title(u) for u in both]),
                             key=f"compare_cdf_{metric}")
        _capacity_chart(study, both, key="compare_capacity")


def page_export(study: data.StudyView) -> None:
    measured = [t.number for t in study.candidates if t.measured]
    if not measured:
        st.info("no measured trial to export yet")
        return
    if study.decision is not None and (study.decision.reference_is_best or not study.decision.reference_feasible):
        banners.verdict(study)
    c1, c2 = st.columns([2, 3])
    how = c1.radio("Choose the trial", ["by number", "by rule (--pick)"], horizontal=True, key="export_how")
    trial = None
    cli_choice = ""
    if how == "by number":
        number = _pick_trial(study, "Trial", measured, st.session_state.get("detail_default", _default_trial(study)),
                             key="export_trial")
        if number is None:  # not reached: `measured` holds at least one run
            return
        trial = study.trial(number)
        cli_choice = "--reference" if trial.is_reference else f"--trial {number}"
        if trial.beaten_by_reference:
            st.warning(f"{study.reference_name} beat trial {number} on every objective: prefer the defaults.")
    else:
        rule_text = c2.text_input("Rule", value=str(best_rule(study)), key="export_rule",
                                  help="max:METRIC or min:METRIC, then optionally 'where' conditions, "
                                       "e.g. max:output_tps where ttft_p99<500ms")
        try:
            trial = pick_for(study, parse_pick(rule_text))
            st.success(f"rule picks trial {trial.number}: {data.diff_text(trial.diff)}")
            cli_choice = f"--pick {shlex.quote(rule_text)}"
        except ReferenceIsBest as exc:
            st.warning(str(exc))
            return
        except TuneError as exc:
            st.error(str(exc))
            return
    if trial.outside_gate or trial.violations:
        title = study.title(trial)
        st.warning(f"{title[:1].upper()}{title[1:]} "
                   + ("is outside the study's constraints: " + "; ".join(trial.violations) if trial.violations else
                      f"is {judged.gate_phrase(trial.gate_decision)} {study.gate_words}: "
                      f"{metrics.quality_text(trial.quality)}")
                   + ". Deploy it only if that is acceptable for this model and traffic.", icon=":material/report:")
    tiles.speculation_warnings(trial)
    try:
        default_image = image_of(study, ExportOptions())
    except TuneError as exc:  # an engine tracetune cannot deploy (the simulator, an endpoint it only measures)
        st.error(str(exc))
        return
    fmt = st.radio("Format", list(FORMATS), horizontal=True, key="export_format")
    with st.expander("Deployment settings"):
        d1, d2, d3, d4 = st.columns(4)
        image = d1.text_input("image", value="", placeholder=default_image, key="export_image",
                              help="default: the image of the engine that ran the trial, at the release the "
                                   "deployment runs")
        port = d2.number_input("port", value=8000, min_value=1, max_value=65535, key="export_port")
        gpus = d3.number_input("GPUs", value=1, min_value=0, max_value=64, key="export_gpus")
        pvc = d4.text_input("models PVC (k8s/helm)", value="models", key="export_pvc")
    dummy = (trial.config or {}).get("load_format") == "dummy"
    allow = dummy and st.checkbox("Export it anyway, random weights and all (a test deployment: its server answers "
                                  "with noise)", value=False, key="export_dummy")
    try:
        options = ExportOptions(image=image or None, port=int(port), gpus=int(gpus), models_pvc=pvc or "models",
                                allow_dummy_weights=allow)
        text = export(study, trial, fmt, options)
    except TuneError as exc:
        st.error(str(exc))
        return
    written = export_format(fmt)
    st.download_button(f"Download {written.file_name}", data=text, file_name=written.file_name,
                       mime="application/json" if written.language == "json" else "text/plain",
                       key="export_download", type="primary", icon=":material/download:")
    st.code(text, language=written.language, wrap_lines=True, height=min(24 * (text.count("\n") + 2), 640))
    flags = (("image", image), ("port", port if port != 8000 else ""), ("gpus", gpus if gpus != 1 else ""),
             ("models-pvc", pvc if pvc != "models" else ""))
    extra = "".join(f" --{k} {shlex.quote(str(v))}" for k, v in flags if v != "")
    extra += " --allow-dummy-weights" if allow else ""
    st.caption("The same from the command line: `tune export --storage "
               f"{shlex.quote(storage.display_url(study.storage))} --study {shlex.quote(study.name)} "
               f"{cli_choice} --format {fmt}{extra}`")


RENDER = {"Pareto": page_pareto, "Trials": page_trials, "Trial detail": page_detail, "Compare": page_compare,
          "Export": page_export}
