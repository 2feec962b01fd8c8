"""What the main job prints and writes when the study ends: the Pareto front with the reference (the
engine's defaults) competing, the verdict, the quality floor and self-check, failures grouped by
cause, and best.json / pareto.json."""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path

from tracetune.engine_adapter.metrics import EngineMetrics
from tracetune.files import write_atomic
from tracetune.replay.acceptance import stored_acceptance, stored_caveats
from tracetune.replay.metrics import Summary
from tracetune.stored import Stored, mapping
from tracetune.tuner.objectives import OBJECTIVE_METRIC, OBJECTIVES


def fmt_objective(name: str, value: float) -> str:
    """An objective's value as the console shows it (`tuner.objectives.Metric.shown`)."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    metric = OBJECTIVE_METRIC.get(name)
    return metric.shown(value) if metric is not None else f"{value:.2f}"


def report_results(tuner, console, run_dir: Path) -> None:
    """The front (the engine's defaults competing like any trial), the verdict in plain words, failures
    grouped by reason, and best.json / pareto.json: all read from the one `StudyView` the dashboard
    reads (`dashboard.data.load_study`), the files written by their export formats."""
    from tracetune.dashboard.data import load_study
    from tracetune.dashboard.export.front import defaults_label, front_rows
    from tracetune.dashboard.export.options import ExportOptions
    from tracetune.dashboard.export_formats import export_format

    view = load_study(tuner.settings.storage_url, tuner.settings.study_name)
    decision, objectives = view.decision, view.objectives
    assert decision is not None  # a study with objectives has one
    defaults = decision.reference_name
    rows = front_rows(view)
    engine_defaults = {t.number: label for t in view.trials if (label := defaults_label(view, t))}
    console.print(_front_table(rows, objectives, view.name, len(view.trials), view.economics,
                               reference_name=defaults))
    for line in config_lines(rows, reference_name=defaults):
        console.print(line, highlight=False, markup=False)
    for number, label in engine_defaults.items():
        if number not in {r["trial"] for r in rows}:
            console.print(f"  {label} (trial {number}): not on the front{_objectives_text(view.trial(number))}",
                          highlight=False)
    _print_quality_floor(view, console)
    _print_cross_engine_floor(view, engine_defaults, console, defaults)
    for r in rows:
        if caveats := stored_caveats(r["summary"]):
            console.print(f"  {r.get('shown') or r['trial']}: acceptance caveat: {caveats}", highlight=False,
                          markup=False)
    console.print(f"[bold]verdict[/]: {decision.verdict()}", highlight=False)
    if standings := _engine_standings(view, tuner.engine.engines, tuner.settings.max_quality_loss is not None):
        console.print(standings, highlight=False, markup=False)
    if decision.dominated_by_reference:
        console.print(f"  {defaults} beat trials {', '.join(map(str, decision.dominated_by_reference))} on every "
                      f"objective: they are not on the front.", highlight=False)
    _print_failures(view, console)
    pareto, best = export_format("pareto"), export_format("best")
    write_atomic(run_dir / pareto.file_name, pareto.write(view, None, ExportOptions()))
    if decision.best is None:
        console.print("no feasible measured trial yet: nothing on the front.")
        return
    write_atomic(run_dir / best.file_name, best.write(view, None, ExportOptions()))
    which = f"{defaults} (the reference)" if decision.reference_is_best else f"trial {decision.best.label}"
    if not decision.reference_feasible and decision.reference_is_best:
        which += ", which break the SLO themselves"
    console.print(f"best by {decision.by} on the front: {which} · wrote {run_dir / best.file_name} and "
                  f"{run_dir / pareto.file_name}", highlight=False)


def _engine_standings(view, kinds, gated: bool) -> str:
    """In a study choosing between engines (`kinds`, the first the reference's), each engine's best
    within the quality gate by the deciding objective, and which is ahead (`tuner.engine_standings`);
    "" in a one-engine study."""
    from tracetune.dashboard.capacity import capacity_of
    from tracetune.tuner.engine_standings import Entry, standings_text

    decision = view.decision
    if len(kinds) < 2 or decision is None or not decision.by:
        return ""
    shown = {kind.name: kind.shown for kind in kinds}
    key, by = decision.objectives.index(decision.by), decision.by

    def entry(engine: str, name: str, value: float, summary: Summary | None) -> Entry:
        capacity = capacity_of(summary) if by == "capacity" else None
        return Entry(shown.get(engine, engine), name, value, capacity.bracket_rps()[1] if capacity else None)

    entries: list[Entry] = []
    outside: dict[str, int] = {}
    unprobed: dict[str, int] = {}  # missed the SLOs at the trace's rate: measured, its quality not probed
    if decision.reference_values is not None and decision.reference_feasible:
        entries.append(entry(kinds[0].name, "its defaults", decision.reference_values[key], view.reference_summary))
    for t in view.trials:
        value = _standing_value(t, by)
        if value is None:
            continue
        engine = str(t.params.get("engine") or t.defaults_of or kinds[0].name)
        label = shown.get(engine, engine)
        if gated and t.quality is None:
            unprobed[label] = unprobed.get(label, 0) + 1
        elif gated and t.constraints and t.constraints[-1] > 0:
            outside[label] = outside.get(label, 0) + 1
            continue
        name = "its defaults" if t.defaults_of else f"trial {t.number}"
        entries.append(entry(engine, name, value, t.summary))
    return standings_text(entries, [kind.shown for kind in kinds], by, OBJECTIVES[by] == "maximize",
                          lambda v: fmt_objective(by, v), outside, unprobed)


def _standing_value(t, by: str) -> float | None:
    """A trial's value of the deciding objective for the standings: as measured, or a pruned trial's
    bound as its run reads it (None: neither)."""
    from tracetune.dashboard.metrics import metric_value
    from tracetune.tuner.storage import Status

    if t.status == Status.MEASURED:
        return t.objective_values.get(by)
    return metric_value(by, t.run) if t.status == Status.PRUNED and t.summary is not None else None


def _objectives_text(t) -> str:
    """': ttft_p99 300 ms, ...' for a measured trial; ' (its status)' for one that was not (an
    infeasible trial's values are the sampler's penalties, not measurements)."""
    if not t.objective_values:
        return f" ({t.status or 'not measured'}: see below)"
    return ": " + ", ".join(f"{o} {fmt_objective(o, v)}" for o, v in t.objective_values.items())


def _front_table(rows: list[dict], objectives: list[str], name: str, n_trials: int, economics: Mapping[str, float],
                 *, reference_name: str | None = None):
    """The front as a table, the reference (`reference_name`: the study's `EngineKind.defaults_label`; default:
    the default engine's) a row like any trial."""
    from rich.table import Table

    from tracetune.quality.gate import units_text
    from tracetune.tuner.front import default_reference_name

    has_capacity = any(r["capacity"] for r in rows)
    on_front = sum(r["trial"] != "reference" for r in rows)
    defaults = reference_name or default_reference_name()
    table = Table(title=f"Pareto front of study {name} ({on_front} of {n_trials} trials + {defaults})")
    table.add_column("trial", justify="right")
    for objective in objectives:
        table.add_column(objective, justify="right")
    if has_capacity:
        table.add_column("capacity bracket", justify="right")
    if "gpu_hour_cost" in economics:
        table.add_column("$/1M out tok", justify="right")
    if "target_rate" in economics:
        table.add_column(f"GPUs for {economics['target_rate']:g} req/s", justify="right")
    has_units = any((r["quality"] or {}).get("kld") for r in rows)
    if has_units:
        table.add_column("quality vs reference", justify="right")
    has_spec = any(spec_text(r["summary"].get("engine")) != "-" for r in rows)
    if has_spec:
        table.add_column("draft accepted", justify="right")
        table.caption = ("draft accepted: share of draft tokens the model accepted in the replay (forced to "
                         "the recorded lengths), x tokens per decoding step; nat: with natural stops on the "
                         "trace's prompts; !: a caveat below")
    for r in rows:
        cells = []
        for objective in objectives:
            value = r["values"][objective]
            # (capacity's interval is its bracket, a column of its own)
            ci = None if objective == "capacity" or (r["trial"] == "reference" and objective == "quality_loss") \
                else _ci_of(objective, r["summary"], r["quality"])
            interval = f" [dim][{fmt_objective(objective, ci[0])}, {fmt_objective(objective, ci[1])}][/]" if ci else ""
            cells.append(fmt_objective(objective, value) + interval)
        if has_capacity:
            cells.append(_bracket(r["capacity"]))
        econ = r["economics"]
        if "gpu_hour_cost" in economics:
            cells.append(f"{econ.get('usd_per_1m_output_tokens', math.nan):.3g}")
        if "target_rate" in economics:
            cells.append(f"{econ.get('gpus_total', math.nan):g}")
        if has_units:
            cells.append(units_text(r["quality"]) if r["trial"] != "reference" else "-")
        if has_spec:
            cells.append(spec_text(r["summary"].get("engine")) + natural_text(r["summary"]))
        table.add_row("ref" if r["trial"] == "reference" else r.get("shown") or str(r["trial"]), *cells)
    return table


def config_lines(rows: list[dict], *, reference_name: str | None = None) -> list[str]:
    """Below the table, what each row's configuration changes from the reference (`reference_name`, as
    `_front_table`), one line each (wrapped at commas): a table column of these folded them letter by
    letter at 80 columns."""
    from tracetune.tuner.front import default_reference_name

    defaults = reference_name or default_reference_name()
    out = []
    for r in rows:
        if r["trial"] == "reference":
            out.append(f"  ref: {defaults}")
            continue
        diff = ", ".join(f"{k}={v}" for k, v in r["differs_from_reference"].items() if k != "model") or "(none)"
        out.append(f"  {r.get('shown') or r['trial']}: {diff}")
    return [f"configurations (what differs from {defaults}):", *out]


def spec_text(stored: Stored | None) -> str:
    """A trial's speculative decoding from its stored engine counters (`EngineMetrics`), compactly: the
    share of draft tokens accepted and the tokens each verification step yields ("38% x2.1"); the
    share alone where the number of drafts is unknown (llama-server reports draft tokens, not
    drafts: "38%"); "-" without speculation."""
    engine = EngineMetrics.from_dict(stored)
    if not engine.spec_decode_draft_tokens:
        return "-"
    share, length = f"{engine.spec_decode_acceptance_rate:.0%}", engine.spec_decode_mean_accepted_length
    return share if math.isnan(length) else f"{share} x{length:.1f}"


def natural_text(summary: Stored | None) -> str:
    """The acceptance probe's natural-stop figure for the table (", nat 41%", "!" when the trial's
    acceptance carries a caveat: `replay.acceptance`); "" without a probe."""
    acceptance = stored_acceptance(mapping(summary).get("acceptance"))
    if acceptance is None:
        return ""
    rate = acceptance.natural.rate
    return f", nat {'-' if math.isnan(rate) else f'{rate:.0%}'}" + ("!" if acceptance.caveats() else "")




def _print_quality_floor(view, console) -> None:
    """The probe's noise floor and the study's self-check on it (lossless configurations within it)."""
    from tracetune.quality.gate import self_check

    check = self_check([(t.number, t.quality) for t in view.trials])
    for line in (view.floor_text, check):
        if line:
            console.print(("[yellow]" + line + "[/]") if "too noisy" in line else line, highlight=False)


def _print_cross_engine_floor(view, engine_defaults: dict[int, str], console, reference_name: str) -> None:
    """Another engine's own defaults against the reference (`reference_name`: the first engine's), by the
    same probe: how far two engines serving the same weights differ before any setting changes (the
    floor a cross-engine comparison rests on)."""
    from tracetune.quality.gate import cost_text

    for number, label in sorted(engine_defaults.items()):
        if quality := view.trial(number).quality:
            console.print(f"cross-engine floor: {label} (trial {number}) against {reference_name}, same probe: "
                          f"{cost_text(quality)}", highlight=False, markup=False)


def _bracket(stored: Stored | None) -> str:
    from tracetune.capacity.step import CapacityResult

    if not stored:
        return "-"
    capacity = CapacityResult.from_dict(stored)
    return " · ".join([capacity.bracket_text(), *capacity.caveats()])


def _print_failures(view, console) -> None:
    from tracetune.tuner.front import group_failures
    from tracetune.tuner.storage import Status

    ended = (Status.PRUNED, Status.REJECTED, Status.ENGINE_FAILED, Status.FAILED, Status.UNMEASURABLE)
    failed = [t for t in view.trials if t.status in ended or (t.status == Status.MEASURED and t.failure_reason)]
    causes = group_failures([(t.number, t.status, clipped(t.failure_reason or "")) for t in failed])
    for status, reason, numbers in causes:
        console.print(f"  {status} x{len(numbers)} (trials {', '.join(map(str, numbers[:8]))}"
                      f"{', ...' if len(numbers) > 8 else ''}): {reason}", highlight=False)


def clipped(reason: str, limit: int = 300) -> str:
    """A trial's reason within `limit` characters for a one-cause line, cut after its last whole
    clause (the stored reason and the dashboard keep it whole)."""
    if len(reason) <= limit:
        return reason
    head = reason[:limit]
    cut = max(head.rfind("; "), head.rfind(". "), head.rfind(", "), head.rfind(": "))
    return (head[:cut] if cut > limit // 2 else head.rstrip()) + " ..."


def _ci_of(name: str, summary: Stored, quality: Stored) -> tuple[float, float] | None:
    """An objective's 95% interval, read from the row's stored summary and quality (None: without one)."""
    from tracetune.quality.probe import QualityResult
    from tracetune.tuner.objectives import objective_estimate

    if not summary or name not in OBJECTIVES:
        return None
    typed_quality = QualityResult.from_dict(quality) if quality else None
    estimate = objective_estimate(name, Summary.from_dict(summary), typed_quality)
    return (estimate.low, estimate.high) if estimate else None
