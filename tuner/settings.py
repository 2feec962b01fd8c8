"""What a study runs with: the settings the command line (or a test) gives the `Tuner` and its runner."""

from __future__ import annotations

import dataclasses
from typing import Any

from tracetune.replay.capacity import CapacityOptions
from tracetune.replay.metrics import SLO
from tracetune.replay.types import ReplayOptions
from tracetune.tuner.objectives import constraint_names
from tracetune.tuner.quality_gate import QualityGate


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
    start_timeout_s: float = 900.0
    timeout_s: float | None = None
    patience: int | None = None  # stop once the front is unchanged for this many counted trials in a row
    prune: bool = True  # stop a capacity search early where the trial cannot be on the front (`Tuner.prune_level`)
    presets: bool = True  # informed first trials (tuner.presets) before the sampler's
    warm_start: tuple[str, str] | None = None  # (storage URL, study): an earlier study's configs tried first
    enqueue: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    # A worker refreshes its running trial's (and claim's) heartbeat every `heartbeat_s`; one silent
    # for 2 x heartbeat_s is considered dead: its trial is failed and retried, its claim taken over.
    heartbeat_s: int = 30
    engine_port: int | None = None  # fixed port for this worker's engines (default: a free one)
    secrets: list[str] = dataclasses.field(default_factory=list, repr=False)  # never stored
    api_key: str | None = dataclasses.field(default=None, repr=False)  # sent to our own engines

    @property
    def grace_s(self) -> int:
        return 2 * self.heartbeat_s

    @property
    def n_user_constraints(self) -> int:
        return len(self.slos) + (self.max_quality_loss is not None)

    @property
    def constraint_names(self) -> list[str]:
        return constraint_names(self.slos, self.max_quality_loss)
