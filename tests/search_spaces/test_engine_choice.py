"""Search spaces over a choice of engines (`engine: [vllm, b]`): each engine's knobs exist only where it
runs, validated against the choice's knob table; vLLM stands beside a small fake engine."""

from __future__ import annotations

import pytest

from tests.engine_adapter.test_choice import BConfig, _kind
from tracetune.engine_adapter.choice import choice_of
from tracetune.engine_adapter.kind import Knob
from tracetune.engine_adapter.registry import engine_kind
from tracetune.search_spaces.space import SpaceError, load_space


@pytest.fixture
def choice():
    b = _kind("b", BConfig, {"threads": Knob("threads"), "speculative": Knob("spec")}, [])
    return choice_of([engine_kind("vllm"), b])


def _load(tmp_path, text, kind):
    path = tmp_path / "space.yaml"
    path.write_text(text)
    return load_space(path, kind)


SPACE = """\
name: both
fixed: {threads: 2, enforce_eager: true}
parameters:
  engine: {choices: [vllm, b]}
  max_num_seqs: {choices: [8, 32], when: {engine: [vllm]}}
  threads_searched_as: {choices: [1]}
"""


def test_each_engines_knobs_exist_where_it_runs(tmp_path, choice):
    text = SPACE.replace("  threads_searched_as: {choices: [1]}\n", "")
    space = _load(tmp_path, text.replace("fixed: {threads: 2, enforce_eager: true}",
                                          "fixed: {enforce_eager: true}") + "  threads: {low: 1, high: 2, when: {engine: [b]}}\n",
                  choice)
    assert space.engines() == ["vllm", "b"]
    assert space.active("max_num_seqs", {"engine": "vllm"}) and not space.active("max_num_seqs", {"engine": "b"})
    assert space.size() == 2 + 2
    only_vllm = space.without({"engine": ["b"]})
    assert set(only_vllm.parameters) == {"engine", "max_num_seqs"}


def test_a_knob_of_one_engine_without_its_condition_is_named_with_the_fix(tmp_path, choice):
    text = "parameters:\n  engine: {choices: [vllm, b]}\n  max_num_seqs: {choices: [8, 32]}\n"
    with pytest.raises(SpaceError, match=r":3: field 'parameters.max_num_seqs': .*knob of vllm only, but exists "
                                         r"for engine b: give it when: \{engine: \[vllm\]\}"):
        _load(tmp_path, text, choice)
    wrong = "parameters:\n  engine: {choices: [vllm, b]}\n  threads: {low: 1, high: 2, when: {engine: [vllm, b]}}\n"
    with pytest.raises(SpaceError, match="knob of b only, but exists for engine vllm"):
        _load(tmp_path, wrong, choice)
    # A shared knob exists for both; a space without the engine parameter runs the first engine alone.
    _load(tmp_path, "parameters:\n  engine: {choices: [vllm, b]}\n  speculative: {choices: [none, ngram]}\n", choice)
    with pytest.raises(SpaceError, match="knob of b only, but exists for engine vllm"):
        _load(tmp_path, "parameters:\n  threads: {low: 1, high: 2}\n", choice)


def test_an_engine_not_in_the_choice_is_refused(tmp_path, choice):
    with pytest.raises(SpaceError, match=r":2: field 'parameters.engine': .*\['c'\] is not among the knob's values"):
        _load(tmp_path, "parameters:\n  engine: {choices: [vllm, c]}\n", choice)
    with pytest.raises(SpaceError, match="field 'fixed.engine': must be vllm or b, got 'c'"):
        _load(tmp_path, "fixed: {engine: c}\nparameters:\n  max_num_seqs: {choices: [8]}\n", choice)


def test_each_engine_checks_the_fixed_settings_it_understands(tmp_path, choice):
    text = "fixed: {threads: many}\nparameters:\n  engine: {choices: [vllm, b]}\n"
    with pytest.raises(SpaceError, match=r":1: field 'fixed.threads': Input should be a valid integer"):
        _load(tmp_path, text, choice)
    assert _load(tmp_path, text.replace("many", "2"), choice).fixed == {"threads": 2}


def test_a_knobs_own_values_bound_its_choices(tmp_path):
    with pytest.raises(SpaceError, match=r"weight_bits.choices: \[2\] is not among the knob's values \[16, 8, 4\]"):
        _load(tmp_path, "parameters:\n  weight_bits: {choices: [16, 2]}\n", engine_kind("vllm"))
