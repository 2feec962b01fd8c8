"""vLLM's settings as a user reaches them, described once: each `VLLMConfig` field's command-line
flag (`FLAGS`, which every `tune` command that starts vLLM reads through its `EngineKind`) and the
search-space knob that sets it (`KNOBS`), with choices and defaults read from `VLLMConfig` itself.
`weight_bits` is a knob without a field (`translate.py` realises it per platform); `speculative`
and its companions fill `SpeculativeConfig`. Also how a stored config reads against another
(`config_diff`)."""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Mapping
from pathlib import Path

from pydantic import BaseModel

from tracetune.engine_adapter.kind import EngineFlag, FlagValue, Knob, Knobs
from tracetune.engine_adapter.vllm.server import SpeculativeConfig, VLLMConfig

WEIGHT_BITS = (16, 8, 4)


@dataclasses.dataclass(frozen=True)
class Setting:
    """One setting: its flag (None: no flag), and the search-space knob that sets it (None: not
    searched) with what it sets and, for a knob no field checks, the only values it takes."""

    flag: EngineFlag | None
    knob: str | None = None
    about: str = ""
    values: tuple[int, ...] | None = None


def _field(path: str) -> tuple[type[BaseModel], str]:
    model: type[BaseModel] = VLLMConfig
    *parents, name = path.split(".")
    for parent in parents:
        model = {"speculative": SpeculativeConfig}[parent]
    return model, name


def _choices(path: str) -> tuple[str, ...]:
    """The values a Literal field takes, as its settings model declares them."""
    model, name = _field(path)
    annotation = model.model_fields[name].annotation
    literals = [a for a in typing.get_args(annotation) if typing.get_origin(a) is typing.Literal] or [annotation]
    return tuple(str(v) for v in typing.get_args(literals[0]))


def _default(path: str) -> str | int | bool | None:
    model, name = _field(path)
    default: str | int | bool | None = model.model_fields[name].default
    return default


def _flag(path: str, flag: str, value: FlagValue = "text", metavar: str | None = None, help: str | None = None, *,
          choices: bool = False, default: bool = False) -> EngineFlag:
    """The flag setting field `path`, its choices and default (when asked for) read from the model."""
    return EngineFlag(path, flag, value, metavar, help, _choices(path) if choices else None,
                      _default(path) if default else None)


