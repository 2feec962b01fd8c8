"""Argv and environment built from a VLLMConfig: every knob, platform rules, validation."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from tracetune.engine_adapter.platform import Platform
from tracetune.engine_adapter.vllm.server import (
    CPU_DEFAULT_KV_CACHE_GIB,
    SERVER_MODULE,
    VLLMConfig,
    build_command,
    check_log,
)
from tracetune.errors import InputError

MODEL = Path("/models/my model")


def argv_of(platform: Platform = Platform.CUDA, cpu_bf16: bool = True, **fields) -> list[str]:
    argv, _ = build_command(VLLMConfig(model=MODEL, **fields), platform, port=1234, python="py", cpu_bf16=cpu_bf16)
    return argv


def value_after(argv: list[str], flag: str) -> str:
    assert argv.count(flag) == 1, argv
    return argv[argv.index(flag) + 1]


def test_default_config_is_vllm_defaults_on_gpu():
    argv = argv_of()
    assert argv == ["py", "-m", SERVER_MODULE, "--model", str(MODEL), "--host", "127.0.0.1",
                    "--port", "1234", "--served-model-name", "my model"]


def test_cpu_gets_an_explicit_kv_cache_size_by_default():
    argv = argv_of(Platform.CPU)
    assert value_after(argv, "--kv-cache-memory-bytes") == str(int(CPU_DEFAULT_KV_CACHE_GIB * 2**30))


def test_cpu_without_native_bf16_defaults_to_float32():
    assert value_after(argv_of(Platform.CPU, cpu_bf16=False), "--dtype") == "float32"
    assert "--dtype" not in argv_of(Platform.CPU, cpu_bf16=True)
    assert value_after(argv_of(Platform.CPU, cpu_bf16=False, dtype="bfloat16"), "--dtype") == "bfloat16"
    assert "--dtype" not in argv_of(Platform.CUDA, cpu_bf16=False)


def test_cpu_default_kv_cache_yields_to_memory_fraction():
    argv = argv_of(Platform.CPU, gpu_memory_utilization=0.5)
    assert "--kv-cache-memory-bytes" not in argv
    assert value_after(argv, "--gpu-memory-utilization") == "0.5"


@pytest.mark.parametrize(
    ("field", "value", "flag", "expected"),
    [
        ("served_model_name", "svc", "--served-model-name", "svc"),
        ("dtype", "bfloat16", "--dtype", "bfloat16"),
        ("quantization", "fp8", "--quantization", "fp8"),
        ("max_num_seqs", 48, "--max-num-seqs", "48"),
        ("max_num_batched_tokens", 4096, "--max-num-batched-tokens", "4096"),
        ("kv_cache_dtype", "fp8", "--kv-cache-dtype", "fp8"),
        ("max_model_len", 2048, "--max-model-len", "2048"),
        ("gpu_memory_utilization", 0.85, "--gpu-memory-utilization", "0.85"),
        ("kv_cache_space_gib", 1.5, "--kv-cache-memory-bytes", str(int(1.5 * 2**30))),
        ("attention_backend", "FLASH_ATTN", "--attention-backend", "FLASH_ATTN"),
        ("load_format", "dummy", "--load-format", "dummy"),
    ],
)
def test_valued_knobs(field, value, flag, expected):
    assert value_after(argv_of(**{field: value}), flag) == expected


@pytest.mark.parametrize(
    ("field", "on", "off"),
    [
        ("enable_prefix_caching", "--enable-prefix-caching", "--no-enable-prefix-caching"),
        ("enable_chunked_prefill", "--enable-chunked-prefill", "--no-enable-chunked-prefill"),
    ],
)
def test_tri_state_toggles(field, on, off):
    assert on in argv_of(**{field: True}) and off not in argv_of(**{field: True})
    assert off in argv_of(**{field: False}) and on not in argv_of(**{field: False})
    unset = argv_of()
    assert on not in unset and off not in unset


def test_enforce_eager():
    assert "--enforce-eager" in argv_of(enforce_eager=True)
    assert "--enforce-eager" not in argv_of(enforce_eager=False)


def test_speculative_ngram_json():
    argv = argv_of(speculative={"method": "ngram", "num_speculative_tokens": 5,
                                "prompt_lookup_min": 2, "prompt_lookup_max": 4})
    assert json.loads(value_after(argv, "--speculative-config")) == {
        "method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_min": 2, "prompt_lookup_max": 4}


def test_speculative_draft_model_json():
    argv = argv_of(speculative={"method": "draft_model", "num_speculative_tokens": 2, "draft_model": "/m/draft"})
    assert json.loads(value_after(argv, "--speculative-config")) == {
        "method": "draft_model", "num_speculative_tokens": 2, "model": "/m/draft"}


def test_speculative_off_passes_nothing():
    assert "--speculative-config" not in argv_of(speculative={"method": "none", "num_speculative_tokens": 7})


def test_extra_args_come_last_verbatim():
    argv = argv_of(max_num_seqs=4, extra_args=["--seed", "7", "--max-logprobs=50"])
    assert argv[-3:] == ["--seed", "7", "--max-logprobs=50"]


def test_environment():
    _, env = build_command(VLLMConfig(model=MODEL, env={"FOO": "bar"}), Platform.CUDA)
    assert env["HF_HUB_OFFLINE"] == "1" and env["VLLM_SERVER_DEV_MODE"] == "1" and env["FOO"] == "bar"


def test_attention_backend_refused_on_cpu():
    with pytest.raises(InputError, match="attention_backend is a GPU setting"):
        argv_of(Platform.CPU, attention_backend="FLASH_ATTN")


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"max_num_seqs": 0}, "greater than 0"),
        ({"gpu_memory_utilization": 1.5}, "less than or equal to 1"),
        ({"kv_cache_dtype": "int3"}, "Input should be"),
        ({"speculative": {"method": "draft_model"}}, "needs draft_model"),
        ({"speculative": {"method": "ngram", "draft_model": "/d"}}, "only used with method='draft_model'"),
        ({"speculative": {"method": "ngram", "prompt_lookup_min": 5, "prompt_lookup_max": 2}},
         "prompt_lookup_min <= prompt_lookup_max"),
        ({"speculative": {"method": "ngram", "num_speculative_tokens": 0}}, "greater than or equal to 1"),
        ({"max_num_batched_tokens": 512, "max_model_len": 2048, "enable_chunked_prefill": False},
         "max_num_batched_tokens >= max_model_len"),
        ({"max_batch": 4}, "Extra inputs are not permitted"),
    ],
)
def test_config_validation(fields, message):
    with pytest.raises(ValidationError, match=message):
        VLLMConfig(model=MODEL, **fields)


def test_check_log_finds_silent_no_op_quantization():
    problems = check_log("INFO ... Quantizing 0 layers\nINFO CPU KV cache size: 9 tokens", Platform.CPU)
    assert len(problems) == 1 and "quantized 0 layers" in problems[0]


def test_check_log_finds_platform_mismatch():
    assert check_log("INFO GPU KV cache size: 1,000 tokens", Platform.CPU)
    assert check_log("INFO CPU KV cache size: 1,000 tokens", Platform.CPU) == []


def test_check_log_requires_a_quantized_kernel_for_a_quantized_checkpoint():
    line = "(Worker pid=1) INFO [__init__.py:846] Selected CPUInt8ScaledMMLinearKernel for CompressedTensorsW8A8Int8"
    assert check_log(line, Platform.CPU, expect_quantized=True) == []
    problems = check_log("INFO Loading weights took 0.25 seconds", Platform.CPU, expect_quantized=True)
    assert len(problems) == 1 and "no quantized kernel" in problems[0]
    assert check_log("INFO Loading weights took 0.25 seconds", Platform.CPU) == []


# vLLM 0.24's own lines (format strings from vllm/v1/worker/gpu_model_runner.py, compilation/monitor.py,
# compilation/backends.py, v1/engine/core.py), as a compiled start on a GPU writes them.
_COLD_START = """\
(EngineCore pid=7) INFO 12-01 10:00:05 [gpu_model_runner.py:5256] Model loading took 14.99 GiB memory and 4.213377 seconds
(EngineCore pid=7) INFO 12-01 10:00:20 [backends.py:393] Compiling a graph for compile range (1, 8192) takes 21.07 s
(EngineCore pid=7) INFO 12-01 10:00:31 [monitor.py:53] torch.compile took 27.45 s in total
(EngineCore pid=7) INFO 12-01 10:01:02 [gpu_model_runner.py:6657] Graph capturing finished in 19 secs, took 0.53 GiB
(EngineCore pid=7) INFO 12-01 10:01:03 [core.py:338] init engine (profile, create kv cache, warmup model) took 58.61 s (compilation: 27.45 s)
"""
_WARM_START = """\
(EngineCore pid=1399) INFO 12-01 12:01:44 [model_runner.py:302] Model loading took 13.75 GiB and 1.979987 seconds
(EngineCore pid=7) INFO 12-01 10:10:09 [backends.py:292] Directly load the compiled graph(s) for compile range (1, 8192) from the cache, took 2.671 s
(EngineCore pid=7) INFO 12-01 10:10:10 [monitor.py:53] torch.compile took 7.02 s in total
"""


def test_start_phases_reads_a_cold_and_a_warm_compiled_start():
    from tracetune.engine_adapter.vllm.server import start_phases

    cold = start_phases(_COLD_START)
    assert cold == {"weights_s": pytest.approx(4.213377), "compile_s": 27.45, "cuda_graphs_s": 19.0,
                    "init_engine_s": 58.61, "compile_cache": "miss"}
    warm = start_phases(_WARM_START)
    assert warm["compile_cache"] == "hit" and warm["compile_s"] == 7.02 and "cuda_graphs_s" not in warm
    assert warm["weights_s"] == pytest.approx(1.979987)
    assert start_phases("INFO some eager start\n") == {"compile_cache": None}
