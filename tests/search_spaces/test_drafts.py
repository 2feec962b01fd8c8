"""Draft models in the search space (`draft_models`, `tune --draft-model`): the space they make, their
translation (derived drafts made through the checkpoint maker), the tokenizer check that refuses a
draft before any engine starts, and the derived drafts themselves (layers kept, renumbered)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tracetune.cli.main import main
from tracetune.engine_adapter.platform import Platform
from tracetune.engine_adapter.vllm.draft import (
    DraftError,
    check_draft,
    derived_draft,
    derived_layers,
    kept_layers,
    truncate_to,
)
from tracetune.engine_adapter.vllm.translate import to_engine_config
from tracetune.errors import InputError, Rejected
from tracetune.search_spaces.space import DEFAULT_SPACE, SearchSpace, SpaceError, load_space

ROOT = Path(__file__).resolve().parents[2]
SPEC = {"speculative": {"choices": ["none", "ngram", "draft_model"]},
        "num_speculative_tokens": {"low": 1, "high": 4, "when": {"speculative": ["ngram", "draft_model"]}}}


def tiny_model(path: Path, words: list[str], layers: int = 3) -> Path:
    """A model directory of `layers` layers whose tokenizer knows `words` (ids in that order)."""
    import torch
    from safetensors.torch import save_file
    from tokenizers import Tokenizer, models, pre_tokenizers

    path.mkdir(parents=True)
    vocab = {w: i for i, w in enumerate(["[UNK]", *words])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "PreTrainedTokenizerFast",
                                                            "unk_token": "[UNK]"}))
    (path / "config.json").write_text(json.dumps({"model_type": "llama", "num_hidden_layers": layers,
                                                  "vocab_size": len(vocab), "hidden_size": 4,
                                                  "num_attention_heads": 1, "num_key_value_heads": 1,
                                                  "intermediate_size": 4}))
    tensors = {"model.embed_tokens.weight": torch.zeros(len(vocab), 4), "model.norm.weight": torch.ones(4)}
    for i in range(layers):
        tensors[f"model.layers.{i}.mlp.up_proj.weight"] = torch.full((4, 4), float(i))
    save_file(tensors, str(path / "model.safetensors"))
    return path


def test_draft_models_become_a_parameter_after_speculative():
    space = SearchSpace.for_knobs({"parameters": SPEC, "draft_models": ["/d/a", "derived:layers-4"]})
    assert list(space.parameters) == ["speculative", "draft_model", "num_speculative_tokens"]
    assert space.parameters["draft_model"].choices == ["/d/a", "derived:layers-4"]
    assert space.parameters["draft_model"].when == {"speculative": ["draft_model"]}
    assert space.draft_models() == ["/d/a", "derived:layers-4"]
    # none + ngram x 4 lengths + 2 drafts x 4 lengths
    assert space.size() == 1 + 4 + 8
    # the space survives the operations that rebuild it
    assert space.without({"speculative": ["draft_model"]}).draft_models() == []
    assert space.pinned({"max_num_seqs": 4})[0].draft_models() == ["/d/a", "derived:layers-4"]


@pytest.mark.parametrize(("text", "message"), [
    ("draft_models: [derived:layers-4]\nparameters:\n  speculative: {choices: [none, ngram]}\n",
     "only used when speculative can be draft_model"),
    ("draft_models: []\nparameters:\n  speculative: {choices: [none, draft_model]}\n", "must be a list"),
    ("draft_models: [a]\nparameters:\n  speculative: {choices: [none, draft_model]}\n  draft_model: {choices: [b]}\n",
     "named twice"),
])
def test_bad_draft_models_are_refused_naming_the_file(tmp_path, text, message):
    path = tmp_path / "space.yaml"
    path.write_text(text)
    with pytest.raises(SpaceError, match=message) as err:
        load_space(path)
    assert str(path) in str(err.value)


def test_draft_model_flags_join_the_default_space():
    space = load_space(DEFAULT_SPACE).with_drafts(["derived:layers-4", "/d/b"])
    assert space.parameters["speculative"].choices == ["none", "ngram", "draft_model"]
    assert space.parameters["num_speculative_tokens"].when == {"speculative": ["ngram", "draft_model"]}
    assert space.draft_models() == ["derived:layers-4", "/d/b"]
    assert space.with_drafts(["/d/b", "/d/c"]).draft_models() == ["derived:layers-4", "/d/b", "/d/c"]
    bare = SearchSpace.for_knobs({"parameters": {"max_num_seqs": {"choices": [4, 8]}}}).with_drafts(["/d/a"])
    assert bare.parameters["speculative"].choices == ["none", "draft_model"]
    fixed = SearchSpace.for_knobs({"fixed": {"speculative": "draft_model", "draft_model": "/d/a"},
                                   "parameters": {"max_num_seqs": {"choices": [4, 8]}}})
    with pytest.raises(SpaceError, match="fixes draft_model=/d/a, so --draft-model cannot add drafts"):
        fixed.with_drafts(["/d/b"])


def test_derived_drafts_are_made_through_the_checkpoint_maker():
    made = []

    def make(name):
        made.append(name)
        return Path("/cache/drafts/m-layers-4")

    values = {"speculative": "draft_model", "draft_model": "derived:layers-4", "num_speculative_tokens": 2}
    config = to_engine_config(values, fixed={}, platform=Platform.CPU, model_dir=Path("/m"), make_checkpoint=make)
    assert made == ["derived:layers-4"]
    assert config.speculative.draft_model == Path("/cache/drafts/m-layers-4")
    own = to_engine_config({**values, "draft_model": "/d/own"}, fixed={}, platform=Platform.CPU, model_dir=Path("/m"),
                           make_checkpoint=make)
    assert own.speculative.draft_model == Path("/d/own") and made == ["derived:layers-4"]
    with pytest.raises(Rejected, match="cannot be made here"):
        to_engine_config(values, fixed={}, platform=Platform.CPU, model_dir=Path("/m"))
    w8 = to_engine_config({**values, "draft_model": "derived:w8a8"}, fixed={}, platform=Platform.CPU,
                          model_dir=Path("/m"), make_checkpoint=make)
    assert made[-1] == "W8A8"  # the model's own W8A8 checkpoint, the one weight_bits=8 uses
    with pytest.raises(Rejected, match=r"draft_model=derived:w4a16: .*only in its AVX512 build"):
        to_engine_config({**values, "draft_model": "derived:w4a16"}, fixed={}, platform=Platform.CPU,
                         model_dir=Path("/m"), make_checkpoint=make, flags=frozenset({"avx2"}))
    made.clear()
    ngram = to_engine_config({**values, "speculative": "ngram"}, fixed={}, platform=Platform.CPU, model_dir=Path("/m"),
                             make_checkpoint=make)
    assert ngram.speculative.draft_model is None and made == [] and w8.speculative.draft_model is not None


def test_a_draft_with_another_vocabulary_is_refused_naming_both(tmp_path):
    target = tiny_model(tmp_path / "target", ["a", "b", "c"])
    check_draft(target, tiny_model(tmp_path / "same", ["a", "b", "c"], layers=1))
    with pytest.raises(DraftError) as err:
        check_draft(target, tiny_model(tmp_path / "other", ["a", "c", "b"]))
    assert str(target) in str(err.value) and str(tmp_path / "other") in str(err.value)
    assert "token 'b' is id 2 for the target and 3 for the draft" in str(err.value)
    with pytest.raises(DraftError, match="vocab_size is 4, the draft's 5"):
        check_draft(target, tiny_model(tmp_path / "bigger", ["a", "b", "c", "d"]))
    with pytest.raises(DraftError, match="does not exist"):
        check_draft(target, tmp_path / "missing")
    with pytest.raises(DraftError, match="below the target's 3 layers"):
        check_draft(target, "derived:layers-3")
    check_draft(target, "derived:w8a8")
    assert issubclass(DraftError, InputError)


def test_tune_refuses_a_mismatched_draft_before_anything_starts(tmp_path, capsys):
    target = tiny_model(tmp_path / "target", ["a", "b", "c"])
    other = tiny_model(tmp_path / "other", ["x", "y", "z"])
    code = main(["--trace", str(ROOT / "examples" / "traffic.jsonl"), "--model", str(target), "--draft-model",
                 str(other), "--run-dir", str(tmp_path / "run")])
    err = capsys.readouterr().err
    assert code == 2 and "does not share the tokenizer" in err and "Traceback" not in err
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(("name", "expected"), [("derived:layers-4", ("layers", 4)), ("derived:ends-10", ("ends", 10))])
def test_derived_names(name, expected):
    assert derived_layers(name, 30) == expected


@pytest.mark.parametrize("name", ["derived:layers-0", "derived:layers-30", "derived:half", "layers-4", "derived:ends-1"])
def test_bad_derived_names(name):
    with pytest.raises(DraftError, match="e.g. derived:w8a8"):
        derived_layers(name, 30)


def test_truncation_keeps_the_chosen_layers_renumbered(tmp_path):
    from safetensors import safe_open

    target = tiny_model(tmp_path / "target", ["a", "b"], layers=6)
    assert kept_layers("ends", 4, 6) == [0, 1, 4, 5] and kept_layers("layers", 2, 6) == [0, 1]
    truncate_to(target, [0, 1, 4, 5], tmp_path / "draft")
    assert json.loads((tmp_path / "draft" / "config.json").read_text())["num_hidden_layers"] == 4
    [weights] = (tmp_path / "draft").glob("*.safetensors")
    with safe_open(str(weights), "pt") as f:
        names = set(f.keys())
        assert [f.get_tensor(f"model.layers.{i}.mlp.up_proj.weight")[0, 0].item() for i in range(4)] == [0, 1, 4, 5]
    assert {"model.embed_tokens.weight", "model.norm.weight"} <= names and len(names) == 6
    check_draft(target, tmp_path / "draft")  # the same tokenizer, by construction


def test_a_derived_draft_is_made_once_and_cached(tmp_path, monkeypatch):
    monkeypatch.setenv("TRACETUNE_HOME", str(tmp_path / "home"))
    target = tiny_model(tmp_path / "target", ["a", "b"], layers=4)
    said = []
    first = derived_draft(target, "derived:layers-2", said.append)
    assert first.parent == tmp_path / "home" / "drafts" and "layers-2" in first.name
    assert derived_draft(target, "derived:layers-2", said.append) == first
    assert len([m for m in said if m.startswith("deriving")]) == 1
    assert json.loads((first / "tracetune-draft.json").read_text())["layers"] == [0, 1]


def test_draft_model_is_runnable_with_its_drafts_and_a_draft_the_cpu_cannot_run_is_removed():
    from tracetune.engine_adapter.vllm.translate import unrunnable_choices

    space = SearchSpace.for_knobs({"parameters": SPEC, "draft_models": ["derived:w8a8", "derived:w4a16"]})
    never = unrunnable_choices(space, platform=Platform.CPU, model_dir=Path("/m"), flags=frozenset({"avx2"}))
    assert list(never) == ["draft_model"] and list(never["draft_model"]) == ["derived:w4a16"]
    assert space.without(never).draft_models() == ["derived:w8a8"]
    only_w4 = SearchSpace.for_knobs({"parameters": SPEC, "draft_models": ["derived:w4a16"]})
    never = unrunnable_choices(only_w4, platform=Platform.CPU, model_dir=Path("/m"), flags=frozenset({"avx2"}))
    assert "AVX512" in never["speculative"]["draft_model"]


def test_one_engine_commands_take_one_draft_checked_and_made(tmp_path, monkeypatch):
    import argparse

    from tracetune.cli.engine_options import add_engine_options, engine_config_from_args
    from tracetune.engine_adapter.vllm.translate import prepared

    monkeypatch.setenv("TRACETUNE_HOME", str(tmp_path / "home"))
    target = tiny_model(tmp_path / "target", ["a", "b"], layers=4)
    parser = argparse.ArgumentParser()
    add_engine_options(parser)
    args = parser.parse_args(["--speculative", "draft_model", "--draft-model", "derived:layers-2"])
    config = prepared(engine_config_from_args(args, target), lambda m: None)
    assert config.speculative.draft_model.parent == tmp_path / "home" / "drafts"
    twice = parser.parse_args(["--speculative", "draft_model", "--draft-model", "a", "--draft-model", "b"])
    with pytest.raises(InputError, match="given 2 times: one engine serves one draft model"):
        engine_config_from_args(twice, target)
    other = tiny_model(tmp_path / "other", ["b", "a"])
    mismatched = parser.parse_args(["--speculative", "draft_model", "--draft-model", str(other)])
    with pytest.raises(DraftError, match="does not share the tokenizer"):
        prepared(engine_config_from_args(mismatched, target), lambda m: None)
