"""What an export says in its comments: where and how the trial was measured, what it costs in
quality and why it was chosen (`choice_notes`, also shown by `tune export` and the dashboard), what
was left out, and how to place each model directory where the deployment reads it."""

from __future__ import annotations

import re
import shlex
from pathlib import PurePosixPath

from tracetune.dashboard import capacity
from tracetune.dashboard.data import StudyView, TrialView
from tracetune.dashboard.export.options import ExportOptions
from tracetune.dashboard.export.pick import PickRule
from tracetune.dashboard.export.serve import CONTAINER_MODELS_DIR, Exported, ServeSpec, release
from tracetune.dashboard.export.text import comment_safe
from tracetune.dashboard.metrics import display_value
from tracetune.quality.gate import UNDECIDED, QualityGate
from tracetune.replay.acceptance import caveat_line


def measured_value(objective: str, trial: TrialView) -> str:
    """An objective's value as the header states it: quality_loss with its unit, and not measurable
    on random weights (noise against noise)."""
    if objective == "quality_loss":
        shown = display_value(objective, trial.metric(objective))
        return "not measurable (random weights)" if is_dummy(trial) else \
            shown if shown == "-" else f"{shown} nats/token"
    return display_value(objective, trial.metric(objective))


def header(study: StudyView, trial: TrialView, fmt: str, options: ExportOptions, spec: ServeSpec) -> list[str]:
    """The `#` comment lines every text format starts with."""
    assert spec.engine is not None and spec.deployment is not None
    lines = [
        f"tracetune export ({fmt}): study {study.name!r}, {label(trial, study)}",
        *platform_lines(study, options, spec.engine),
        "measured: " + ", ".join(f"{o}={measured_value(o, trial)}" for o in study.objectives),
    ]
    chosen_under = study.slos + ([f"quality gate {study.quality_gate}"] if study.quality_gate else [])
    if chosen_under:
        lines.append("chosen under: " + ", ".join(chosen_under))
    lines += choice_notes(study, trial, options.chosen_by)
    if is_dummy(trial):
        lines.append("WARNING: measured with random weights (load_format dummy): this server answers with noise "
                     "until --load-format is removed and the model points at real weights of the same shape")
    if trial.diff:
        lines.append("differs from the reference: " + ", ".join(f"{k}={v}" for k, v in trial.diff.items()))
    if trial.category == "infeasible" and not trial.is_reference:  # the reference's own warning: `choice_notes`
        lines.append("WARNING: this trial violates the study's SLOs or quality gate")
    if trial.beaten_by_reference:
        lines.append(f"WARNING: {study.reference_name} (the reference) are at least as good on every objective: "
                     "prefer the defaults")
    lines += capacity.header_lines(capacity.capacity_of(trial.summary))
    costs = study.costs(trial.summary)
    if "usd_per_1m_output_tokens" in costs:
        lines.append(f"at capacity, ${study.economics['gpu_hour_cost']:g}/GPU-hour: "
                     f"${costs['usd_per_1m_output_tokens']:.3g} per 1M output tokens, "
                     f"${costs['usd_per_1m_input_tokens']:.3g} per 1M input tokens")
    if "replicas" in costs:
        lines.append(f"for {study.economics['target_rate']:g} req/s of this traffic: {costs['replicas']:g} replicas, "
                     f"{costs['gpus_total']:g} GPUs")
    if fmt != "command":
        lines.append(f"image: {options.image}; port {options.port}; GPUs: {options.gpus}")
        if fmt in ("k8s", "helm-values") and not spec.deployment.shared_memory:
            req = options.requests(shared_memory=False)
            lines.append(f"requests: {req['cpu']} CPU, {req['memory']} memory (--cpu, --memory)")
        elif fmt in ("k8s", "helm-values"):
            req = options.requests()
            lines.append(f"requests: {req['cpu']} CPU, {req['memory']} memory (--cpu, --memory), /dev/shm "
                         f"{options.shm_gib}Gi (--shm-gib); nodeSelector and tolerations are the GPU operator's "
                         f"defaults: adjust them to your GPU nodes")
    if spec.dropped:
        lines.append("left out (credential-like, supply them from a secret store): " + ", ".join(spec.dropped))
    if spec.platform_only:
        lines.append("left out for the GPU (measured on the CPU, only the CPU needed them): "
                     + "; ".join(spec.platform_only))
    lines += placing_lines(spec, fmt, options)
    return ["# " + comment_safe(line) for line in lines]


def label(trial: TrialView, study: StudyView) -> str:
    """The trial as the comments name it."""
    return f"the reference ({study.reference_name})" if trial.is_reference else f"trial {trial.number}"


