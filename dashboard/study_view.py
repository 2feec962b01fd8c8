"""A study as the dashboard and exports see it (`StudyView`): its objectives, SLOs and gate, its trials
(`dashboard.trial.TrialView`), the reference and the front's decision. Read from storage by
`dashboard.data.load_study`; where each trial stands: `dashboard.standing`."""

from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING

from tracetune.dashboard.capacity import capacity_of
from tracetune.dashboard.metrics import metric_value
from tracetune.dashboard.trial import TrialView
from tracetune.errors import InputError
from tracetune.quality.gate import QualityGate
from tracetune.replay.metrics import SLO, Estimate, Summary
from tracetune.tuner.front import Decision, economics
from tracetune.tuner.objectives import Run
from tracetune.tuner.storage import StoredReference

if TYPE_CHECKING:
    from tracetune.engine_adapter.kind import EngineKind

# The reference run's name in headings, legends and pickers, before whose defaults it is (`StudyView.reference_title`).
REFERENCE_TITLE = "reference"


@dataclasses.dataclass
class StudyView:
    """A study as the dashboard sees it: its settings, its trials, the reference (its engine's defaults)."""

    name: str
    storage: str
    objectives: list[str]
    directions: list[str]
    slos: list[str]
    max_quality_loss: float | None
    trials: list[TrialView]
    reference: StoredReference | None   # {"config", "probe", "summary"} as stored
    platform: str                       # the platform the study measured on (cpu | cuda | unknown)
    decision: Decision | None = None    # over the study objectives (reference included)
    economics: dict[str, float] = dataclasses.field(default_factory=dict)  # gpu_hour_cost, target_rate
    quality_gate: QualityGate | None = None  # shown as e.g. "kld<=0.01"
    vllm_version: str | None = None     # the vLLM the study measured with (None: a study from before it was kept)
    engine: str | None = None           # the engine the study ran (rules.engine; None: the default engine)
    reference_run: TrialView | None = None  # the reference as a candidate (number REFERENCE_RUN)
    noise_floor: dict[str, Estimate] = dataclasses.field(default_factory=dict)  # quality.gate.floor_estimates
    floor_text: str = ""                # the floor in one line, with the probe's size ("" without one)
    heartbeat_s: float = 30.0           # how often a worker beats; silent for twice this, it is gone
    reference_summary: Summary | None = None  # `reference`'s summary read back (None: not measured yet)

    @property
    def kind(self) -> EngineKind:
        """The engine the study ran (`engine`; a study stored before it was recorded: the default engine)."""
        from tracetune.engine_adapter.registry import engine_kind

        return engine_kind(self.engine) if self.engine else engine_kind()

    @property
    def reference_name(self) -> str:
        """Whose defaults the reference is, as every page and export says it: "vLLM's defaults",
        "llama.cpp's defaults" (`EngineKind.defaults_label`: in a choice of engines, the first's)."""
        return self.kind.defaults_label

    @property
    def reference_title(self) -> str:
        """The reference run as headings, legends and pickers name it: "reference (vLLM's defaults)"."""
        return f"{REFERENCE_TITLE} ({self.reference_name})"

    def title(self, t: TrialView) -> str:
        """A candidate as headings, legends and pickers name it: "trial 3", or `reference_title`."""
        return self.reference_title if t.is_reference else f"trial {t.number}"

    @property
    def quality_check(self) -> str:
        """The probe's self-check: lossless-by-construction trials within the floor, or too noisy."""
        from tracetune.quality.gate import self_check

        return self_check([(t.number, t.quality) for t in self.trials])

    def costs(self, summary: Summary | None) -> dict[str, float]:
        """$ per 1M tokens and replicas/GPUs for the study's --gpu-hour-cost / --target-rate."""
        if not self.economics or capacity_of(summary) is None or summary is None:
            return {}
        return economics(summary.capacity, **self.economics)

    def trial(self, number: int) -> TrialView:
        """A trial by number; REFERENCE_RUN: the reference's run."""
        for t in self.candidates:
            if t.number == number:
                return t
        raise InputError(f"study {self.name!r} has no trial {number}; trials: "
                         f"{[t.number for t in self.trials]}")

    @property
    def candidates(self) -> list[TrialView]:
        """The reference's run (the engine's defaults), then every trial: what tables, Compare and Export list."""
        return ([self.reference_run] if self.reference_run is not None else []) + self.trials

    @property
    def front(self) -> list[TrialView]:
        return [t for t in self.trials if t.category == "pareto"]

    @property
    def parsed_slos(self) -> list[SLO]:
        """The study's SLOs (`slos` holds them as the user wrote them) as `replay.metrics.SLO`s."""
        from tracetune.replay.metrics import parse_slos

        return [slo for spec in self.slos for slo in parse_slos(spec, flag="study SLO")]

    @property
    def workers(self) -> list[str]:
        """The names of the workers that measured its trials, or are measuring them (`tuner.worker_name`):
        more than one, and the pages say which worker measured what (`several_workers`)."""
        return sorted({t.worker for t in self.trials if t.worker})

    @property
    def several_workers(self) -> bool:
        """More than one worker measured its trials: the Trials table gets a worker column. A study one
        worker ran reads as it did before workers were named."""
        return len(self.workers) > 1

    @property
    def running(self) -> bool:
        """A worker is measuring a trial now (its heartbeat is recent); queued trials wait for one."""
        return any(t.status == "running" for t in self.trials)

    @property
    def gate_off(self) -> bool:
        """The study was run without a quality gate (`--max-quality-loss none`)."""
        return self.quality_gate is None and self.max_quality_loss is None

    @property
    def shown_gate(self) -> QualityGate:
        """The gate trials are judged by on the page: the study's, or (gate off) the default one,
        which then marks trials without having kept them off the front."""
        from tracetune.quality.gate import DEFAULT_GATE, parse_gate

        if self.quality_gate is not None:
            return self.quality_gate
        gate = parse_gate(self.max_quality_loss if self.max_quality_loss is not None else DEFAULT_GATE)
        return gate if gate is not None else QualityGate("nats", math.inf)  # `max_quality_loss` was "none"

    @property
    def gate_words(self) -> str:
        """The gate as the page names it: "the quality gate ppl<=+1%" or "the default gate ppl<=+1% (not set)"."""
        return (f"the default quality gate {self.shown_gate} (this study set none)" if self.gate_off
                else f"the quality gate {self.shown_gate}")

    def reference_metric(self, name: str) -> float:
        """The reference run's value of a metric (its quality loss is 0 by definition)."""
        summary = self.reference_summary
        if summary is None:
            return math.nan
        if name in ("quality_loss", "kld", "ppl_change"):
            return 0.0
        if name == "top1_agreement":
            return 1.0
        return metric_value(name, Run(summary))