SETTINGS: tuple[Setting, ...] = (
    Setting(_flag("model", "--model", metavar="DIR",
                  help="local Hugging Face model directory (default: bundled SmolLM2-135M-Instruct)")),
    Setting(_flag("served_model_name", "--served-model-name", metavar="NAME")),
    Setting(_flag("dtype", "--dtype", choices=True), "dtype", "activation/weight dtype"),
    Setting(_flag("quantization", "--quantization", metavar="METHOD",
                  help="online weight quantization method, e.g. fp8 (GPU)")),
    Setting(None, "weight_bits", "weight quantization bits (16 = unquantized)", values=WEIGHT_BITS),
    Setting(_flag("max_num_seqs", "--max-num-seqs", "int", "N", "max sequences per batch"),
            "max_num_seqs", "max sequences per batch"),
    Setting(_flag("max_num_batched_tokens", "--max-num-batched-tokens", "int", "N", "max tokens per scheduler step"),
            "max_num_batched_tokens", "max tokens per scheduler step"),
    Setting(_flag("kv_cache_dtype", "--kv-cache-dtype", metavar="DTYPE", choices=True),
            "kv_cache_dtype", "KV-cache precision (auto, fp8, ...)"),
    Setting(_flag("speculative.method", "--speculative", choices=True, default=True),
            "speculative", "speculative decoding method (none, ngram, draft_model)"),
    Setting(_flag("speculative.num_speculative_tokens", "--num-speculative-tokens", "int", "K",
                  f"draft length (default {_default('speculative.num_speculative_tokens')})", default=True),
            "num_speculative_tokens", "draft length"),
    Setting(_flag("speculative.draft_model", "--draft-model", "drafts", "DIR",
                  "draft model directory for --speculative draft_model, or one made once from the model: "
                  "derived:w8a8 (its 8-bit checkpoint), derived:layers-N (its first N layers); the main job "
                  "searches each one given (repeatable)"),
            "draft_model", "draft model directory, or derived:layers-N (speculative=draft_model)"),
    Setting(_flag("speculative.prompt_lookup_min", "--prompt-lookup-min", "int", "N")),
    Setting(_flag("speculative.prompt_lookup_max", "--prompt-lookup-max", "int", "N"),
            "prompt_lookup_max", "ngram: longest n-gram matched"),
    Setting(_flag("enable_prefix_caching", "--prefix-caching", "toggle"), "enable_prefix_caching",
            "prefix caching on/off"),
    Setting(_flag("enable_chunked_prefill", "--chunked-prefill", "toggle"), "enable_chunked_prefill",
            "chunked prefill on/off"),
    Setting(_flag("enforce_eager", "--eager", "toggle",
                  help="skip compilation/graph capture: starts ~3x faster on CPU, serves slower", default=True),
            "enforce_eager", "eager (no compilation/graphs) vs compiled"),
    Setting(_flag("max_model_len", "--max-model-len", "int", "N"), "max_model_len", "context length"),
    Setting(_flag("gpu_memory_utilization", "--gpu-memory-utilization", "float", "F"),
            "gpu_memory_utilization", "fraction of device memory"),
    Setting(_flag("kv_cache_space_gib", "--kv-cache-gib", "positive", "GIB", "explicit KV-cache size"),
            "kv_cache_space_gib", "explicit KV-cache size"),
    Setting(_flag("tensor_parallel_size", "--tensor-parallel-size", "int", "N", "GPUs one replica spans (GPU)"),
            "tensor_parallel_size", "GPUs one replica spans (capacity is compared per GPU)"),
    Setting(_flag("attention_backend", "--attention-backend", metavar="NAME",
                  help="GPU attention backend, e.g. FLASH_ATTN"), "attention_backend", "GPU attention backend"),
    Setting(_flag("load_format", "--load-format", metavar="FMT",
                  help="e.g. dummy (random weights of the model's shape)")),
    Setting(_flag("extra_args", "--engine-arg", "many", "ARG",
                  "extra vLLM server argument, repeatable (e.g. --engine-arg=--seed=1)")),
    Setting(_flag("env", "--engine-env", "pairs", "KEY=VALUE",
                  "extra environment variable for the server, repeatable")),
)

# The command-line flags, in the order `--help` lists them.
FLAGS: tuple[EngineFlag, ...] = tuple(s.flag for s in SETTINGS if s.flag is not None)
# Search-space parameter name -> its knob.
KNOBS: Knobs = {s.knob: Knob(s.about, s.values) for s in SETTINGS if s.knob is not None}


def config_diff(config: Mapping[str, object], reference: Mapping[str, object]) -> dict[str, object]:
    """Settings where `config` differs from the reference (nested speculative flattened; "auto",
    vLLM's default, the same as unset)."""
    def flat(c: Mapping[str, object]) -> dict[str, object]:
        out = {k: v for k, v in c.items() if k not in ("speculative", "env", "extra_args")}
        stored = c.get("speculative")
        spec: Mapping[str, object] = stored if isinstance(stored, Mapping) else {}
        out["speculative"] = spec.get("method", "none")
        if spec.get("method", "none") != "none":
            out["num_speculative_tokens"] = spec.get("num_speculative_tokens")
        if spec.get("draft_model"):
            out["draft_model"] = Path(str(spec["draft_model"])).name
        return out

    def same(x: object, y: object) -> bool:
        return bool((None if x == "auto" else x) == (None if y == "auto" else y))

    a, b = flat(config), flat(reference)
    return {k: v for k, v in a.items() if not same(b.get(k), v)}
