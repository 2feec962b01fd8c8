"""What the main job prints and writes when the study ends: the Pareto front with the reference (the
engine's defaults) competing, the verdict, the quality floor and self-check, failures grouped by
cause, and best.json / pareto.json."""

from __future__ import annotations

import json
import math
from pathlib import Path

from tracetune.engine_adapter.metrics import EngineMetrics
from tracetune.files import write_atomic
from tracetune.replay.acceptance import Acceptance, stored_caveats
from tracetune.replay.metrics import Summary
from tracetune.stored import Stored, mapping
from tracetune.tuner.objectives import OBJECTIVES


def fmt_objective(name: str, value: float) -> str:
    """An objective's value as the console shows it."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if name == "capacity":
        return f"{value:.3g} req/s"
    if name.endswith(("_p50", "_p90", "_p99", "_mean")):
        return f"{value * 1000:.0f} ms"
    if name == "quality_loss":  # nats per token, shown as the perplexity change it means
        return f"ppl {math.expm1(value) * 100:+.2f}%"
    return f"{value:.2f}"


def _row(label: int | str, values: dict[str, float], result: dict, ref_config: dict, args, engine) -> dict:
    """One candidate of the final table: the reference or a trial, with what it was measured (`engine`,
    the study's `EngineKind`: how its configs read against the reference)."""
    from tracetune.tuner.front import economics

    config = result.get("config") or {}
    summary = result.get("summary") or {}
    diff = {} if label == "reference" else engine.config_diff(config, ref_config) if config else {}
    if "model" in diff and "weight_bits" in (result.get("values") or {}):
        # a quantized checkpoint's path says less than the search-space value that made it
        diff = {"weight_bits": result["values"]["weight_bits"], **{k: v for k, v in diff.items() if k != "model"}}
    if "draft_model" in diff and "draft_model" in (result.get("values") or {}):
        diff["draft_model"] = result["values"]["draft_model"]  # derived:layers-4 rather than its cache directory
    return {"trial": label, "values": values, "config": config, "differs_from_reference": diff, "summary": summary,
            "quality": result.get("quality") or {}, "capacity": summary.get("capacity"),
            "economics": economics(summary.get("capacity"), gpu_hour_cost=args.gpu_hour_cost,
                                   target_rate=args.target_rate)}


def report_results(tuner, study, args, console, run_dir: Path) -> None:
    """The front (the engine's defaults competing like any trial), the verdict in plain words, failures
    grouped by reason, and best.json / pareto.json."""
    from tracetune.dashboard.data import load_study
    from tracetune.tuner.front import REFERENCE

    name, objectives = tuner.settings.study_name, tuner.settings.objectives
    reference = tuner.store.reference(name)
    ref_config = reference["config"] if reference else {}
    results = {r["trial_number"]: r for r in tuner.store.trials(name)}
    # The front and the verdict as the dashboard reads them: one reader, one decision
    decision = load_study(tuner.settings.storage_url, name).decision
    assert decision is not None  # a study with objectives has one
    defaults = decision.reference_name
    rows = []
    for c in decision.front:
        result = {"config": ref_config, "summary": reference.get("summary"), "quality": None} \
            if c.label == REFERENCE else results.get(c.label, {})
        rows.append(_row(c.label, dict(zip(objectives, c.values)), result, ref_config, args, tuner.engine))
    engine_defaults = _engine_defaults(study, tuner.engine)
    for r in rows:
        if r["trial"] in engine_defaults:
            r["shown"] = f"{r['trial']} ({engine_defaults[r['trial']]})"
    console.print(_front_table(rows, objectives, name, len(study.trials), args, reference_name=defaults))
    for line in config_lines(rows, reference_name=defaults):
        console.print(line, highlight=False, markup=False)
    for number, label in engine_defaults.items():
        if number not in {r["trial"] for r in rows}:
            console.print(f"  {label} (trial {number}): not on the front{_objectives_text(study, number, objectives)}",
                          highlight=False)
    _print_quality_floor(reference, results, console)
    _print_cross_engine_floor(engine_defaults, results, console, defaults)
    for r in rows:
        if caveats := stored_caveats(r["summary"]):
            console.print(f"  {r.get('shown') or r['trial']}: acceptance caveat: {caveats}", highlight=False,
                          markup=False)
    console.print(f"[bold]verdict[/]: {decision.verdict()}", highlight=False)
    if standings := _engine_standings(study, results, reference, decision, tuner):
        console.print(standings, highlight=False, markup=False)
    if decision.dominated_by_reference:
        console.print(f"  {defaults} beat trials {', '.join(map(str, decision.dominated_by_reference))} on every "
                      f"objective: they are not on the front.", highlight=False)
    _print_failures(study, console)
    write_atomic(run_dir / "pareto.json", json.dumps({"study": name, "objectives": objectives, "trials": rows,
                                                   "verdict": decision.verdict()}, indent=2, default=str))
    if decision.best is None:
        console.print("no feasible measured trial yet: nothing on the front.")
        return
    best = next(r for r in rows if r["trial"] == decision.best.label)
    best = {**best, "verdict": decision.verdict(), "by": decision.by,
            "reference_is_best": decision.reference_is_best}
    write_atomic(run_dir / "best.json", json.dumps(best, indent=2, default=str))
    which = f"{defaults} (the reference)" if decision.reference_is_best else f"trial {best['trial']}"
    if not decision.reference_feasible and decision.reference_is_best:
        which += ", which break the SLO themselves"
    console.print(f"best by {decision.by} on the front: {which} · wrote {run_dir / 'best.json'} and "
                  f"{run_dir / 'pareto.json'}", highlight=False)


def _engine_defaults(study, engine) -> dict[int, str]:
    """The trials measuring another engine's own defaults (a study choosing between engines), as the
    results label them: trial number -> "llama.cpp defaults"."""
    from tracetune.tuner.trial_record import TrialRecord

    shown = {kind.name: kind.shown for kind in engine.engines}
    return {t.number: f"{shown.get(name, name)} defaults" for t in study.trials
            if (name := TrialRecord.of(t).defaults_of) is not None}


def _engine_standings(study, results: dict[int, dict], reference: dict | None, decision, tuner) -> str:
    """In a study choosing between engines, each engine's best within the quality gate by the
    deciding objective, and which is ahead (`tuner.engine_standings`); "" in a one-engine study."""
    from tracetune.capacity.result import bracket_rps
    from tracetune.tuner.engine_standings import Entry, standings_text
    from tracetune.tuner.storage import Status
    from tracetune.tuner.trial_record import TrialRecord

    kinds = tuner.engine.engines
    if len(kinds) < 2 or not decision.by:
        return ""
    shown = {kind.name: kind.shown for kind in kinds}
    key, by = decision.objectives.index(decision.by), decision.by
    gated = tuner.settings.max_quality_loss is not None

    def entry(engine: str, name: str, value: float, summary: dict | None) -> Entry:
        high = bracket_rps((summary or {}).get("capacity"))[1] if by == "capacity" else None
        return Entry(shown.get(engine, engine), name, value, high)

    entries: list[Entry] = []
    outside: dict[str, int] = {}
    unprobed: dict[str, int] = {}  # missed the SLOs at the trace's rate: measured, its quality not probed
    if decision.reference_values is not None and decision.reference_feasible:
        entries.append(entry(kinds[0].name, "its defaults", decision.reference_values[key],
                             (reference or {}).get("summary")))
    for t in study.trials:
        record = TrialRecord.of(t)
        if not t.values or record.status not in (Status.MEASURED, Status.PRUNED):
            continue
        engine = str((record.values or {}).get("engine") or record.defaults_of or kinds[0].name)
        label = shown.get(engine, engine)
        if gated and (results.get(t.number) or {}).get("quality") is None:
            unprobed[label] = unprobed.get(label, 0) + 1
        elif gated and record.constraints and record.constraints[-1] > 0:
            outside[label] = outside.get(label, 0) + 1
            continue
        name = "its defaults" if record.defaults_of else f"trial {t.number}"
        entries.append(entry(engine, name, t.values[key], (results.get(t.number) or {}).get("summary")))
    return standings_text(entries, [kind.shown for kind in kinds], by, OBJECTIVES[by] == "maximize",
                          lambda v: fmt_objective(by, v), outside, unprobed)


def _objectives_text(study, number: int, objectives: list[str]) -> str:
    """': ttft_p99 300 ms, ...' for a measured trial; ' (its status)' for one that was not (an
    infeasible trial's values are the sampler's penalties, not measurements)."""
    from tracetune.tuner.trial_record import TrialRecord

    trial = study.trials[number]
    record = TrialRecord.of(trial)
    if not trial.values or not record.measured:
        return f" ({record.status or 'not measured'}: see below)"
    return ": " + ", ".join(f"{o} {fmt_objective(o, v)}" for o, v in zip(objectives, trial.values))










def _front_table(rows: list[dict], objectives: list[str], name: str, n_trials: int, args, *,
                 reference_name: str | None = None):
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
    if args.gpu_hour_cost is not None:
        table.add_column("$/1M out tok", justify="right")
    if args.target_rate is not None:
        table.add_column(f"GPUs for {args.target_rate:g} req/s", justify="right")
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
        if args.gpu_hour_cost is not None:
            cells.append(f"{econ.get('usd_per_1m_output_tokens', math.nan):.3g}")
        if args.target_rate is not None:
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
    acceptance = Acceptance.from_dict(mapping(summary).get("acceptance"))
    if acceptance is None:
        return ""
    rate = acceptance.natural.rate
    return f", nat {'-' if math.isnan(rate) else f'{rate:.0%}'}" + ("!" if acceptance.caveats() else "")




def _print_quality_floor(reference: dict | None, results: dict[int, dict], console) -> None:
    """The probe's noise floor and the study's self-check on it (lossless configurations within it)."""
    from tracetune.quality.gate import floor_text, self_check

    floor = floor_text((reference or {}).get("probe"))
    check = self_check([(n, r.get("quality")) for n, r in sorted(results.items())])
    for line in (floor, check):
        if line:
            console.print(("[yellow]" + line + "[/]") if "too noisy" in line else line, highlight=False)


def _print_cross_engine_floor(engine_defaults: dict[int, str], results: dict[int, dict], console,
                              reference_name: str) -> None:
    """Another engine's own defaults against the reference (`reference_name`: the first engine's), by the
    same probe: how far two engines serving the same weights differ before any setting changes (the
    floor a cross-engine comparison rests on)."""
    from tracetune.quality.gate import cost_text

    for number, label in sorted(engine_defaults.items()):
        quality = (results.get(number) or {}).get("quality")
        if quality:
            console.print(f"cross-engine floor: {label} (trial {number}) against {reference_name}, same probe: "
                          f"{cost_text(quality)}", highlight=False, markup=False)


def _bracket(stored: Stored | None) -> str:
    from tracetune.capacity.step import CapacityResult

    if not stored:
        return "-"
    capacity = CapacityResult.from_dict(stored)
    return " · ".join([capacity.bracket_text(), *capacity.caveats()])


def _print_failures(study, console) -> None:
    from tracetune.tuner.front import group_failures
    from tracetune.tuner.storage import Status
    from tracetune.tuner.trial_record import TrialRecord

    ended = (Status.PRUNED, Status.REJECTED, Status.ENGINE_FAILED, Status.FAILED, Status.UNMEASURABLE)
    records = [(t.number, TrialRecord.of(t)) for t in study.trials]
    failed = [(n, r) for n, r in records if r.status in ended or (r.status == Status.MEASURED and r.failure_reason)]
    causes = group_failures([(n, str(r.status), clipped(r.failure_reason or "")) for n, r in failed])
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