def trial_id(trial: TrialView) -> str:
    """How exports name the trial in annotations and JSON: its number, or "reference"."""
    return "reference" if trial.is_reference else str(trial.number)


def is_dummy(trial: TrialView) -> bool:
    """Measured with random weights (load_format dummy)."""
    return (trial.config or {}).get("load_format") == "dummy"


def platform_lines(study: StudyView, options: ExportOptions, engine: Exported) -> list[str]:
    """Where the study measured, and the release whose flags the export writes."""
    version, name, target = release(study, options, engine), engine.shown, engine.deployment.platform
    if not engine.deployment.records_version:
        return _unrecorded_platform_lines(study, options, engine, version)
    measured = f"{name} {study.vllm_version}" if study.vllm_version else f"a {name} version the study did not record"
    if study.platform == target:
        given = options.engine_version or study.vllm_version
        source = "" if given else ", the GPU release tracetune runs (--engine-version names another)"
        return [f"measured on NVIDIA GPU with {measured}; flags for {name} {version}{source}"]
    return [f"measured on platform {study.platform} with {measured}: these are the same "
            f"settings as flags of {name} {version} for NVIDIA GPUs, where their speed was not measured; "
            f"run a study on the GPU before relying on its numbers"]


def _unrecorded_platform_lines(study: StudyView, options: ExportOptions, engine: Exported, version: str) -> list[str]:
    """`platform_lines` for an engine whose release the study does not record (llama.cpp's server)."""
    name, target = engine.shown, engine.deployment.platform
    source = ("--engine-version" if options.engine_version
              else "the release tracetune builds; --engine-version names another")
    shown = {"cpu": "CPU", "cuda": "NVIDIA GPU"}.get(target, target)
    if study.platform == target:
        return [f"measured on platform {study.platform} with {name}; the same settings for {name} {version} "
                f"({source}) on the {shown}, as measured: its numbers hold on a machine like the measuring one (the "
                f"image's build picks its CPU kernels at run time; tracetune measured a build for the measuring CPU)"]
    return [f"measured on platform {study.platform} with {name}: these are the same settings for {name} {version} "
            f"({source}) on the {shown}, where their speed was not measured; measure there before relying on them"]


# Where tracetune keeps what it makes (engine_adapter.models, vllm.quantize, vllm.draft).
_MADE = {"quantized": "a quantized checkpoint tracetune made", "drafts": "a draft model tracetune derived",
         "gguf": "GGUF weights tracetune made",
         "models": "the model as tracetune prepared it"}


def made_here(path: str) -> str | None:
    """What a model directory or file is when tracetune made it (under its home, e.g.
    ~/.cache/tracetune/quantized/NAME-W8A8-HASH or gguf/NAME-Q8_0-HASH.gguf, or named so under another
    home), else None."""
    from tracetune.engine_adapter.models import tracetune_home

    p = PurePosixPath(path.rstrip("/"))
    named = re.search(r"-[0-9a-f]{12}(\.[A-Za-z0-9]+)?$", p.name)  # NAME-HASH, or a file NAME-HASH.gguf
    mine = p.parent.parent == PurePosixPath(str(tracetune_home())) or named
    return _MADE.get(p.parent.name) if mine else None


def placing_lines(spec: ServeSpec, fmt: str, options: ExportOptions) -> list[str]:
    """How to put each model directory (or weights file) where the deployment reads it, how a file
    tracetune made is made again, and the name clients use."""
    assert spec.deployment is not None
    files = spec.deployment.weight_files
    where, host_name = ("GPU host", "GPU_HOST") if spec.deployment.platform == "cuda" else ("serving host", "HOST")
    lines = []
    for host in spec.models:
        what, name = made_here(host), PurePosixPath(host.rstrip("/")).name
        if fmt in ("k8s", "helm-values"):
            copy = (f"read from PVC {options.models_pvc!r} at {CONTAINER_MODELS_DIR}/{name}: copy it there (from a pod "
                    f"that mounts the claim read-write): kubectl cp {shlex.quote(host)} POD:{CONTAINER_MODELS_DIR}/"
                    f"{shlex.quote(name)}")
        else:
            there = shlex.quote(host if files else host + "/")
            copy = (f"{'mounted at ' + spec.mounts[host] + '; ' if host in spec.mounts else ''}on the {where} at "
                    f"the same path: rsync -a {there} {host_name}:{there}")
        lines.append(f"model {'file' if files else 'directory'} {host}"
                     + (f" ({what}, on the measuring machine only)" if what else "") + ": " + copy)
    lines += spec.remade
    lines.append(f"clients request the model as {spec.served_name!r} ({spec.deployment.name_flag}, the name measured)")
    return lines


