"""llama.cpp's settings from the command line checked before anything starts (`llamacpp/given.py`,
`gguf.check_gguf_file`): a --gguf that is a GGUF file, not given with --weights, and a --ctx-size
within the model's trained context times its slots. No server, no llama.cpp build."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tracetune.engine_adapter.llamacpp.config import LlamaCppConfig
from tracetune.engine_adapter.llamacpp.gguf import check_gguf_file, gguf_metadata
from tracetune.engine_adapter.llamacpp.given import (
    DEFAULT_SLOTS,
    HARD_MAX_SLOT_CTX,
    check_ctx_size,
    check_given,
    trained_context,
)
from tracetune.engine_adapter.registry import engine_kind
from tracetune.errors import InputError


def write_gguf(path: Path, context_length: int | None = None) -> Path:
    """A GGUF file of no tensors: its header and metadata (architecture llama, the context if given)."""
    import gguf

    writer = gguf.GGUFWriter(str(path), "llama")
    if context_length is not None:
        writer.add_context_length(context_length)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def model_dir(path: Path, **config: object) -> Path:
    path.mkdir()
    (path / "config.json").write_text(json.dumps({"model_type": "llama", **config}))
    return path


def test_a_gguf_file_passes_and_its_metadata_is_read(tmp_path):
    path = write_gguf(tmp_path / "m.gguf", 2048)
    assert check_gguf_file(path) == path
    meta = gguf_metadata(path)
    assert meta["general.architecture"] == "llama" and meta["llama.context_length"] == 2048


@pytest.mark.parametrize(("make", "says"), [
    (lambda p: None, "no such file"),
    (lambda p: p.mkdir(), "is a folder, not a GGUF file"),
    (lambda p: p.write_bytes(b""), "is empty, not a GGUF file"),
    (lambda p: p.write_text('{"timestamp": 0}\n'), "not a GGUF file (it starts with b'{\"ti', not b'GGUF')"),
    (lambda p: os.mkfifo(p), "is not a regular file"),  # opening a pipe would wait for a writer
], ids=["missing", "folder", "empty", "text", "fifo"])
def test_what_is_not_a_gguf_file_is_refused_naming_the_flag(tmp_path, make, says):
    path = tmp_path / "x.gguf"
    make(path)
    with pytest.raises(InputError, match="^--gguf ") as info:
        check_gguf_file(path)
    assert f"--gguf {path}: {says}" in str(info.value) and "\n" not in str(info.value)


def test_metadata_of_a_file_that_is_not_gguf_is_empty(tmp_path):
    (tmp_path / "x").write_bytes(b"GGUF" + b"\xff" * 12)
    assert gguf_metadata(tmp_path / "x") == {}


def test_the_trained_context_comes_from_the_gguf_served_else_config_json(tmp_path):
    plain = model_dir(tmp_path / "plain", max_position_embeddings=8192)
    assert trained_context(LlamaCppConfig(model=plain)) == (8192, f"max_position_embeddings in {plain}/config.json")
    several = model_dir(tmp_path / "several", text_config={"max_position_embeddings": 4096})
    assert trained_context(LlamaCppConfig(model=several))[0] == 4096
    assert trained_context(LlamaCppConfig(model=model_dir(tmp_path / "silent"))) == (None, "")
    assert trained_context(LlamaCppConfig(model=tmp_path / "missing")) == (None, "")
    gguf = write_gguf(tmp_path / "m.gguf", 2048)
    assert trained_context(LlamaCppConfig(model=plain, gguf=gguf)) == (2048, f"llama.context_length in {gguf}")
    assert trained_context(LlamaCppConfig(model=plain, gguf=write_gguf(tmp_path / "n.gguf"))) == (None, "")


def test_the_context_is_bounded_by_the_trained_context_times_the_slots(tmp_path):
    model = model_dir(tmp_path / "m", max_position_embeddings=8192)
    check_ctx_size(LlamaCppConfig(model=model, ctx_size=8192 * DEFAULT_SLOTS))
    check_ctx_size(LlamaCppConfig(model=model, ctx_size=8192 * 8, parallel=8))
    with pytest.raises(InputError, match=r"^--ctx-size 32769: over what the slots can use, 32768 tokens: 8192 a "
                                         r"slot, the model's trained context \(max_position_embeddings in .*\), x "
                                         r"llama-server's default of 4 slots; give --ctx-size 32768 or less$"):
        check_ctx_size(LlamaCppConfig(model=model, ctx_size=32769))
    with pytest.raises(InputError, match=r"x --parallel 2; give --ctx-size 16384 or less"):
        check_ctx_size(LlamaCppConfig(model=model, ctx_size=99999999999, parallel=2))


def test_a_model_that_states_no_context_gets_the_hard_bound(tmp_path):
    model = model_dir(tmp_path / "m")
    check_ctx_size(LlamaCppConfig(model=model, ctx_size=HARD_MAX_SLOT_CTX, parallel=1))
    with pytest.raises(InputError, match="tracetune's bound where the model's trained context is not known"):
        check_ctx_size(LlamaCppConfig(model=model, ctx_size=99999999999))


def test_gguf_with_weights_contradict_and_gguf_alone_is_checked(tmp_path):
    model = model_dir(tmp_path / "m", max_position_embeddings=8192)
    gguf = write_gguf(tmp_path / "m.gguf", 2048)
    check_given(LlamaCppConfig(model=model, gguf=gguf, ctx_size=4096), frozenset({"gguf", "ctx_size"}))
    with pytest.raises(InputError, match=r"^--gguf .* and --weights Q8_0 contradict: --gguf serves that file as it "
                                         r"is, --weights makes Q8_0 weights from --model; give one$"):
        check_given(LlamaCppConfig(model=model, gguf=gguf, weights="Q8_0"), frozenset({"gguf", "weights"}))
    with pytest.raises(InputError, match="not a GGUF file"):
        check_given(LlamaCppConfig(model=model, gguf=model / "config.json"), frozenset({"gguf"}))
    with pytest.raises(InputError, match="8192 tokens: 2048 a slot"):  # the GGUF's own context, not config.json's
        check_given(LlamaCppConfig(model=model, gguf=gguf, ctx_size=8193), frozenset({"gguf", "ctx_size"}))


def test_llamacpp_hands_its_check_to_the_command_line():
    assert engine_kind("llamacpp").check_given is check_given
    assert engine_kind("vllm").check_given is None
