"""Which configurations share one quality measurement (`quality_key`), and which cannot differ from
the reference but by the platform's noise (`lossless_by_construction`), from their stored settings."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from tracetune.engine_adapter.kind import QualityIdentity
from tracetune.engine_adapter.registry import DEFAULT_ENGINE, ENGINES, engine_kind
from tracetune.stored import Stored

# What a configuration's quality depends on is its engine's (`EngineKind.quality`); vLLM's, as before:
QUALITY_SETTINGS = QualityIdentity().settings
LOSSLESS_SETTINGS = QualityIdentity().lossless


def _quality_settings(config_json: Stored, lossless_too: bool = True) -> dict[str, object]:
    """The settings a configuration's quality depends on (without the lossless ones unless
    `lossless_too`), each as it takes effect: the model (and an explicit GGUF) named by its file
    name (as `config_key`), an engine default the same as unset, no speculation the same whatever
    its unused draft length."""
    engine = str(config_json.get("engine") or DEFAULT_ENGINE)
    identity = engine_kind(engine).quality if engine in ENGINES else QualityIdentity()
    names = [k for k in identity.settings if lossless_too or k not in identity.lossless]
    ident = {k: None if isinstance(v := config_json.get(k), str) and v in identity.unset else v for k in names}
    ident["model"] = Path(str(ident["model"] or "")).name
    if ident.get("gguf"):
        ident["gguf"] = Path(str(ident["gguf"])).name
    spec = ident.get("speculative")
    if isinstance(spec, dict) and spec.get("method", "none") == "none":
        ident["speculative"] = {"method": "none"}
    if engine != DEFAULT_ENGINE:  # a configuration never shares a quality with another engine's
        ident["engine"] = engine
    return ident


def quality_key(config_json: Stored) -> str:
    """Identity of a configuration's quality."""
    ident = _quality_settings(config_json)
    return "quality:" + hashlib.sha256(json.dumps(ident, sort_keys=True, default=str).encode()).hexdigest()[:40]


def lossless_by_construction(config_json: Stored, reference_json: Stored) -> bool:
    """The configuration has the reference's engine, weights, precisions and kernels, and differs
    from it at most in batching, caching, scheduling and speculation: it must measure within the
    noise floor."""
    return _quality_settings(config_json, False) == _quality_settings(reference_json, False)
