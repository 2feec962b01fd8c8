"""A choice of engines (engine_adapter.choice): one kind whose `engine` knob picks, per configuration,
the engine that translates, starts, reads back and compares it. Two small fake engines stand for vLLM
and llama.cpp; one test runs vLLM's real code against the scripted server through the choice."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Literal

import pytest
from pydantic import BaseModel, ConfigDict

from tests.engine_adapter.contract import check_serving, check_stopping
from tests.engine_adapter.test_contract import SCRIPTED_SERVER
from tracetune.engine_adapter.choice import ChosenEngine, EngineChoice, choice_of
from tracetune.engine_adapter.kind import EngineFlag, EngineKind, Knob, plain_diff
from tracetune.engine_adapter.platform import Platform
from tracetune.engine_adapter.registry import engine_kind
from tracetune.errors import InputError, Rejected
from tracetune.search_spaces.space import SearchSpace


class AConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    model: Path
    slots: int = 4
    speculative: str = "none"

    def gpus(self) -> int:
        return 1

    def speculation(self) -> str:
        return self.speculative


class BConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    engine: Literal["b"] = "b"
    model: Path
    threads: int | None = None
    speculative: str = "none"

    def gpus(self) -> int:
        return 0

    def speculation(self) -> str:
        return self.speculative


class FakeEngine:
    """Records what it was asked; serves nothing."""

    def __init__(self, name: str, made: list[FakeEngine]) -> None:
        self.name, self.endpoint, self.quality_probe, self.managed = name, None, name == "a", True
        self.scoring = "prompt_logprobs"
        self.calls: list[str] = []
        made.append(self)

    def launch(self, config, timeout_s, on_tick=None):
        self.calls.append(f"launch {type(config).__name__}")
        return 1.5

    def start(self, config):
        self.calls.append("start")

    def health(self):
        return True

    def log_tail(self):
        return f"{self.name} log"

    def exit_code(self):
        return None

    def stop(self):
        self.calls.append("stop")


def _kind(name: str, model: type[BaseModel], knobs: dict[str, Knob], made: list[FakeEngine], *,
          available=None, unrunnable=None) -> EngineKind:
    def translate(values, *, fixed, platform, model_dir, quantized_checkpoints=None, make_checkpoint=None,
                  base=None, flags=None):
        settings = {**(base or {}), **fixed, **values}
        if settings.get("slots") == 0:
            raise Rejected(["slots=0"])
        if "scheme" in settings:
            settings["model"] = make_checkpoint(settings.pop("scheme"))
        return model.model_validate({"model": model_dir, **settings})

    def reference(*, fixed, model_dir, base=None):
        return model.model_validate({"model": model_dir, **(base or {}), **fixed})

    def command(config, platform, *, host="127.0.0.1", port=8000, python="py"):
        return [name, str(port)], {}

    flags = (EngineFlag("model", "--model"), EngineFlag(f"{name}_only", f"--{name}-only"))
    return EngineKind(name, model, lambda run_dir=None, *, platform=None, port=None, env=None: FakeEngine(name, made),
                      command, translate=translate, reference=reference, knobs=knobs, label=name.upper(),
                      flags=flags, unrunnable=unrunnable or (lambda space, **_: {}),
                      make_checkpoint=lambda model_dir, scheme, progress: Path(f"/ckpt/{name}/{scheme}"),
                      config_diff=lambda c, r: {k: v for k, v in plain_diff(c, r).items() if k != "model"},
                      available=available)


@pytest.fixture
def made() -> list[FakeEngine]:
    return []


@pytest.fixture
def choice(made) -> EngineChoice:
    a = _kind("a", AConfig, {"slots": Knob("slots"), "speculative": Knob("spec", ("none", "ngram")),
                             "scheme": Knob("checkpoint")}, made)
    b = _kind("b", BConfig, {"threads": Knob("threads"), "speculative": Knob("spec", ("none", "ngram")),
                             "scheme": Knob("checkpoint")}, made)
    return choice_of([a, b])


def test_knobs_are_the_engine_and_every_engines_own(choice):
    assert (choice.name, choice.shown) == ("a+b", "A or B")
    assert choice.knobs["engine"].values == ("a", "b")
    assert choice.knobs["slots"].engines == ("a",) and choice.knobs["threads"].engines == ("b",)
    assert choice.knobs["speculative"].engines == ("a", "b")
    assert [k.name for k in choice.engines] == ["a", "b"] and choice.tunable


def test_a_knob_two_engines_define_differently_is_refused(made):
    a = _kind("a", AConfig, {"speculative": Knob("spec", ("none", "ngram"))}, made)
    b = _kind("b", BConfig, {"speculative": Knob("spec", ("none", "draft"))}, made)
    with pytest.raises(InputError, match="knob 'speculative' means different things"):
        choice_of([a, b])
    with pytest.raises(InputError, match="two or more different engines"):
        choice_of([a, a])


def test_translate_goes_to_the_engine_the_values_name(choice, tmp_path):
    kw = dict(fixed={"slots": 8, "threads": 2}, platform=Platform.CPU, model_dir=tmp_path,
              base={"threads": 1, "slots": 2, "model": "x"})
    a = choice.translate({"speculative": "ngram"}, **kw)  # no engine named: the first
    assert isinstance(a, AConfig) and (a.slots, a.speculative) == (8, "ngram")
    b = choice.translate({"engine": "b", "speculative": "ngram"}, **kw)
    assert isinstance(b, BConfig) and (b.threads, b.speculative) == (2, "ngram")  # fixed over base; no slots
    with pytest.raises(Rejected, match="slots=0"):
        choice.translate({"engine": "a", "slots": 0}, **kw)
    with pytest.raises(InputError, match="'c' is not one of"):
        choice.translate({"engine": "c"}, **kw)


def test_each_engine_makes_its_own_checkpoints(choice, tmp_path):
    asked: list[str] = []

    def maker(scheme):
        asked.append(scheme)
        return choice.make_checkpoint(tmp_path, scheme, print)

    kw = dict(fixed={}, platform=Platform.CPU, model_dir=tmp_path, make_checkpoint=maker)
    assert choice.translate({"engine": "b", "scheme": "Q8_0"}, **kw).model == Path("/ckpt/b/Q8_0")
    assert choice.translate({"engine": "a", "scheme": "W8A8"}, **kw).model == Path("/ckpt/a/W8A8")
    assert choice.translate({"scheme": "derived:layers-4"}, **kw).model == Path("/ckpt/a/derived:layers-4")
    assert asked == ["b:Q8_0", "W8A8", "derived:layers-4"]


def test_the_reference_is_the_first_engines_defaults(choice, tmp_path):
    ref = choice.reference(fixed={"slots": 16, "threads": 3}, model_dir=tmp_path, base={"threads": 1})
    assert isinstance(ref, AConfig) and ref.slots == 16


def test_settings_are_read_back_and_named_by_their_engine(choice, tmp_path):
    a = choice.load_config({"model": str(tmp_path), "slots": 2})
    b = choice.load_config({"engine": "b", "model": str(tmp_path), "threads": 2})
    assert isinstance(a, AConfig) and isinstance(b, BConfig)
    assert choice.of(a).name == "a" and choice.of(b).name == "b"
    assert choice.load_config({"engine": "a", "model": str(tmp_path)}).slots == 4  # vLLM's configs have no field
    with pytest.raises(TypeError, match="none of them"):
        choice.of(object())
    assert choice.command(b, Platform.CPU, port=9) == (["b", "9"], {})


def test_a_diff_on_another_engine_names_it_and_reads_against_its_own_defaults(choice):
    ref = {"model": "/m", "slots": 4, "speculative": "none"}
    assert choice.config_diff({**ref, "slots": 8}, ref) == {"slots": 8}
    other = {"engine": "b", "model": "/m", "threads": 2, "speculative": "none"}
    assert choice.config_diff(other, ref) == {"engine": "b", "threads": 2}
    assert choice.config_diff({**other, "threads": None}, ref) == {"engine": "b"}  # b's defaults


def test_the_engine_made_starts_the_engine_each_config_names(choice, made, tmp_path):
    engine = choice.make(tmp_path)
    assert isinstance(engine, ChosenEngine) and engine.log_tail() == "" and not engine.health()
    assert engine.launch(BConfig(model=tmp_path), 5.0) == 1.5
    assert (engine.name, engine.quality_probe, engine.log_tail()) == ("b", False, "b log")
    engine.launch(AConfig(model=tmp_path), 5.0)  # the running one is stopped first
    assert [e.name for e in made] == ["b", "a"] and made[0].calls == ["launch BConfig", "stop"]
    assert engine.quality_probe
    engine.stop()
    assert made[1].calls == ["launch AConfig", "stop"]


def test_unrunnable_per_engine_and_engines_this_machine_lacks(made, tmp_path):
    def a_unrunnable(space, **_):
        assert set(space.parameters) == {"slots", "speculative"} and "engine" not in space.fixed
        assert all(not (p.when or {}).get("engine") for p in space.parameters.values())
        return {"speculative": {"ngram": "a cannot ngram"}, "slots": {64: "too many"}}

    a = _kind("a", AConfig, {"slots": Knob("slots"), "speculative": Knob("spec", ("none", "ngram"))}, made,
              unrunnable=a_unrunnable)
    b = _kind("b", BConfig, {"threads": Knob("threads"), "speculative": Knob("spec", ("none", "ngram"))}, made)
    choice = choice_of([a, b])
    space = SearchSpace.for_knobs({"parameters": {
        "engine": {"choices": ["a", "b"]}, "speculative": {"choices": ["none", "ngram"]},
        "slots": {"choices": [4, 64], "when": {"engine": ["a"]}},
        "threads": {"choices": [1, 2], "when": {"engine": ["b"]}}}}, choice.knobs)
    never = choice.unrunnable(space, platform=Platform.CPU, model_dir=tmp_path)
    assert never == {"slots": {64: "too many"}}  # b runs ngram, so it stays
    lacking = choice_of([a, _kind("b", BConfig, b.knobs, made, available=lambda: "b is not installed")])
    assert lacking.unrunnable(space, platform=Platform.CPU, model_dir=tmp_path) == {
        "engine": {"b": "b is not installed"}, "slots": {64: "too many"}, "speculative": {"ngram": "a cannot ngram"}}


def test_flags_are_every_engines_a_shared_string_once(choice):
    assert [f.flag for f in choice.flags] == ["--model", "--a-only", "--b-only"]


def test_vllm_runs_through_a_choice_on_the_scripted_server(monkeypatch, made, tmp_path):
    def command(config, platform, *, host="127.0.0.1", port=8000, **_):
        return [sys.executable, SCRIPTED_SERVER, "--port", str(port), "--model", config.name()], {}

    monkeypatch.setattr("tracetune.engine_adapter.vllm.server.build_command", command)
    vllm = engine_kind("vllm")
    choice = choice_of([vllm, _kind("b", BConfig, {"threads": Knob("threads")}, made)])
    engine = choice.make(tmp_path / "run")
    engine.launch(choice.load_config({"model": str(tmp_path / "model")}), 60.0)
    try:
        check_serving(engine)
    finally:
        engine.stop()
    check_stopping(engine)
