"""Which search space for which engines: the default spaces, and a space over a choice of engines (an
`engine` parameter) read for one engine of it."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from tracetune.engine_adapter.choice import ENGINE

if TYPE_CHECKING:
    from tracetune.engine_adapter.kind import EngineKind

__all__ = ["CPU_SPACE", "DEFAULT_SPACE", "default_space", "one_engines_part"]

# tracetune's default search space (vLLM's knobs).
DEFAULT_SPACE = Path(__file__).resolve().parent / "default.yaml"
# vLLM or llama.cpp on a CPU: the main job's space for a choice of engines (and for llama.cpp alone).
CPU_SPACE = Path(__file__).resolve().parent / "cpu.yaml"


def default_space(kind: EngineKind) -> Path:
    """The space the main job searches for `kind` when --space names none: the engine's own where it
    names one (`EngineKind.default_space`), the default one for vLLM, the CPU one (both engines; one
    engine's part of it for that engine alone) otherwise."""
    from tracetune.engine_adapter.registry import DEFAULT_ENGINE

    if kind.default_space is not None:
        return kind.default_space
    return DEFAULT_SPACE if kind.name == DEFAULT_ENGINE else CPU_SPACE


def one_engines_part(data: dict[str, object], kind: EngineKind) -> dict[str, object]:
    """A space over a choice of engines (an `engine` parameter) read for one engine of it, `kind`: the
    parameters that exist for it, their `engine` condition dropped, and the fixed settings it
    understands. Other spaces, or spaces for a choice, as they are."""
    params = data.get("parameters")
    if ENGINE in kind.knobs or not isinstance(params, dict) or not isinstance(params.get(ENGINE), dict):
        return data
    engines = params[ENGINE].get("choices")
    if not isinstance(engines, list) or kind.name not in engines:
        raise ValueError(f"this space chooses between the engines {engines}, not {kind.name}; run it with "
                         f"--engine {'+'.join(map(str, engines or []))}")
    kept: dict[str, object] = {}
    for name, param in params.items():
        when = dict(param.get("when") or {}) if isinstance(param, dict) else {}
        if name == ENGINE or kind.name not in when.pop(ENGINE, [kind.name]):
            continue
        kept[name] = {**param, "when": when} if when else {k: v for k, v in param.items() if k != "when"}
    fixed = data.get("fixed")
    own = {k: v for k, v in fixed.items() if k in kind.knobs} if isinstance(fixed, dict) else fixed
    return {**data, "parameters": kept, "fixed": own}
