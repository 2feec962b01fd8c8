"""Each engine's flags in its own group (cli/engine_options.py): a flag string two engines declare is one
option, the chosen engine reads its own flags only, and a flag only another engine understands is a usage
error naming that engine and the equivalent. Also the main job's --engine and its default on a CPU."""

from __future__ import annotations

import argparse
import dataclasses
import io
from pathlib import Path

import pytest
from rich.console import Console

from tracetune.cli.engine_options import (
    SAME_SETTING,
    add_engine_options,
    engine_config_from_args,
    given_flags,
    started_engines,
)
from tracetune.cli.main import _build_parser, main
from tracetune.engine_adapter.platform import Platform
from tracetune.engine_adapter.registry import ENGINES, engine_kind


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser()
    parser.add_argument("--engine")
    add_engine_options(parser)
    return parser


def test_each_engine_has_its_group_and_a_shared_flag_is_one_option():
    parser = _parser()
    groups = {g.title: g.description for g in parser._action_groups}
    assert groups["engine (vLLM) settings"] == "unset ones keep vLLM's defaults"
    assert groups["engine (llama.cpp) settings"] == "unset ones keep llama.cpp's defaults"
    strings = [s for a in parser._actions for s in a.option_strings]
    assert len(strings) == len(set(strings))  # argparse would refuse a second --model anyway
    llama = next(g for g in parser._action_groups if "llama.cpp" in (g.title or ""))
    own = {s for a in llama._group_actions for s in a.option_strings}
    assert "--parallel" in own and "--weights" in own and "--model" not in own  # --model: in vLLM's group


def test_the_chosen_engine_reads_its_own_flags(tmp_path):
    args = _parser().parse_args(["--engine", "llamacpp", "--weights", "Q8_0", "--parallel", "8",
                                 "--draft-model", "derived:Q4_K_M", "--engine-env", "A=1"])
    config = engine_config_from_args(args, tmp_path, engine_kind("llamacpp"))
    assert (config.weights, config.parallel, config.draft_model, config.env) == ("Q8_0", 8, "derived:Q4_K_M",
                                                                                 {"A": "1"})
    vllm = engine_config_from_args(_parser().parse_args(["--max-num-seqs", "8"]), tmp_path, engine_kind("vllm"))
    assert vllm.max_num_seqs == 8


@pytest.mark.parametrize(("words", "says"), [
    (["engine", "command", "--engine", "llamacpp", "--max-num-seqs", "8"],
     "--max-num-seqs is a vLLM setting, and this runs llama.cpp, which does not understand it; llama.cpp's "
     "equivalent is --parallel (--engine vllm runs vLLM)"),
    (["engine", "command", "--parallel", "8"], "--parallel is a llama.cpp setting, and this runs vLLM, which does "
                                                "not understand it; vLLM's equivalent is --max-num-seqs"),
    (["engine", "command", "--engine", "llamacpp", "--no-eager"], "--eager is a vLLM setting"),
    (["engine", "command", "--threads", "2"], "--threads is a llama.cpp setting, and this runs vLLM, which does "
                                               "not understand it (--engine llamacpp runs llama.cpp)"),
])
def test_a_flag_of_another_engine_is_a_usage_error_naming_it(words, says, capsys):
    assert main(words) == 2
    err = capsys.readouterr().err
    assert says in " ".join(err.split()) and "Traceback" not in err


def test_a_flag_given_is_told_from_its_default():
    parser = _parser()
    llama = engine_kind("llamacpp")
    assert given_flags(parser.parse_args(["--weights", "F16"]), llama) == [f for f in llama.flags if
                                                                          f.flag == "--weights"]
    # A namespace built by hand (argparse did not mark it): flags away from their defaults count as given.
    built = argparse.Namespace(**{**vars(parser.parse_args([])), "parallel": 4})
    assert not hasattr(built, "engine_flags_given")
    assert [f.flag for f in given_flags(built, llama)] == ["--parallel"]


def test_every_equivalent_names_flags_engines_declare():
    declared = {f.flag for kind in started_engines() for f in kind.flags}
    assert set().union(*SAME_SETTING) <= declared


def test_the_main_job_takes_a_choice_of_engines_by_name(capsys):
    args = _build_parser().parse_args(["--trace", "t.jsonl", "--engine", "vllm+llamacpp"])
    assert args.engine_type == "vllm+llamacpp"
    with pytest.raises(SystemExit) as info:
        _build_parser().parse_args(["--trace", "t.jsonl", "--engine", "vllm+sglang"])
    assert info.value.code == 2 and "unknown engine 'sglang'" in capsys.readouterr().err


