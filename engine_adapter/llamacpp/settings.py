"""llama.cpp's settings as a user reaches them, described once: each `LlamaCppConfig` field's
command-line flag (`FLAGS`) and the search-space knob that sets it (`KNOBS`), choices read from
`LlamaCppConfig` itself. Knob names differ from vLLM's except where they mean the same thing
(`speculative`, `draft_model`), since a study choosing between engines puts both engines' knobs in
one space. `kv_cache_type` is a knob without a field (it sets K and V, `translate.py`). Also how a
stored config reads against another (`config_diff`)."""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Mapping
from pathlib import Path

from tracetune.engine_adapter.kind import EngineFlag, FlagValue, Knob, Knobs
from tracetune.engine_adapter.llamacpp.server import LlamaCppConfig

SPECULATIVE = ("none", "draft_model")


@dataclasses.dataclass(frozen=True)
class Setting:
    """One setting: its flag (None: no flag), and the search-space knob that sets it (None: not
    searched) with what it sets and, for a knob no field checks, the only values it takes."""

    flag: EngineFlag | None
    knob: str | None = None
    about: str = ""
    values: tuple[str, ...] | None = None


def _choices(name: str) -> tuple[str, ...]:
    """The values a Literal field takes, as the settings model declares them."""
    annotation = LlamaCppConfig.model_fields[name].annotation
    literals = [a for a in typing.get_args(annotation) if typing.get_origin(a) is typing.Literal] or [annotation]
    return tuple(str(v) for v in typing.get_args(literals[0]))


def _flag(field: str, flag: str, value: FlagValue = "text", metavar: str | None = None, help: str | None = None, *,
          choices: bool = False, default: str | None = None) -> EngineFlag:
    return EngineFlag(field, flag, value, metavar, help, _choices(field) if choices else None, default)


SETTINGS: tuple[Setting, ...] = (
    Setting(_flag("model", "--model", metavar="DIR",
                  help="local Hugging Face model directory (default: bundled SmolLM2-135M-Instruct)")),
    Setting(_flag("served_model_name", "--served-model-name", metavar="NAME")),
    Setting(_flag("weights", "--weights", choices=True, default="F16",
                  help="GGUF weight format made once from the model"),
            "weight_format", "GGUF weight format (F16, BF16, Q8_0, Q6_K, Q5_K_M, Q4_K_M)"),
    Setting(_flag("gguf", "--gguf", metavar="FILE", help="serve this GGUF file instead of one made from the model")),
    Setting(_flag("parallel", "--parallel", "int", "N", "server slots (requests decoded together)"),
            "parallel_slots", "server slots (requests decoded together)"),
    Setting(_flag("ctx_size", "--ctx-size", "int", "N", "context size of all slots together"),
            "ctx_size", "context size of all slots together"),
    Setting(_flag("batch_size", "--batch-size", "int", "N", "logical batch size"), "batch_size", "logical batch size"),
    Setting(_flag("ubatch_size", "--ubatch-size", "int", "N", "physical micro-batch size"),
            "ubatch_size", "physical micro-batch size"),
    Setting(_flag("cache_type_k", "--cache-type-k", choices=True)),
    Setting(_flag("cache_type_v", "--cache-type-v", choices=True,
                  help="V cache type; quantized needs flash attention")),
    Setting(None, "kv_cache_type", "K and V cache type (f16, q8_0, q4_0; quantized V needs flash attention)",
            values=_choices("cache_type_k")),
    Setting(_flag("flash_attn", "--flash-attn", choices=True), "flash_attn", "flash attention (on, off, auto)"),
    Setting(None, "speculative", "speculative decoding (none, draft_model)", values=SPECULATIVE),
    Setting(_flag("draft_model", "--draft-model", "text", "GGUF",
                  help="draft model: a GGUF file, a Hugging Face directory, or derived:FORMAT (the model's own "
                       "GGUF in that format, e.g. derived:Q4_K_M)"),
            "draft_model", "draft model (GGUF, directory or derived:FORMAT; speculative=draft_model)"),
    Setting(_flag("draft_max", "--draft-max", "int", "N", "most tokens drafted per step"),
            "draft_max", "most tokens drafted per step"),
    Setting(_flag("draft_min", "--draft-min", "int", "N", "fewest tokens drafted per step")),
    Setting(_flag("cache_reuse", "--cache-reuse", "int", "N",
                  "smallest chunk reused from a slot's cache by KV shifting"),
            "cache_reuse", "prompt cache reuse by KV shifting (smallest chunk, 0 = off)"),
    Setting(_flag("threads", "--threads", "int", "N"), "threads", "threads generating"),
    Setting(_flag("threads_batch", "--threads-batch", "int", "N"), "threads_batch", "threads processing prompts"),
    Setting(_flag("extra_args", "--engine-arg", "many", "ARG",
                  "extra llama-server argument, repeatable (e.g. --engine-arg=--seed=1)")),
    Setting(_flag("env", "--engine-env", "pairs", "KEY=VALUE",
                  "extra environment variable for the server, repeatable")),
)

# The command-line flags, in the order `--help` lists them.
FLAGS: tuple[EngineFlag, ...] = tuple(s.flag for s in SETTINGS if s.flag is not None)
# Search-space parameter name -> its knob.
KNOBS: Knobs = {s.knob: Knob(s.about, s.values) for s in SETTINGS if s.knob is not None}


def config_diff(config: Mapping[str, object], reference: Mapping[str, object]) -> dict[str, object]:
    """Settings where `config` differs from the reference (paths shown by their file name; a
    setting missing from one counts as its default)."""
    defaults = LlamaCppConfig.model_fields

    def flat(c: Mapping[str, object]) -> dict[str, object]:
        out = {k: c.get(k, defaults[k].default) for k in defaults if k not in ("env", "extra_args", "model")}
        for key in ("gguf", "draft_model"):
            if out.get(key):
                out[key] = Path(str(out[key])).name
        return out

    a, b = flat(config), flat(reference)
    return {k: v for k, v in a.items() if b.get(k) != v}
