"""What a study runs with: the settings the command line (or a test) gives the `Tuner` and its runner."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path

from tracetune.capacity.step import CapacityOptions
from tracetune.errors import InputError
from tracetune.quality.gate import QualityGate
from tracetune.replay.metrics import SLO, parse_slos
from tracetune.replay.types import ReplayOptions
from tracetune.tuner.objectives import Needs, constraint_names, needs
from tracetune.tuner.trial_record import ParamValue, StudyAttr


@dataclasses.dataclass
class StudySettings:
    study_name: str
    storage_url: str
    trials: int
    objectives: list[str]
    slos: list[SLO]
    max_quality_loss: QualityGate | float | None  # a float: nats (the plain-number form)
    sampler: str
    seed: int | None
    replay: ReplayOptions
    capacity: CapacityOptions | None = None  # search each config's capacity at the SLO
    client_procs: int | None = None  # replay client processes; None: enough for the rate, within free cores
    # --gpu-hour-cost / --target-rate, kept with the study so the dashboard and exports show them
    economics: dict[str, float] = dataclasses.field(default_factory=dict)
    probe_prompts: int = 64  # why 64 x 1024: docs/quality.md, "Probe size"
    probe_tokens: int = 1024
    # A speculative trial's acceptance measured again, natural stops against forced lengths
    # (`replay.acceptance`): on this many of the trace's prompts (0: not measured), each at most
    # `acceptance_tokens` output tokens.
    acceptance_prompts: int = 8
    acceptance_tokens: int = 256
    start_timeout_s: float = 900.0
    timeout_s: float | None = None
    patience: int | None = None  # stop once the front is unchanged for this many counted trials in a row
    prune: bool = True  # stop a capacity search early where the trial cannot be on the front (`incumbents.prune_rival`)
    presets: bool = True  # informed first trials (tuner.presets) before the sampler's
    warm_start: tuple[str, str] | None = None  # (storage URL, study): an earlier study's configs tried first
    enqueue: list[dict[str, ParamValue]] = dataclasses.field(default_factory=list)
    # A worker refreshes its running trial's (and claim's) heartbeat every `heartbeat_s`; one silent
    # for 2 x heartbeat_s is considered dead: its trial is failed and retried, its claim taken over.
    heartbeat_s: int = 30
    engine_port: int | None = None  # fixed port for this worker's engines (default: a free one)
    secrets: list[str] = dataclasses.field(default_factory=list, repr=False)  # never stored
    api_key: str | None = dataclasses.field(default=None, repr=False)  # sent to our own engines
    # What every engine server of the study gets in its environment (the API key, in the variable its
    # engine reads: `tuner.plan.StudyPlan.api_key`); never stored, never in this process's environment
    engine_env: dict[str, str] = dataclasses.field(default_factory=dict, repr=False)
    trace_sha256: str | None = None  # the trace file's content hash: one of the study's rules (`study_rules`)
    trace_profile: dict[str, object] | None = None  # `replay.profile.Profile.as_dict()`, kept with the study

    @property
    def grace_s(self) -> int:
        return 2 * self.heartbeat_s

    @property
    def measures_quality(self) -> bool:
        """Whether the study probes its trials' quality: quality is an objective, or the study gates it.
        One that does neither (random weights, whose plan drops both: `tuner.plan.StudyPlan`) spends
        no time on a probe."""
        return needs(self.objectives, Needs.PROBE) or self.max_quality_loss is not None

    @property
    def n_user_constraints(self) -> int:
        return len(self.slos) + (self.max_quality_loss is not None)

    @property
    def constraint_names(self) -> list[str]:
        return constraint_names(self.slos, self.max_quality_loss)


# The rules a study's trials are measured and ranked under, and the flag that sets each. They are kept
# with the study when it is created (the "objectives" user attribute, the rest under "rules") and
# checked when it is resumed (`check_rules`): trials measured under other rules never share a front.
RULE_FLAGS = {"objectives": "--objectives", "slo": "--slo", "attainment": "--attainment",
              "precision": "--precision", "trace_sha256": "--trace", "engine": "--engine", "model": "--model"}
RULES_ATTR = StudyAttr.RULES.value


def study_rules(settings: StudySettings, *, engine: str, model_dir: Path | str) -> dict[str, object]:
    """This run's rules (`RULE_FLAGS`): attainment and precision only where a capacity search uses
    them; the model by its directory's name (workers on other hosts keep it elsewhere)."""
    capacity = settings.capacity
    return {"objectives": list(settings.objectives), "slo": ",".join(str(s) for s in settings.slos),
            "attainment": capacity.attainment if capacity else None,
            "precision": capacity.precision if capacity else None,
            "trace_sha256": settings.trace_sha256, "engine": engine, "model": Path(str(model_dir)).name}


def _slo_rule(slos: list[object]) -> str:
    """The "slo" rule of SLOs an older study kept as a list, in the form `study_rules` writes (each read
    again where it can be, so a form written otherwise compares equal; kept as written where not)."""
    written = []
    for slo in map(str, slos):
        try:
            written += [str(one) for one in parse_slos(slo, flag="the study's SLO")]
        except InputError:
            written.append(slo)
    return ",".join(written)


def _shown(name: str, value: object) -> str:
    if value is None or value == "":
        return f"no {RULE_FLAGS[name]}"
    if name == "trace_sha256":
        return f"a --trace of sha256 {str(value)[:12]}"
    if name == "objectives" and isinstance(value, list | tuple):
        value = ",".join(map(str, value))
    return f"{RULE_FLAGS[name]} {value}"


def check_rules(study_name: str, attrs: Mapping[str, object], rules: Mapping[str, object]) -> bool:
    """Refuse (InputError, exit 2) to resume study `study_name`, whose user attributes are `attrs`,
    under `rules` (`study_rules`) that differ from those it was measured under, naming both. False
    when the study predates kept rules (only its objectives and SLO could be checked), True otherwise."""
    kept = attrs.get(RULES_ATTR)
    stored: dict[str, object] = dict(kept) if isinstance(kept, Mapping) else {}
    if attrs.get(StudyAttr.OBJECTIVES) is not None:  # kept by every tracetune, before the other rules were
        stored["objectives"] = attrs[StudyAttr.OBJECTIVES]
    if "slo" not in stored and isinstance(slos := attrs.get(StudyAttr.SLOS), list):  # so were its SLOs, as a list
        stored["slo"] = _slo_rule(slos)
    # A rule kept as None was not known when the study was made (a Tuner given no trace hash): unchecked.
    differ = [name for name in RULE_FLAGS if stored.get(name) is not None and stored[name] != rules.get(name)]
    if differ:
        before = ", ".join(_shown(name, stored[name]) for name in differ)
        now = ", ".join(_shown(name, rules.get(name)) for name in differ)
        raise InputError(f"study {study_name!r} was measured under {before}; this run asks {now}. Resume with "
                         f"the same rules, or start a new study: --study NEW")
    return kept is not None
