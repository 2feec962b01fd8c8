"""One trial as the dashboard sees it (`TrialView`): its status as the page shows it (stale heartbeats
are interrupted), its stored run read back as typed records, its metrics and what it changes from the
reference. Where it stands among the others: `dashboard.standing`."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from pathlib import Path

from tracetune.capacity.step import CapacityResult
from tracetune.dashboard.capacity import capacity_of
from tracetune.dashboard.metrics import metric_interval, metric_value, run_of
from tracetune.engine_adapter.metrics import EngineMetrics
from tracetune.quality.gate import GateDecision
from tracetune.quality.probe import StoredQuality
from tracetune.replay.acceptance import Acceptance, stored_acceptance
from tracetune.replay.metrics import Summary
from tracetune.tuner.objectives import Run
from tracetune.tuner.storage import REFERENCE_RUN
from tracetune.types import JsonDict, ParamValues

# Categories of a trial in the Pareto view, in drawing order.
CATEGORIES = ("pareto", "tie", "dominated", "infeasible", "pruned", "failed", "running", "queued", "duplicate")


def config_diff(config: JsonDict, reference: JsonDict, engine: str | None = None) -> JsonDict:
    """Settings where `config` differs from the reference, as engine `engine` reads them
    (`EngineKind.config_diff`; tracetune's default engine when the study names none), the model
    path shown by its directory name."""
    from tracetune.engine_adapter.registry import engine_kind

    diff = (engine_kind(engine) if engine else engine_kind()).config_diff(config, reference)
    if "model" in diff:
        diff["model"] = Path(str(diff["model"])).name
    return diff


def diff_text(diff: Mapping[str, object]) -> str:
    """What a configuration changes, as one line; another engine's own defaults say so."""
    if set(diff) == {"engine"}:
        from tracetune.engine_adapter.registry import engine_kind

        return f"{engine_kind(str(diff['engine'])).shown}'s own defaults (engine={diff['engine']})"
    return ", ".join(f"{k}={v}" for k, v in diff.items()) or "(same as reference)"


@dataclasses.dataclass
class TrialView:
    """One trial as the dashboard sees it."""

    number: int
    state: str                      # optuna state: COMPLETE, FAIL, RUNNING, ...
    # measured | pruned | rejected | engine_failed | failed | unmeasurable | interrupted | running
    status: str
    objective_values: dict[str, float]
    constraints: list[float]
    feasible: bool
    params: ParamValues             # search-space values
    config: JsonDict | None         # the engine config's dump
    diff: JsonDict
    summary: Summary | None = None
    quality: StoredQuality | None = None  # quality.probe.QualityResult.as_dict(), as the gate reads it
    engine: EngineMetrics | None = None  # the engine's counters (None: the summary's own)
    requests_jsonl: str | None = None
    failure_reason: str | None = None
    not_meaningful: str | None = None  # why the tuner keeps it off every front (`tuner.front.not_meaningful`)
    defaults_of: str | None = None  # the engine whose own defaults it measures, in a study choosing engines
    log_tail: str | None = None
    startup_s: float | None = None
    wall_s: float | None = None
    worker: str = ""  # the worker that measured it, or is measuring it (`tuner.worker_name`); "": unknown, queued
    heartbeat_age_s: float | None = None  # running: seconds since its worker's last heartbeat (None: none yet)
    on_front: bool = False
    beaten_by_reference: bool = False  # the reference is at least as good on every objective
    tied: bool = False  # dominated, but only by differences inside the 95% intervals (`clearly_dominates`)
    outside_gate: bool = False  # its quality breaks the study's gate (gate off: the default gate, not applied)
    only_the_gate: bool = False  # kept every SLO and served every request, but broke the quality gate
    gate_decision: GateDecision | None = None  # the shown gate's judgement of its quality interval
    violations: list[str] = dataclasses.field(default_factory=list)  # why it is infeasible, in words

    @property
    def is_reference(self) -> bool:
        return self.number == REFERENCE_RUN

    @property
    def label(self) -> str:
        return "ref" if self.is_reference else str(self.number)

    @property
    def measured(self) -> bool:
        return self.status == "measured" and self.summary is not None

    @property
    def category(self) -> str:
        # A duplicate reuses an earlier trial's result; a pruned trial stopped early, below an incumbent: not failures.
        if self.status in ("running", "queued", "duplicate", "pruned"):
            return self.status
        if not self.measured or self.state != "COMPLETE":
            return "failed"
        if not self.feasible:
            return "infeasible"
        return "pareto" if self.on_front else "tie" if self.tied else "dominated"

    def metric(self, name: str) -> float:
        if name in self.objective_values and math.isfinite(self.objective_values[name]):
            return self.objective_values[name]
        if not self.measured:
            return math.nan
        return metric_value(name, self.run)

    def interval(self, name: str) -> tuple[float, float] | None:
        """The metric's 95% interval (None when measured without one, or not measured)."""
        return metric_interval(name, self.run) if self.measured else None

    @property
    def run(self) -> Run | None:
        """The measured run as its metrics read it (None without a summary)."""
        return run_of(self.summary, self.quality, self.engine)

    @property
    def counters(self) -> EngineMetrics | None:
        """The engine's counters: its own row's, or those its summary kept (None: not measured)."""
        return self.engine or (EngineMetrics.from_dict(self.summary.engine) if self.summary else None)

    @property
    def capacity(self) -> CapacityResult | None:
        """Its capacity search's result (None: not searched, or not measured)."""
        return capacity_of(self.summary) if self.measured else None

    @property
    def acceptance(self) -> Acceptance | None:
        """Its speculation's acceptance probe, natural stops beside forced lengths (`replay.acceptance`;
        None: not speculative, not measured, or measured before the probe)."""
        return stored_acceptance(self.summary.acceptance) if self.summary is not None else None

    @property
    def speculation_caveats(self) -> list[str]:
        """Why its draft acceptance may not hold on real traffic (`Acceptance.caveats`; [] when it does,
        or without a probe)."""
        acceptance = self.acceptance
        return acceptance.caveats() if acceptance is not None else []

    @property
    def worker_text(self) -> str:
        """Its worker as a table cell: the name, with its last heartbeat while running ("-": unknown)."""
        if not self.worker:
            return "-"
        if self.status == "running" and self.heartbeat_age_s is not None:
            return f"{self.worker} · beat {_age_text(self.heartbeat_age_s)} ago"
        return self.worker

    @property
    def sample_sizes(self) -> str:
        """How many requests the latencies and how many probe texts the quality rest on."""
        parts = []
        if self.summary is not None:
            parts.append(f"{self.summary.requests} requests")
        if self.quality and self.quality.get("n_prompts"):
            parts.append(f"{self.quality['n_prompts']} probe texts")
        return ", ".join(parts)



def _age_text(seconds: float) -> str:
    seconds = max(seconds, 0.0)  # two clocks a moment apart: a heartbeat is never in the future
    if seconds < 3600:
        return f"{seconds:.0f} s"
    return f"{seconds / 3600:.1f} h" if seconds < 2 * 86400 else f"{seconds / 86400:.1f} days"


def trial_status(state: str, stored: str | None, reason: str | None, *, silent_s: float | None,
                 started_s: float | None, grace_s: float, worker: str = "") -> tuple[str, str | None]:
    """A trial's status and reason as the page shows them. RUNNING is running only while its worker
    (named `worker`, when known) beats (Optuna's heartbeat, or, without one, since it started) within
    `grace_s`; otherwise its worker is gone and the trial interrupted. WAITING is queued: no worker
    measures it until the study runs again."""
    if state == "RUNNING":
        its = f"its worker {worker}" if worker else "its worker"
        if silent_s is not None and silent_s > grace_s:
            return "interrupted", (f"interrupted: {its} stopped sending heartbeats {_age_text(silent_s)} ago "
                                   f"(stopped or crashed); resuming the study runs it again")
        if silent_s is None and started_s is not None and started_s > grace_s:
            return "interrupted", (f"interrupted: started {_age_text(started_s)} ago and no heartbeat from {its} "
                                   f"since (stopped or crashed); resuming the study runs it again")
        return "running", reason
    if state == "WAITING":
        return "queued", ("queued: waits for a worker (re-queued after an interruption, or enqueued); the study's "
                          "next run measures it")
    if stored is None:
        return "interrupted", reason or "interrupted: the tuner stopped during this trial (it is run again on resume)"
    return stored, reason


def worker_note(t: TrialView, grace_s: float) -> str:
    """Which worker measured the trial, or is measuring it and when it last beat, for its detail page
    ("": no worker known, e.g. a queued trial or one from before workers were named)."""
    if t.status == "running":
        who = f"worker {t.worker}" if t.worker else "its worker"
        beat = (f"its last heartbeat {_age_text(t.heartbeat_age_s)} ago" if t.heartbeat_age_s is not None
                else "no heartbeat yet")
        return f"running: {who} is measuring it now ({beat}; a worker silent for {grace_s:.0f} s is taken for gone)"
    if not t.worker:
        return ""
    return f"measured by worker {t.worker}" if t.measured else f"its worker: {t.worker}"
