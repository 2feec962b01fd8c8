"""A trial's Optuna user attributes, written and read in one place.

Every attribute key tracetune keeps on an Optuna trial is defined here once (`Attr`); the tuner writes
them through `TrialRecord.write` and everything that reads a study (the dashboard, `tune results`, the
front, warm start, the workers' coordination) reads them through `TrialRecord.of`. This module imports
no study runner, so the read-only dashboard may import it. Studies written by earlier versions read the
same: an attribute they lack reads as None, and `feasible` unset counts as feasible (older studies
kept it only on infeasible trials' rows).
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping
from typing import TYPE_CHECKING, Protocol

from tracetune.tuner.storage import COUNTED, SKIPPED, Status

if TYPE_CHECKING:
    import optuna

# A sampled parameter's value (`search_spaces.space.SearchSpace.sample`): a choice or a number.
ParamValue = str | int | float | bool | None


class Attr(enum.StrEnum):
    """The user attribute keys of a trial, as stored."""

    VALUES = "values"                              # the sampled parameter values, by the search space's names
    WORKER = "worker"                              # the worker measuring it (`tuner.coordination.worker_id`)
    WORKER_NAME = "worker_name"                    # that worker's readable name (`tuner.worker_name`)
    CONFIG = "config"                              # the engine configuration, as JSON, secrets redacted
    FAILURE_REASON = "failure_reason"              # why it failed, was pruned, or is kept off the front
    FEASIBLE = "feasible"                          # on the front's side of every constraint
    CONSTRAINTS = "constraints"                    # the SLOs' and quality gate's values (<= 0: kept)
    SAMPLER_CONSTRAINTS = "sampler_constraints"    # what the sampler sees (`tuner.objectives.set_constraints`)
    LOG_TAIL = "log_tail"                          # the engine's last log lines, when it failed
    DUPLICATE_OF = "duplicate_of"                  # the trial that measured the same configuration
    NOT_MEANINGFUL = "not_meaningful"              # measured, but never on the front (`tuner.front.not_meaningful`)
    DEFAULTS_OF = "defaults_of"                    # the engine whose own defaults it measures ("llamacpp")
    STATUS = "status"                              # how it ended (`tuner.storage.Status`); written last


class StudyAttr(enum.StrEnum):
    """The user attribute keys of a study, as stored (`tuner.optuna_study` writes them)."""

    RULES = "rules"                        # the rules its trials are measured under (`settings.study_rules`)
    OBJECTIVES = "objectives"              # its objectives' names, in order: set once a study is made
    SLOS = "slos"
    QUALITY_GATE = "quality_gate"          # the gate's spec, when it has one
    MAX_QUALITY_LOSS = "max_quality_loss"  # the gate's nats limit (drawn on the quality_loss axis)
    PLATFORM = "platform"
    VLLM_VERSION = "vllm_version"
    HEARTBEAT_S = "heartbeat_s"            # its workers' heartbeat: silent for twice this, a worker is gone
    TRACE_PROFILE = "trace_profile"        # `replay.profile.Profile.as_dict()`


class HasUserAttrs(Protocol):
    """An Optuna trial, running (`optuna.trial.Trial`) or finished (`optuna.trial.FrozenTrial`)."""

    @property
    def user_attrs(self) -> Mapping[str, object]: ...


def _status(value: object) -> Status | str | None:
    if value is None:
        return None
    text = str(value)
    return Status(text) if text in Status._value2member_map_ else text


def _floats(value: object) -> list[float] | None:
    return None if not isinstance(value, list) else [float(v) for v in value]


def _text(value: object) -> str | None:
    return None if value is None else str(value)


@dataclasses.dataclass(frozen=True)
class TrialRecord:
    """What tracetune keeps on one trial. A field left None is not written (and reads None when unset)."""

    values: Mapping[str, ParamValue] | None = None
    worker: str | None = None
    worker_name: str | None = None  # None: a trial from before names were kept (shown as unknown)
    config: dict[str, object] | None = None
    failure_reason: str | None = None
    feasible: bool | None = None  # None: not written; read as feasible (`is_feasible`)
    constraints: list[float] | None = None
    log_tail: str | None = None
    duplicate_of: int | None = None
    not_meaningful: str | None = None
    # In a study choosing between engines: the engine whose own defaults the trial measures (set when it is
    # queued; shown as "llama.cpp defaults" beside the reference, vLLM's defaults).
    defaults_of: str | None = None
    status: Status | str | None = None  # None: no ending recorded (running, or interrupted); a str: unknown here

    @classmethod
    def read(cls, attrs: Mapping[str, object]) -> TrialRecord:
        """The record of a trial whose user attributes are `attrs`."""
        values, config, original = attrs.get(Attr.VALUES), attrs.get(Attr.CONFIG), attrs.get(Attr.DUPLICATE_OF)
        feasible = attrs.get(Attr.FEASIBLE)
        return cls(values=dict(values) if isinstance(values, Mapping) else None,
                   worker=_text(attrs.get(Attr.WORKER)),
                   worker_name=_text(attrs.get(Attr.WORKER_NAME)),
                   config=dict(config) if isinstance(config, Mapping) else None,
                   failure_reason=_text(attrs.get(Attr.FAILURE_REASON)),
                   feasible=None if feasible is None else bool(feasible),
                   constraints=_floats(attrs.get(Attr.CONSTRAINTS)),
                   log_tail=_text(attrs.get(Attr.LOG_TAIL)),
                   duplicate_of=int(original) if isinstance(original, int | float | str) else None,
                   not_meaningful=_text(attrs.get(Attr.NOT_MEANINGFUL)),
                   defaults_of=_text(attrs.get(Attr.DEFAULTS_OF)),
                   status=_status(attrs.get(Attr.STATUS)))

    @classmethod
    def of(cls, trial: HasUserAttrs) -> TrialRecord:
        """The record kept on `trial`."""
        return cls.read(trial.user_attrs)

    def write(self, trial: optuna.trial.Trial) -> None:
        """Set this record's attributes on a running trial, the status last: a trial with a status has
        ended (`counted`; an interrupted trial, which has none, is queued again)."""
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if value is None:
                continue
            if isinstance(value, Mapping):
                value = dict(value)
            elif isinstance(value, enum.Enum):
                value = value.value
            trial.set_user_attr(Attr[field.name.upper()].value, value)

    @property
    def ended(self) -> bool:
        """A status was recorded: the trial ended (measured, failed, skipped), not interrupted."""
        return self.status is not None

    @property
    def is_feasible(self) -> bool:
        """On the front's side of every constraint; a trial without the attribute (older studies) is."""
        return True if self.feasible is None else self.feasible

    @property
    def counts(self) -> bool:
        """Its status counts toward --trials (measured, pruned or failed with a reason)."""
        return self.status in COUNTED

    @property
    def skipped(self) -> bool:
        """Its status cost no engine time (rejected, duplicate): not counted toward --trials."""
        return self.status in SKIPPED

    @property
    def measured(self) -> bool:
        """Measured (a trial without a status, from before statuses were kept, counts as measured)."""
        return self.status in (None, Status.MEASURED)
