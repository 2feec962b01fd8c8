"""What every caller reads of an engine's settings, whatever the engine (`EngineConfig`). Its own
module, importing nothing of tracetune's, so that the engine contract
(`base.py`) and the engine seam (`kind.py`, which re-exports it) both name it without importing
each other."""

from __future__ import annotations

from typing import Protocol


class EngineConfig(Protocol):
    """What callers read of any engine's settings (each engine's pydantic settings model meets it):
    the accelerators one replica occupies, and the settings as JSON (stored with each trial)."""

    def gpus(self) -> int: ...

    def speculation(self) -> str:
        """The speculative decoding method it serves with ("none": it does not speculate)."""
        ...

    def model_dump_json(self) -> str: ...

    def model_dump(self, *, mode: str = ..., exclude_defaults: bool = ...) -> dict[str, object]: ...