def choice_notes(study: StudyView, trial: TrialView, rule: PickRule | None = None) -> list[str]:
    """The chosen configuration's quality cost against the reference (perplexity change with its
    interval, KLD, top-1 agreement), whether the study's quality gate holds it (or that no gate was
    set), why its speculation's acceptance may not hold on real traffic, and, for a rule
    (`--best`/`--pick`), the better trade the gate turned down."""
    if trial.is_reference:
        return _reference_notes(study) + _turned_down(study, trial, rule)
    notes = _quality_notes(study, trial) + speculation_notes(trial)
    return notes if is_dummy(trial) else notes + _turned_down(study, trial, rule)


def _reference_notes(study: StudyView) -> list[str]:
    """The reference (the engine's defaults) chosen: no quality cost, and a warning where it breaks the SLO."""
    defaults = study.reference_name
    lines = [f"{defaults}: the reference every quality is measured against (no quality cost)"]
    if study.decision is not None and not study.decision.reference_feasible:
        breach = study.decision.reference_breach
        lines.append(f"WARNING: {defaults} break the study's SLO" + (f" ({breach})" if breach else "")
                     + ": this is the reference, not a recommendation; it will not serve this traffic within "
                       "the SLO")
    return lines


def speculation_notes(trial: TrialView) -> list[str]:
    """Why the trial's draft acceptance, on which its speed rests, may not hold on the user's traffic
    (`replay.acceptance`: mostly past the natural end, on synthesized prompts, too few drafts); [] when
    it holds, or the trial does not speculate."""
    caveats = caveat_line(trial.acceptance)
    return [f"SPECULATION: acceptance may not hold on your traffic: {caveats}"] if caveats else []


def _quality_notes(study: StudyView, trial: TrialView) -> list[str]:
    """A trial's quality cost against the reference and the gate's word on it (none on random weights)."""
    from tracetune.quality.gate import cost_text

    defaults = study.reference_name
    if is_dummy(trial):
        return [f"quality cost vs {defaults}: not measurable (random weights give speed, never quality): "
                "measure it with the real weights before relying on it"]
    measured = bool(trial.quality and trial.quality.get("ppl_change"))
    lines = [f"quality cost vs {defaults}: " + (cost_text(trial.quality) if measured else "not measured")]
    gate = study.quality_gate
    if gate is None:  # the page judges by the default gate then (`StudyView.shown_gate`): so does the export
        judged = f"; it is {_gate_word(study.shown_gate, trial, 'the default gate')}" if measured else ""
        lines.append("this study set no quality gate (--max-quality-loss none, or a study from before the "
                     "default gate), so nothing held this cost back" + judged)
    elif not measured:
        lines.append(f"the study's quality gate ({gate}) could not be checked: this quality was not measured")
    else:
        lines.append(_gate_word(gate, trial, "the study's quality gate"))
    return lines


def _gate_word(gate: QualityGate, trial: TrialView, name: str) -> str:
    """The gate's decision on the trial's quality interval (`QualityGate.decide`), in the export's words:
    within, OUTSIDE, or UNDECIDED (the interval reaches both sides of the limit; never called within)."""
    decision = gate.decide(trial.quality)
    if decision.within:
        return f"within {name} ({gate})"
    if decision.word == UNDECIDED:
        return "UNDECIDED" + decision.text(f"{name} ({gate})").removeprefix("undecided") + \
            "; not recommended until it is decided"
    return f"OUTSIDE {name} ({gate}): not recommended unless that loss is acceptable for this model and traffic"


def _turned_down(study: StudyView, chosen: TrialView, rule: PickRule | None) -> list[str]:
    """The trial the quality gate alone turned down (`TrialView.only_the_gate`: every SLO kept, every
    request served) that would beat `chosen` by the rule, with its cost."""
    from tracetune.quality.gate import cost_text

    if rule is None or study.quality_gate is None:
        return []
    sign = 1 if rule.goal == "max" else -1
    beyond = [t for t in study.trials if t.only_the_gate and all(c.holds(t.metric(c.metric)) for c in rule.where)
              and sign * t.metric(rule.metric) > sign * chosen.metric(rule.metric)]
    if not beyond:
        return []
    best = max(beyond, key=lambda t: (sign * t.metric(rule.metric), -t.number))
    return [f"outside the quality gate ({study.quality_gate}): trial {best.number} reaches {rule.metric} "
            f"{display_value(rule.metric, best.metric(rule.metric))} at {cost_text(best.quality)}; not exported "
            f"(--trial {best.number} exports it anyway)"]
