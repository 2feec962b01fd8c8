"""The llama.cpp settings a command line gives, checked before anything is prepared or started
(`EngineKind.check_given`): `--gguf` names a GGUF file (`gguf.check_gguf_file`) and comes without
`--weights` (which makes other weights from the model: the two contradict), and `--ctx-size` is
within what the model's slots can use: its trained context (read from the GGUF served, else the
model's config.json) times the slots, or a hard bound where the model states none. llama-server
itself would accept a context past its training (and warn in its log) or fail to allocate it."""

from __future__ import annotations

import json
from pathlib import Path

from tracetune.engine_adapter.config import EngineConfig
from tracetune.engine_adapter.llamacpp.config import LlamaCppConfig
from tracetune.engine_adapter.llamacpp.gguf import check_gguf_file, gguf_metadata
from tracetune.errors import InputError

# llama-server's slots when --parallel is not given ("auto": 4, one KV cache shared between them).
DEFAULT_SLOTS = 4
# The most tokens a slot may hold where the model states no trained context: past what any model is
# trained for (10M tokens at most so far).
HARD_MAX_SLOT_CTX = 1 << 24
# llama.cpp counts a context's tokens in 32 bits.
MAX_CTX = (1 << 32) - 1


def _positive_int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def trained_context(config: LlamaCppConfig) -> tuple[int | None, str]:
    """(the model's trained context in tokens, where it was read), (None, "") where it states none:
    the served GGUF's `<architecture>.context_length`, else config.json's `max_position_embeddings`
    (of its text model, for a model of several parts)."""
    if config.gguf is not None:
        meta = gguf_metadata(Path(config.gguf))
        key = f"{meta.get('general.architecture')}.context_length"
        found = _positive_int(meta.get(key))
        return (found, f"{key} in {config.gguf}") if found else (None, "")
    path = Path(config.model) / "config.json"
    try:
        model = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None, ""
    for part in (model, model.get("text_config")) if isinstance(model, dict) else ():
        if isinstance(part, dict) and (found := _positive_int(part.get("max_position_embeddings"))):
            return found, f"max_position_embeddings in {path}"
    return None, ""


def check_ctx_size(config: LlamaCppConfig) -> None:
    """An InputError when `config.ctx_size` (all slots together) is over what its slots can use."""
    if config.ctx_size is None:
        return
    slots = config.parallel or DEFAULT_SLOTS
    each = f"--parallel {slots}" if config.parallel else f"llama-server's default of {DEFAULT_SLOTS} slots"
    trained, source = trained_context(config)
    per_slot, why = (trained, f"the model's trained context ({source})") if trained else \
        (HARD_MAX_SLOT_CTX, "tracetune's bound where the model's trained context is not known")
    bound = min(per_slot * slots, MAX_CTX)
    if config.ctx_size > bound:
        raise InputError(f"--ctx-size {config.ctx_size}: over what the slots can use, {bound} tokens: {per_slot} a "
                         f"slot, {why}, x {each}; give --ctx-size {bound} or less")


def check_given(config: EngineConfig, given: frozenset[str]) -> None:
    """llama.cpp's `EngineKind.check_given`: --gguf a GGUF file and not with --weights, --ctx-size
    within the model's slots."""
    if not isinstance(config, LlamaCppConfig):
        raise TypeError(f"llama.cpp was handed {type(config).__name__}, another engine's settings")
    if config.gguf is not None:
        if "weights" in given:
            raise InputError(f"--gguf {config.gguf} and --weights {config.weights} contradict: --gguf serves that "
                             f"file as it is, --weights makes {config.weights} weights from --model; give one")
        check_gguf_file(Path(config.gguf))
    if "ctx_size" in given:
        check_ctx_size(config)
