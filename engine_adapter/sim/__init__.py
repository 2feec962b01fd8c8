"""The simulated engine (`sim`), for tests and benchmarks: a real server process on a local port
whose latency is a known queueing model and whose answers lose a known synthetic quality, so that
every configuration's true capacity and the true Pareto front can be computed and set beside what a
study measured. It is never evidence about a real engine.

Its truth, defined once (`model.py`: slots, TTFT, TPOT slowing as the batch grows, the loss of each
precision), its settings and what they make of the truth (`config.py`), its deterministic language
model for the quality probe (`lm.py`), its HTTP server (`server.py`, `python -m
tracetune.engine_adapter.sim.server`), the managed process (`engine.py`), its flags and knobs
(`settings.py`), search-space values turned into settings with its defaults as reference
(`translate.py`), its search space (`space.yaml`) and the true front of a set of configurations
(`truth.py`). Other packages reach it through its `EngineKind`; imports stay lazy here."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, cast

if TYPE_CHECKING:
    from tracetune.engine_adapter.kind import EngineKind

SPACE = Path(__file__).resolve().parent / "space.yaml"


def kind() -> EngineKind:
    """The simulated engine's `EngineKind`."""
    from tracetune.engine_adapter.kind import EngineKind
    from tracetune.engine_adapter.sim.config import SimConfig
    from tracetune.engine_adapter.sim.engine import build_command, make_engine, this_machine
    from tracetune.engine_adapter.sim.settings import FLAGS, KNOBS
    from tracetune.engine_adapter.sim.translate import reference_config, to_engine_config, unrunnable_choices

    return EngineKind("sim", SimConfig, make_engine, build_command, translate=to_engine_config,
                      reference=reference_config, unrunnable=unrunnable_choices, knobs=KNOBS,
                      label="simulated engine (for tests and benchmarks)", flags=FLAGS, loads_model=False,
                      runs_on=this_machine, default_space=SPACE, watch_machine=False,
                      slots=lambda config: cast(SimConfig, config).max_num_seqs)
