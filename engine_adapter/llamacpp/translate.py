"""From sampled search-space values to a `LlamaCppConfig`, with every reason a combination cannot
run given before any server starts; llama.cpp's defaults as the reference; the choices it can never
run; a config made ready (GGUF files made, the draft checked against the model's vocabulary).

Knobs (`settings.KNOBS`) map to fields: weight_format -> weights, parallel_slots -> parallel,
kv_cache_type -> cache_type_k and cache_type_v, speculative=none drops the draft knobs; the rest
are the fields of the same name."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from pathlib import Path

from pydantic import ValidationError

from tracetune.engine_adapter.kind import CheckpointMaker, EngineConfig, Progress, SpaceView, Unrunnable
from tracetune.engine_adapter.llamacpp.gguf import FORMATS
from tracetune.engine_adapter.llamacpp.server import (
    QUANTIZED_CACHE,
    LlamaCppConfig,
    derived_format,
    draft_file,
    made_ready,
    own,
)
from tracetune.engine_adapter.llamacpp.settings import SPECULATIVE
from tracetune.engine_adapter.platform import Platform
from tracetune.errors import InputError, Rejected
from tracetune.types import ParamValues, Scalar

# Knob -> the field it sets, where the names differ.
_RENAMED = {"weight_format": "weights", "parallel_slots": "parallel"}
_DRAFT_KNOBS = ("draft_model", "draft_max", "draft_min")


def _draft_reasons(settings: dict[str, object]) -> list[str]:
    """Pops `speculative`; drops the draft knobs when it is none; why the draft cannot run."""
    method = settings.pop("speculative", "none" if settings.get("draft_model") is None else "draft_model")
    if method not in SPECULATIVE:
        return [f"speculative={method} is not offered by llama.cpp (use {', '.join(SPECULATIVE)})"]
    if method == "none":
        for key in _DRAFT_KNOBS:
            settings.pop(key, None)
        return []
    draft = settings.get("draft_model")
    if draft is None:
        return ["speculative=draft_model needs a draft model: list it under draft_models in the search space "
                "(e.g. derived:Q4_K_M, the model's own 4-bit GGUF)"]
    fmt = derived_format(str(draft))
    if fmt is not None and fmt not in FORMATS:
        return [f"draft_model={draft}: llama.cpp derives drafts named derived:FORMAT, FORMAT one of "
                f"{', '.join(FORMATS)} (e.g. derived:Q4_K_M)"]
    return []


def to_engine_config(values: Mapping[str, object], *, fixed: Mapping[str, object], platform: Platform,
                     model_dir: Path, quantized_checkpoints: Mapping[int, Path] | None = None,
                     make_checkpoint: CheckpointMaker | None = None, base: Mapping[str, object] | None = None,
                     flags: frozenset[str] | None = None) -> LlamaCppConfig:
    """The LlamaCppConfig for one trial; Rejected with every reason it cannot run. GGUF files are
    made when the server starts (or by `prepared`), not here."""
    settings: dict[str, object] = {_RENAMED.get(k, k): v for k, v in {**(base or {}), **fixed, **values}.items()}
    settings.pop("engine", None)
    reasons = _draft_reasons(settings)
    kv = settings.pop("kv_cache_type", None)
    if kv is not None:
        settings.setdefault("cache_type_k", kv)
        settings.setdefault("cache_type_v", kv)
    if settings.get("cache_type_v") in QUANTIZED_CACHE and settings.get("flash_attn") == "off":
        reasons.append(f"a quantized V cache (cache_type_v={settings['cache_type_v']}) needs flash attention, "
                       f"and flash_attn=off")
    if reasons:
        raise Rejected(reasons)
    try:
        return LlamaCppConfig.model_validate({**settings, "model": Path(model_dir)})
    except ValidationError as exc:
        raise Rejected([f"{'.'.join(map(str, e['loc'])) or 'settings'}: {e['msg']}" for e in exc.errors()]) from None


def reference_config(*, fixed: Mapping[str, object], model_dir: Path,
                     base: Mapping[str, object] | None = None) -> LlamaCppConfig:
    """llama.cpp's defaults under the fixed settings: F16 weights, its own slots, batch and cache
    types, flash attention on auto, no draft. Raises ValidationError for fixed settings it refuses."""
    settings = {_RENAMED.get(k, k): v for k, v in {**(base or {}), **fixed}.items()}
    for key in ("engine", "weights", "gguf", "kv_cache_type", "cache_type_k", "cache_type_v", "speculative",
                *_DRAFT_KNOBS):
        settings.pop(key, None)
    return LlamaCppConfig.model_validate({**settings, "model": Path(model_dir)})


def unrunnable_choices(space: SpaceView, *, platform: Platform, model_dir: Path, flags: frozenset[str] | None = None,
                       base: Mapping[str, object] | None = None) -> Unrunnable:
    """Categorical choices that never run whatever the other parameters are: {parameter: {choice:
    reason}}. Each is tried on top of the fixed settings with the first value its conditions allow."""
    out: Unrunnable = {}
    for name, p in space.parameters.items():
        for choice in p.choices or []:
            values = _alone(space, name, choice)
            try:
                to_engine_config(values, fixed=space.fixed, platform=platform, model_dir=model_dir, base=base)
            except Rejected as exc:
                out.setdefault(name, {})[choice] = str(exc)
    return out


def _alone(space: SpaceView, name: str, choice: Scalar) -> ParamValues:
    values: ParamValues = {name: choice}
    for other, allowed in (space.parameters[name].when or {}).items():
        values[other] = allowed[0]
    if name == "speculative" and choice == "draft_model" and "draft_model" in space.parameters:
        drafts = space.parameters["draft_model"].choices or []
        if drafts:
            values["draft_model"] = drafts[0]
    return values


@functools.lru_cache(maxsize=32)
def _tokens(path: Path, size: int, mtime: float) -> tuple[str, ...]:
    """A GGUF file's vocabulary (its tokenizer.ggml.tokens), read with the gguf package."""
    import gguf

    field = gguf.GGUFReader(str(path)).fields.get("tokenizer.ggml.tokens")
    if field is None:
        raise InputError(f"{path} holds no tokenizer (tokenizer.ggml.tokens): it cannot serve as a model or draft")
    return tuple(bytes(field.parts[i]).decode("utf-8", "replace") for i in field.data)


