"""From sampled search-space values to a `SimConfig`, and the simulator's defaults as the reference.
The knob `precision` sets `dtype`; `max_num_seqs` is the field of the same name."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from pydantic import ValidationError

from tracetune.engine_adapter.kind import CheckpointMaker, SpaceView, Unrunnable
from tracetune.engine_adapter.platform import Platform
from tracetune.engine_adapter.sim.config import SimConfig
from tracetune.errors import Rejected

# Knob -> the field it sets, where the names differ.
_RENAMED = {"precision": "dtype"}


def _settings(*layers: Mapping[str, object]) -> dict[str, object]:
    out = {_RENAMED.get(k, k): v for layer in layers for k, v in layer.items()}
    out.pop("engine", None)
    return out


def to_engine_config(values: Mapping[str, object], *, fixed: Mapping[str, object], platform: Platform,
                     model_dir: Path, quantized_checkpoints: Mapping[int, Path] | None = None,
                     make_checkpoint: CheckpointMaker | None = None, base: Mapping[str, object] | None = None,
                     flags: frozenset[str] | None = None) -> SimConfig:
    """The SimConfig for one trial; Rejected with every reason it cannot run. It runs anywhere."""
    try:
        return SimConfig.model_validate({**_settings(base or {}, fixed, values), "model": Path(model_dir)})
    except ValidationError as exc:
        raise Rejected([f"{'.'.join(map(str, e['loc'])) or 'settings'}: {e['msg']}" for e in exc.errors()]) from None


def reference_config(*, fixed: Mapping[str, object], model_dir: Path,
                     base: Mapping[str, object] | None = None) -> SimConfig:
    """The simulator's defaults under the fixed and command-line settings, in bf16 (no quality loss).
    Raises ValidationError for fixed settings it refuses."""
    settings = _settings(base or {}, fixed)
    settings.pop("dtype", None)
    return SimConfig.model_validate({**settings, "model": Path(model_dir)})


def unrunnable_choices(space: SpaceView, *, platform: Platform, model_dir: Path, flags: frozenset[str] | None = None,
                       base: Mapping[str, object] | None = None) -> Unrunnable:
    """Categorical choices the simulator refuses whatever the others are (a slot count under 1):
    {parameter: {choice: reason}}, each tried alone on top of the fixed settings. It runs anywhere."""
    out: Unrunnable = {}
    for name, param in space.parameters.items():
        for choice in param.choices or []:
            try:
                to_engine_config({name: choice}, fixed=space.fixed, platform=platform, model_dir=model_dir, base=base)
            except Rejected as exc:
                out.setdefault(name, {})[choice] = str(exc)
    return out
