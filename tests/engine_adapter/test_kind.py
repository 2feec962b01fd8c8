"""The engine seam's types: every registered engine's parts accept the calls their protocols
declare (engine_adapter.kind), and a tunable engine gives a knob table."""

from __future__ import annotations

import inspect
import typing

import pytest
from pydantic import BaseModel, TypeAdapter

from tracetune.engine_adapter import kind as kind_module
from tracetune.engine_adapter.kind import EngineKind, Knob
from tracetune.engine_adapter.platform import Platform
from tracetune.engine_adapter.registry import ENGINES, engine_kind

PARTS = ["make", "command", "translate", "reference", "unrunnable", "relocate", "prepare"]


def _protocol_of(field: str) -> type:
    """The protocol `EngineKind.<field>` is declared with (`X | None` -> X)."""
    hint = typing.get_type_hints(EngineKind, {**vars(kind_module), "BaseModel": BaseModel})[field]
    members = [t for t in typing.get_args(hint) if t is not type(None)] or [hint]
    return members[0]


def _call_shape(protocol: type) -> tuple[list[object], dict[str, object]]:
    """A call with every parameter the protocol declares, by position or keyword as it declares them."""
    params = list(inspect.signature(protocol.__call__).parameters.values())[1:]
    args = [object() for p in params if p.kind is p.POSITIONAL_OR_KEYWORD]
    kwargs = {p.name: object() for p in params if p.kind is p.KEYWORD_ONLY}
    return args, kwargs


@pytest.mark.parametrize("name", sorted(ENGINES))
@pytest.mark.parametrize("part", PARTS)
def test_each_part_accepts_its_protocols_call(name, part):
    impl = getattr(engine_kind(name), part)
    if impl is None:
        return
    args, kwargs = _call_shape(_protocol_of(part))
    inspect.signature(impl).bind(*args, **kwargs)  # raises TypeError on a mismatch


@pytest.mark.parametrize("name", sorted(ENGINES))
def test_tunable_engines_give_knobs_and_every_tuning_part(name):
    kind = engine_kind(name)
    if not kind.tunable:
        return
    assert kind.knobs and all(isinstance(knob, Knob) for knob in kind.knobs.values())
    assert kind.reference is not None and kind.unrunnable is not None


def test_vllm_knobs_and_reference_come_through_the_kind(tmp_path):
    kind = engine_kind("vllm")
    assert kind.knobs["weight_bits"].values == (16, 8, 4)
    ref = kind.reference(fixed={"weight_bits": 4, "max_num_seqs": 8}, model_dir=tmp_path)
    assert ref.max_num_seqs == 8 and ref.quantization is None
    argv, _ = kind.command(ref, Platform.CUDA, port=9, python="py")
    assert argv[:3] == ["py", "-m", "vllm.entrypoints.openai.api_server"] and "--max-num-seqs" in argv


def test_vllm_relocates_model_and_draft_under_the_measured_name(tmp_path):
    kind = engine_kind("vllm")
    config = kind.config_model(model=str(tmp_path / "target"),
                               speculative={"method": "draft_model", "draft_model": str(tmp_path / "draft")})
    moved = kind.relocate(config, lambda path: "/models/" + path.rsplit("/", 1)[-1])
    assert (str(moved.model), str(moved.speculative.draft_model)) == ("/models/target", "/models/draft")
    assert moved.served_model_name == "target" and str(config.model) == str(tmp_path / "target")


def test_vllm_config_diff_flattens_speculation():
    diff = engine_kind("vllm").config_diff
    ref = {"model": "/m", "enforce_eager": True, "max_num_seqs": None, "speculative": {"method": "none"}}
    cand = {"model": "/m", "enforce_eager": True, "max_num_seqs": 16,
            "speculative": {"method": "ngram", "num_speculative_tokens": 4}}
    assert diff(cand, ref) == {"max_num_seqs": 16, "speculative": "ngram", "num_speculative_tokens": 4}
    assert diff(ref, ref) == {}
    # "auto" is vLLM's default: no difference from an unset reference, still shown against another value
    assert diff({**ref, "kv_cache_dtype": "auto"}, ref) == {}
    fp8 = {**ref, "kv_cache_dtype": "fp8"}
    assert diff({**ref, "kv_cache_dtype": "auto"}, fp8) == {"kv_cache_dtype": "auto"}


def test_an_engine_without_its_own_diff_compares_settings_as_stored():
    diff = engine_kind("openai").config_diff
    assert diff({"base_url": "http://a", "model": "m"}, {"base_url": "http://a"}) == {"model": "m"}


@pytest.mark.parametrize("name", sorted(ENGINES))
def test_every_flag_sets_a_field_of_the_engines_settings(name):
    kind = engine_kind(name)
    for flag in kind.flags:
        model, *parents, field = [kind.config_model, *flag.field.split(".")]
        for parent in parents:
            model = typing.get_type_hints(model)[parent]
        assert field in model.model_fields, flag
        if flag.choices is not None:  # read from the settings model: every choice validates
            for choice in flag.choices:
                TypeAdapter(model.model_fields[field].annotation).validate_python(choice)
    assert len({f.flag for f in kind.flags}) == len(kind.flags)


def test_vllm_knobs_and_flags_are_one_table():
    from tracetune.engine_adapter.vllm.settings import SETTINGS

    kind = engine_kind("vllm")
    assert list(kind.knobs) == [s.knob for s in SETTINGS if s.knob]
    assert kind.flags == tuple(s.flag for s in SETTINGS if s.flag)
    spec = next(f for f in kind.flags if f.flag == "--speculative")
    assert (spec.choices, spec.default) == (("none", "ngram", "draft_model"), "none")


def test_vllm_names_its_api_key_variable_and_reads_a_key_it_is_given(tmp_path):
    kind = engine_kind("vllm")
    assert (kind.api_key_env, kind.image) == ("VLLM_API_KEY", "vllm/vllm-openai")
    given = kind.given_api_key
    assert given(kind.config_model(model=tmp_path, extra_args=["--seed", "1", "--api-key", "k1"])) == "k1"
    assert given(kind.config_model(model=tmp_path, extra_args=["--api-key=k2"])) == "k2"
    assert given(kind.config_model(model=tmp_path)) is None
    assert engine_kind("openai").api_key_env is None and engine_kind("openai").image is None


def test_an_engine_refuses_another_engines_settings(tmp_path):
    vllm, openai = engine_kind("vllm"), engine_kind("openai")
    with pytest.raises(TypeError, match="another engine's settings"):
        vllm.command(openai.load_config({"base_url": "http://a"}), Platform.CPU)
    assert vllm.load_config({"model": str(tmp_path)}).gpus() == 1