def vocabulary(path: Path) -> tuple[str, ...]:
    stat = path.stat()
    return _tokens(path, stat.st_size, stat.st_mtime)


def vocabulary_problem(target: Path, draft: Path) -> str | None:
    """How `draft`'s GGUF vocabulary differs from `target`'s (None: they read token ids the same)."""
    mine, theirs = vocabulary(target), vocabulary(draft)
    if mine == theirs:
        return None
    if len(mine) != len(theirs):
        return f"the model has {len(mine)} tokens, the draft {len(theirs)}"
    i = next(i for i, (a, b) in enumerate(zip(mine, theirs, strict=True)) if a != b)
    return f"token id {i} is {mine[i]!r} for the model and {theirs[i]!r} for the draft"


def prepared(config: EngineConfig, progress: Progress) -> LlamaCppConfig:
    """`config` with its GGUF files made (weights, a derived or converted draft) and a draft that is
    not derived from the model checked against the model's vocabulary (InputError naming both)."""
    config = own(config)
    made_ready(config, progress)
    draft = draft_file(config)
    if draft is not None and derived_format(str(config.draft_model)) is None:
        problem = vocabulary_problem(config.weights_file(), draft)
        if problem:
            raise InputError(f"draft model {config.draft_model} does not share the model's tokenizer: {problem}. "
                             f"A draft proposes token ids the model verifies; use derived:Q4_K_M (the model's own "
                             f"4-bit GGUF) or a draft of the same model family")
    return config
