"""Command-line flags for engine settings, shared by every `tune` subcommand that starts an engine."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from tracetune.cli.options import positive_float
from tracetune.errors import InputError

B = argparse.BooleanOptionalAction
# The one list of engine flags: (VLLMConfig field, flag, argparse keywords). The parser, the config
# built from parsed flags and the flag named in a validation error all come from it.
ENGINE_FLAGS: list[tuple[str, str, dict[str, Any]]] = [
    ("model", "--model", dict(metavar="DIR", help="local Hugging Face model directory (default: bundled "
                                                 "SmolLM2-135M-Instruct)")),
    ("served_model_name", "--served-model-name", dict(metavar="NAME")),
    ("dtype", "--dtype", dict(choices=["auto", "bfloat16", "float16", "float32"])),
    ("quantization", "--quantization", dict(metavar="METHOD",
                                            help="online weight quantization method, e.g. fp8 (GPU)")),
    ("max_num_seqs", "--max-num-seqs", dict(type=int, metavar="N", help="max sequences per batch")),
    ("max_num_batched_tokens", "--max-num-batched-tokens", dict(type=int, metavar="N",
                                                                help="max tokens per scheduler step")),
    ("kv_cache_dtype", "--kv-cache-dtype",
     dict(choices=["auto", "fp8", "fp8_e4m3", "fp8_e5m2", "bfloat16", "float16"])),
    ("speculative.method", "--speculative", dict(choices=["none", "ngram", "draft_model"], default="none")),
    ("speculative.num_speculative_tokens", "--num-speculative-tokens", dict(type=int, default=3, metavar="K",
                                                                            help="draft length (default 3)")),
    ("speculative.draft_model", "--draft-model", dict(
        action="append", metavar="DIR", help="draft model directory for --speculative draft_model, or one made "
                                             "once from the model: derived:w8a8 (its 8-bit checkpoint), "
                                             "derived:layers-N (its first N layers); the main job searches each "
                                             "one given (repeatable)")),
    ("speculative.prompt_lookup_min", "--prompt-lookup-min", dict(type=int, metavar="N")),
    ("speculative.prompt_lookup_max", "--prompt-lookup-max", dict(type=int, metavar="N")),
    ("enable_prefix_caching", "--prefix-caching", dict(action=B, default=None)),
    ("enable_chunked_prefill", "--chunked-prefill", dict(action=B, default=None)),
    ("enforce_eager", "--eager", dict(action=B, default=False,
                                      help="skip compilation/graph capture: starts ~3x faster on CPU, serves slower")),
    ("max_model_len", "--max-model-len", dict(type=int, metavar="N")),
    ("gpu_memory_utilization", "--gpu-memory-utilization", dict(type=float, metavar="F")),
    ("kv_cache_space_gib", "--kv-cache-gib", dict(type=positive_float, metavar="GIB", help="explicit KV-cache size")),
    ("tensor_parallel_size", "--tensor-parallel-size", dict(type=int, metavar="N",
                                                            help="GPUs one replica spans (GPU)")),
    ("attention_backend", "--attention-backend", dict(metavar="NAME", help="GPU attention backend, e.g. FLASH_ATTN")),
    ("load_format", "--load-format", dict(metavar="FMT", help="e.g. dummy (random weights of the model's shape)")),
    ("extra_args", "--engine-arg", dict(action="append", default=[], metavar="ARG",
                                        help="extra vLLM server argument, repeatable (e.g. --engine-arg=--seed=1)")),
    ("env", "--engine-env", dict(action="append", default=[], metavar="KEY=VALUE",
                                 help="extra environment variable for the server, repeatable")),
]
# VLLMConfig field -> the flag that sets it, so validation errors name what the user typed.
FLAG_OF_FIELD = {field: flag for field, flag, _ in ENGINE_FLAGS} | {"speculative": "--speculative"}


def _dest(flag: str) -> str:
    return flag.lstrip("-").replace("-", "_")


def add_engine_options(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("engine (vLLM) settings; unset ones keep vLLM's defaults")
    for _, flag, keywords in ENGINE_FLAGS:
        g.add_argument(flag, **keywords)
    g.add_argument("--start-timeout", type=positive_float, default=900.0, metavar="S",
                   help="seconds to wait for the server to become healthy (default 900)")


def _parse_env(items: list[str]) -> dict[str, str]:
    env = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise InputError(f"--engine-env expects KEY=VALUE, got {item!r}")
        env[key] = value
    return env


def validation_message(exc: Any, flag_of_field: dict[str, str] = FLAG_OF_FIELD) -> str:
    lines = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err["loc"])
        where = flag_of_field.get(loc) or flag_of_field.get(loc.split(".")[0]) or loc or "engine settings"
        lines.append(f"{where}: {err['msg']}")
    return "Invalid engine settings:\n  " + "\n  ".join(lines)


def engine_config_from_args(args: argparse.Namespace, model_dir: Path) -> Any:
    """Build and validate a VLLMConfig from parsed flags (ENGINE_FLAGS); errors name the flag."""
    from pydantic import ValidationError

    from tracetune.engine_adapter.vllm.server import VLLMConfig

    fields: dict[str, Any] = {"model": model_dir, "speculative": {}}
    for field, flag, _ in ENGINE_FLAGS:
        value = getattr(args, _dest(flag))
        if field == "speculative.draft_model" and value:
            if len(value) > 1:
                raise InputError(f"--draft-model is given {len(value)} times: one engine serves one draft model "
                                 f"(the main job, tune --trace, searches several)")
            value = value[0]
        if field.startswith("speculative."):
            if value is not None:
                fields["speculative"][field.split(".", 1)[1]] = value
        elif field != "model":
            fields[field] = _parse_env(value) if field == "env" else value
    try:
        return VLLMConfig(**fields)
    except ValidationError as exc:
        raise InputError(validation_message(exc)) from None


def resolve_engine_config(args: argparse.Namespace, progress=lambda message: None) -> Any:
    """The VLLMConfig the flags describe, on the model they name (the bundled default if none).
    The flags are checked first: a bad one is an error before any model is prepared."""
    from tracetune.engine_adapter.models import resolve_model

    engine_config_from_args(args, Path(args.model or "."))
    config = engine_config_from_args(args, resolve_model(args.model, progress))
    return with_draft_resolved(config, progress)


def with_draft_resolved(config: Any, progress=lambda message: None) -> Any:
    """`config` with its draft model checked against its model (tokenizer and vocabulary) and a derived
    one (derived:...) made and served from its cached directory."""
    from tracetune.engine_adapter.vllm.draft import QUANTIZED_DRAFTS, check_draft, is_derived
    from tracetune.engine_adapter.vllm.quantize import quantized_checkpoint

    draft = config.speculative.draft_model
    if draft is None:
        return config
    check_draft(config.model, str(draft))
    if is_derived(draft):
        draft = quantized_checkpoint(config.model, QUANTIZED_DRAFTS.get(str(draft), str(draft)), progress)
    return config.model_copy(update={"speculative": config.speculative.model_copy(update={"draft_model": draft})})
