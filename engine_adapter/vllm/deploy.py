"""How an export runs vLLM's server (`EngineKind.deployment`): `vllm serve MODEL ARGS...` on NVIDIA
GPUs in the vllm/vllm-openai image (tagged v<release>), its workers sharing tensors through /dev/shm,
without the environment only tracetune's measurements set (dev-mode endpoints, workarounds)."""

from __future__ import annotations

from tracetune.engine_adapter.kind import Deployment

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
)
