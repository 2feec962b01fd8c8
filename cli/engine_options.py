"""Command-line flags for engine settings, shared by every `tune` subcommand that starts an engine."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from engine_adapter.errors import InputError

# VLLMConfig field -> the flag that sets it, so validation errors name what the user typed.
FLAG_OF_FIELD = {
    "model": "--model",
    "served_model_name": "--served-model-name",
    "dtype": "--dtype",
    "quantization": "--quantization",
    "max_num_seqs": "--max-num-seqs",
    "max_num_batched_tokens": "--max-num-batched-tokens",
    "kv_cache_dtype": "--kv-cache-dtype",
    "speculative": "--speculative",
    "speculative.method": "--speculative",
    "speculative.num_speculative_tokens": "--num-speculative-tokens",
    "speculative.draft_model": "--draft-model",
    "speculative.prompt_lookup_min": "--prompt-lookup-min",
    "speculative.prompt_lookup_max": "--prompt-lookup-max",
    "enable_prefix_caching": "--prefix-caching",
    "enable_chunked_prefill": "--chunked-prefill",
    "enforce_eager": "--eager",
    "max_model_len": "--max-model-len",
    "gpu_memory_utilization": "--gpu-memory-utilization",
    "kv_cache_space_gib": "--kv-cache-gib",
    "attention_backend": "--attention-backend",
    "load_format": "--load-format",
    "extra_args": "--engine-arg",
    "env": "--engine-env",
}


def add_engine_options(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("engine (vLLM) settings; unset ones keep vLLM's defaults")
    g.add_argument("--model", metavar="DIR", help="local Hugging Face model directory (default: bundled SmolLM2-135M-Instruct)")
    g.add_argument("--served-model-name", metavar="NAME")
    g.add_argument("--dtype", choices=["auto", "bfloat16", "float16", "float32"])
    g.add_argument("--quantization", metavar="METHOD", help="online weight quantization method, e.g. fp8 (GPU)")
    g.add_argument("--max-num-seqs", type=int, metavar="N", help="max sequences per batch")
    g.add_argument("--max-num-batched-tokens", type=int, metavar="N", help="max tokens per scheduler step")
    g.add_argument("--kv-cache-dtype", choices=["auto", "fp8", "fp8_e4m3", "fp8_e5m2", "bfloat16", "float16"])
    g.add_argument("--speculative", choices=["none", "ngram", "draft_model"], default="none")
    g.add_argument("--num-speculative-tokens", type=int, default=3, metavar="K", help="draft length (default 3)")
    g.add_argument("--draft-model", metavar="DIR", help="draft model directory (--speculative draft_model)")
    g.add_argument("--prompt-lookup-min", type=int, metavar="N")
    g.add_argument("--prompt-lookup-max", type=int, metavar="N")
    g.add_argument("--prefix-caching", action=argparse.BooleanOptionalAction, default=None)
    g.add_argument("--chunked-prefill", action=argparse.BooleanOptionalAction, default=None)
    g.add_argument("--eager", action=argparse.BooleanOptionalAction, default=False,
                   help="skip compilation/graph capture: starts ~3x faster on CPU, serves slower")
    g.add_argument("--max-model-len", type=int, metavar="N")
    g.add_argument("--gpu-memory-utilization", type=float, metavar="F")
    g.add_argument("--kv-cache-gib", type=float, metavar="GIB", help="explicit KV-cache size")
    g.add_argument("--attention-backend", metavar="NAME", help="GPU attention backend, e.g. FLASH_ATTN")
    g.add_argument("--load-format", metavar="FMT", help="e.g. dummy (random weights of the model's shape)")
    g.add_argument("--engine-arg", action="append", default=[], metavar="ARG",
                   help="extra vLLM server argument, repeatable (e.g. --engine-arg=--seed=1)")
    g.add_argument("--engine-env", action="append", default=[], metavar="KEY=VALUE",
                   help="extra environment variable for the server, repeatable")
    g.add_argument("--start-timeout", type=float, default=900.0, metavar="S",
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
    """Build and validate a VLLMConfig from parsed flags; errors name the flag."""
    from pydantic import ValidationError

    from engine_adapter.vllm_server import VLLMConfig

    spec: dict[str, Any] = {"method": args.speculative, "num_speculative_tokens": args.num_speculative_tokens}
    if args.draft_model is not None:
        spec["draft_model"] = args.draft_model
    if args.prompt_lookup_min is not None:
        spec["prompt_lookup_min"] = args.prompt_lookup_min
    if args.prompt_lookup_max is not None:
        spec["prompt_lookup_max"] = args.prompt_lookup_max
    try:
        return VLLMConfig(
            model=model_dir,
            served_model_name=args.served_model_name,
            dtype=args.dtype,
            quantization=args.quantization,
            max_num_seqs=args.max_num_seqs,
            max_num_batched_tokens=args.max_num_batched_tokens,
            kv_cache_dtype=args.kv_cache_dtype,
            speculative=spec,
            enable_prefix_caching=args.prefix_caching,
            enable_chunked_prefill=args.chunked_prefill,
            enforce_eager=args.eager,
            max_model_len=args.max_model_len,
            gpu_memory_utilization=args.gpu_memory_utilization,
            kv_cache_space_gib=args.kv_cache_gib,
            attention_backend=args.attention_backend,
            load_format=args.load_format,
            extra_args=args.engine_arg,
            env=_parse_env(args.engine_env),
        )
    except ValidationError as exc:
        raise InputError(validation_message(exc)) from None


def resolve_engine_config(args: argparse.Namespace, progress=lambda message: None) -> Any:
    """The VLLMConfig the flags describe, on the model they name (the bundled default if none)."""
    from engine_adapter.models import resolve_model

    return engine_config_from_args(args, resolve_model(args.model, progress))
