"""Whose defaults a study's reference is, as every command and page names it (`EngineKind.defaults_label`):
its engine's, or in a choice of engines the first one's."""

from __future__ import annotations

import pytest

from tracetune.engine_adapter.registry import engine_kind


@pytest.mark.parametrize(("engine", "label"), [
    ("vllm", "vLLM's defaults"),
    ("llamacpp", "llama.cpp's defaults"),
    ("sim", "simulated engine's defaults"),  # its label's note "(for tests and benchmarks)" left out
    ("vllm+llamacpp", "vLLM's defaults"),
    ("llamacpp+vllm", "llama.cpp's defaults"),
])
def test_the_reference_is_named_by_the_first_engine(engine, label):
    assert engine_kind(engine).defaults_label == label


def test_without_an_engine_named_the_default_engines_defaults_are_the_reference():
    from tracetune.tuner.front import decide, default_reference_name

    assert default_reference_name() == engine_kind().defaults_label == "vLLM's defaults"
    assert decide([], None, ["ttft_p99"], ["minimize"]).reference_name == "vLLM's defaults"