def _main_engine(argv: list[str], platform: Platform, stored: dict | None = None) -> tuple[str, str]:
    """The engine the flags `argv` choose on `platform` (`tuner.plan.StudyPlan.choose_engine`), and what
    the console said."""
    from tracetune.cli.tune import study_plan

    out = io.StringIO()
    plan = study_plan(_build_parser().parse_args(["--trace", "t.jsonl", *argv]), Console(file=out))
    return plan.choose_engine(platform, stored).name, out.getvalue()


def test_on_a_cpu_with_llamacpp_the_main_job_chooses_between_both_engines(monkeypatch):
    real = ENGINES["llamacpp"]
    monkeypatch.setitem(ENGINES, "llamacpp", lambda: dataclasses.replace(real(), available=lambda: None))
    assert _main_engine([], Platform.CPU) == ("vllm+llamacpp", "")
    assert _main_engine([], Platform.CUDA)[0] == "vllm"  # the GPU engine
    assert _main_engine(["--space", "s.yaml"], Platform.CPU)[0] == "vllm"  # a space of the user's: as before
    assert _main_engine(["--engine", "llamacpp"], Platform.CPU)[0] == "llamacpp"
    # a study made before (vLLM alone) resumes on its engine
    assert _main_engine([], Platform.CPU, {"rules": {"engine": "vllm", "slo": ""}}) == ("vllm", "")
    lacking = "llama-server is not built: run bash scripts/install_llamacpp.sh"
    monkeypatch.setitem(ENGINES, "llamacpp", lambda: dataclasses.replace(real(), available=lambda: lacking))
    name, said = _main_engine([], Platform.CPU)
    assert name == "vllm" and f"llama.cpp: {lacking}" in " ".join(said.split())


def test_help_at_80_columns_shows_llamacpp_examples(monkeypatch, capsys):
    monkeypatch.setenv("COLUMNS", "80")
    for words in (["engine", "check"], ["replay"], ["capacity"], []):
        with pytest.raises(SystemExit):
            main([*words, "--help"])
        out = capsys.readouterr().out
        assert "llamacpp" in out, words
        assert out.startswith(f"usage: tune {' '.join(words)}".rstrip()), out[:200]  # its own usage, not the root's
        options = out.split("\nexamples:")[0]  # the examples are printed as written
        assert max(map(len, options.splitlines())) <= 80, words


def test_every_commands_help_reads_at_80_columns(monkeypatch, capsys):
    monkeypatch.setenv("COLUMNS", "80")
    for words in (["trace", "convert"], ["dashboard"], ["export"], ["fleet"], ["model", "prepare"], ["record"]):
        with pytest.raises(SystemExit):
            main([*words, "--help"])
        out = capsys.readouterr().out
        assert out.startswith(f"usage: tune {' '.join(words)}"), out[:200]
        long = [line for line in out.split("\nexamples:")[0].splitlines() if len(line) > 80]
        assert not long, (words, long)


def test_a_space_over_both_engines_reads_for_one_of_them():
    from tracetune.search_spaces.space import CPU_SPACE, load_space

    both = load_space(CPU_SPACE, engine_kind("vllm+llamacpp"))
    assert both.engines() == ["vllm", "llamacpp"]
    llama = load_space(CPU_SPACE, engine_kind("llamacpp"))
    assert "engine" not in llama.parameters and "weight_format" in llama.parameters
    assert "max_num_seqs" not in llama.parameters and "enforce_eager" not in llama.fixed
    assert all(not p.when for p in llama.parameters.values())
    assert Path(CPU_SPACE).name == "cpu.yaml"


@pytest.mark.parametrize("flag", ["--engine-arg=--seed=1", "--engine-env=A=1"])
def test_arguments_handed_to_a_server_verbatim_need_one_engine(flag, tmp_path):
    from tracetune.cli.tune import _base
    from tracetune.errors import InputError

    choice = engine_kind("vllm+llamacpp")
    args = _build_parser().parse_args(["--trace", "t.jsonl", "--engine", "vllm+llamacpp", flag])
    with pytest.raises(InputError, match="--engine-arg and --engine-env go to one engine's server") as caught:
        _base(args, tmp_path, choice)
    assert "--engine vllm or --engine llamacpp" in str(caught.value)
    one = _build_parser().parse_args(["--trace", "t.jsonl", "--engine", "llamacpp", flag])
    config, _ = _base(one, tmp_path, engine_kind("llamacpp"))
    assert config.extra_args == ["--seed=1"] or config.env == {"A": "1"}
