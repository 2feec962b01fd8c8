"""The engine seam's types: every registered engine's parts accept the calls their protocols
declare (engine_adapter.kind), and a tunable engine gives a knob table."""

from __future__ import annotations

import inspect
import typing

import pytest

from tracetune.engine_adapter import kind as kind_module
from tracetune.engine_adapter.kind import EngineKind, Knob
from tracetune.engine_adapter.platform import Platform
from tracetune.engine_adapter.registry import ENGINES, engine_kind

PARTS = ["make", "command", "translate", "reference", "unrunnable", "relocate"]


def _protocol_of(field: str) -> type:
    """The protocol `EngineKind.<field>` is declared with (`X | None` -> X)."""
    hint = typing.get_type_hints(EngineKind, vars(kind_module))[field]
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
