"""Inference engines tracetune can start, measure and stop.

`get_engine(name)` returns an engine class from the registry. Imports are lazy: this package is
also imported by the engine watchdog (`engine_adapter._guard`), which must start instantly.
"""

from __future__ import annotations

import importlib
from typing import Any

from engine_adapter.errors import InputError

# name -> "module:class"
ENGINES: dict[str, str] = {
    "vllm": "engine_adapter.vllm_server:VLLMServer",
    "openai": "engine_adapter.openai_endpoint:OpenAIEndpoint",
}


def get_engine(name: str) -> Any:
    """The engine class registered as `name`."""
    try:
        target = ENGINES[name]
    except KeyError:
        raise InputError(f"Engine type {name!r} is not registered. Available types: {sorted(ENGINES)}") from None
    module, _, attr = target.partition(":")
    return getattr(importlib.import_module(module), attr)


__all__ = ["ENGINES", "get_engine"]
