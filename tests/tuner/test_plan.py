"""The study's rules (tuner/plan.py) as a caller other than the command line builds them: random
weights' quality rules and the API key, handed to the engines without touching this process's
environment. (The engine each platform gets: tests/cli/test_engine_flags.py, through the flags.)"""

from __future__ import annotations

import os

import pytest

from tracetune.engine_adapter.registry import engine_kind
from tracetune.engine_adapter.vllm.server import VLLMConfig
from tracetune.errors import InputError
from tracetune.search_spaces.engines import default_space
from tracetune.search_spaces.space import load_space
from tracetune.tuner.plan import StudyPlan

VLLM = engine_kind("vllm")
SPACE = load_space(default_space(VLLM), VLLM)  # speculates (ngram among its choices)
OBJECTIVES = ["ttft_p99", "capacity", "quality_loss"]


def plan(lines: list[str], **asked) -> StudyPlan:
    return StudyPlan(say=lines.append, **asked)


def test_real_weights_keep_the_gate_and_the_objectives_and_say_nothing():
    lines: list[str] = []
    assert plan(lines).quality_rules(0.01, OBJECTIVES, SPACE, random_weights=False) == (0.01, OBJECTIVES)
    assert lines == []


def test_random_weights_get_no_quality_gate_and_refuse_one_asked_for():
    for given in (None, "none"):
        lines: list[str] = []
        gate, _ = plan(lines, max_quality_loss=given).quality_rules(0.01, OBJECTIVES, SPACE, random_weights=True)
        assert gate is None
        assert "output quality is not measurable, so no quality gate applies" in lines[0]
    with pytest.raises(InputError, match=r"--max-quality-loss ppl:\+2%: random weights .* have no output quality"):
        plan([], max_quality_loss="ppl:+2%").quality_rules(0.01, OBJECTIVES, SPACE, random_weights=True)


def test_random_weights_leave_quality_out_of_the_objectives_and_refuse_it_by_name():
    lines: list[str] = []
    _, objectives = plan(lines).quality_rules(None, OBJECTIVES, SPACE, random_weights=True)
    assert objectives == ["ttft_p99", "capacity"]
    assert "objectives: quality_loss left out (random weights)" in lines
    assert any("speculative decoding is measured but kept off the front" in line for line in lines)
    assert plan([]).quality_rules(None, ["ttft_p99"], SPACE, random_weights=True)[1] == ["ttft_p99"]
    with pytest.raises(InputError, match=r"--objectives ttft_p99,quality_loss: random weights .* no output quality"):
        plan([], objectives="ttft_p99,quality_loss").quality_rules(None, ["ttft_p99", "quality_loss"], SPACE,
                                                                  random_weights=True)


def test_the_api_key_goes_to_each_engines_variable_and_not_into_this_environment():
    choice = engine_kind("vllm+llamacpp")
    before = dict(os.environ)
    key = plan([], api_key_env="MY_KEY").api_key(choice, VLLMConfig(model="m"), {"MY_KEY": "s3cret"})
    assert key.value == "s3cret"
    assert dict(key.env) == {kind.api_key_env: "s3cret" for kind in choice.engines}
    assert len(key.env) == 2 and "s3cret" not in repr(key)
    assert dict(os.environ) == before


def test_an_api_key_that_cannot_reach_the_engines_is_an_input_error():
    with pytest.raises(InputError, match="--api-key-env MY_KEY: that environment variable is not set or empty"):
        plan([], api_key_env="MY_KEY").api_key(VLLM, VLLMConfig(model="m"), {"MY_KEY": ""})
    sim = engine_kind("sim")
    with pytest.raises(InputError, match="--api-key-env: .* servers take no API key"):
        plan([], api_key_env="MY_KEY").api_key(sim, sim.config_model(), {"MY_KEY": "k"})


def test_without_a_variable_the_key_is_the_one_the_engine_settings_give_their_server():
    given = VLLMConfig(model="m", extra_args=["--api-key", "in-args"])
    assert plan([]).api_key(VLLM, given, {}).value == "in-args"
    key = plan([]).api_key(VLLM, VLLMConfig(model="m"), {"VLLM_API_KEY": "not-asked"})
    assert key.value is None and not key.env


def test_the_space_pins_the_settings_given_for_every_trial_and_checks_the_tries(tmp_path):
    from tracetune.engine_adapter.platform import Platform

    lines: list[str] = []
    space = plan(lines).runnable_space(SPACE, VLLM, platform=Platform.CPU, model_dir=tmp_path,
                                       base={"max_num_seqs": 8}, tries=[{"weight_bits": 16}])
    assert "max_num_seqs" not in space.parameters and "max_num_seqs" in SPACE.parameters
    assert "search space: max_num_seqs=8 for every trial (set on the command line)" in lines
    with pytest.raises(InputError, match=r"--try names \['no_such'\], which are not parameters"):
        plan([]).runnable_space(SPACE, VLLM, platform=Platform.CPU, model_dir=tmp_path, base={},
                                tries=[{"no_such": 1}])
