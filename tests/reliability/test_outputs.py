"""Outputs never clobber inputs, and appear whole (issue 36, item 1), through the real CLI entry point:
`tune export -o` onto the study's own database, another database or a link is refused (exit 2, one
line) and the target is byte-identical; a failed write leaves the earlier file and no temporary file;
`tune trace convert` refuses its input, a link, a folder or a device as its output and names the
file, line and field of an over-range token count, both before any model loads."""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
from pathlib import Path

import pytest

from tests.dashboard.synthetic import make_study
from tracetune.cli.main import main
from tracetune.errors import InputError
from tracetune.replay.trace import TraceRecord, load_trace, write_trace

EXPORT = ["export", "--study", "synth", "--best", "--format", "json"]


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def leftovers(folder: Path) -> list[str]:
    """Temporary files of an atomic write left in `folder`."""
    return sorted(p.name for p in folder.iterdir() if p.name.endswith(".tmp"))


def tune(capsys, *args: str) -> tuple[int, str, str]:
    """`tune ARGS...` in this process: (exit code, stdout, stderr)."""
    code = main([str(a) for a in args])
    out = capsys.readouterr()
    return code, out.out, out.err


def refused(capsys, args: list, *, says: str) -> str:
    code, out, err = tune(capsys, *args)
    assert code == 2, (code, out, err)
    assert says in err and err.strip().count("\n") == 0, err  # one line, saying why
    assert "Traceback" not in out + err
    return err


@pytest.fixture(scope="module")
def study_db(tmp_path_factory) -> Path:
    db = tmp_path_factory.mktemp("study") / "study.db"
    make_study(db)
    return db


def test_export_onto_the_studys_own_database_is_refused_and_it_is_byte_identical(study_db, capsys, monkeypatch):
    before = digest(study_db)
    monkeypatch.chdir(study_db.parent)
    link = study_db.parent / "alias.db"
    link.symlink_to(study_db)
    try:
        # the database named as --storage gave it, relatively, through a link, or as SQLite's journal
        for storage, output in ((f"sqlite:///{study_db}", study_db), (str(study_db), "study.db"),
                                ("sqlite:///study.db", study_db), (str(link), link),
                                (str(study_db), "study.db-wal")):
            err = refused(capsys, [*EXPORT, "--storage", storage, "-o", output], says="this command reads")
            assert f"-o {output}:" in err
            assert digest(study_db) == before
        assert not (study_db.parent / "study.db-wal").exists()
        assert leftovers(study_db.parent) == []
    finally:
        link.unlink()


def test_export_onto_another_database_is_refused(study_db, tmp_path, capsys):
    other = tmp_path / "other.sqlite"
    with sqlite3.connect(other) as db:
        db.execute("create table kept (x)")
    before = digest(other)
    refused(capsys, [*EXPORT, "--storage", study_db, "-o", other], says="is a database")
    assert digest(other) == before
    assert leftovers(tmp_path) == []


def test_export_onto_a_link_or_a_device_is_refused(study_db, tmp_path, capsys):
    target = tmp_path / "notes.txt"
    target.write_text("precious")
    (tmp_path / "deploy.json").symlink_to(target)
    refused(capsys, [*EXPORT, "--storage", study_db, "-o", tmp_path / "deploy.json"], says="symbolic link")
    assert target.read_text() == "precious" and (tmp_path / "deploy.json").is_symlink()
    refused(capsys, [*EXPORT, "--storage", study_db, "-o", "/dev/null"], says="not a regular file")


def test_export_writes_a_new_or_earlier_file_whole(study_db, tmp_path, capsys):
    out = tmp_path / "trial.json"
    out.write_text("an earlier export")
    code, said, err = tune(capsys, *EXPORT, "--storage", study_db, "-o", out)
    assert code == 0, err
    assert json.loads(out.read_text())["trial"] == 1
    assert f"wrote{out}" in "".join(said.split()), said  # rich may wrap the path at any character
    folder = tmp_path / "deploy"
    folder.mkdir()
    assert tune(capsys, *EXPORT, "--storage", study_db, "-o", folder)[0] == 0
    assert json.loads((folder / "trial.json").read_text())["trial"] == 1  # a folder gets the format's file
    assert leftovers(tmp_path) == [] and leftovers(folder) == []


def test_an_export_that_fails_midway_leaves_the_earlier_file_and_no_temporary_file(study_db, tmp_path, capsys,
                                                                                     monkeypatch):
    out = tmp_path / "trial.json"
    out.write_text("an earlier export")

    def full_disk(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", full_disk)
    with pytest.raises(OSError, match="No space left"):
        main([*EXPORT, "--storage", str(study_db), "-o", str(out)])
    assert out.read_text() == "an earlier export"
    assert leftovers(tmp_path) == []


def test_engine_check_refuses_a_json_target_before_any_engine_starts(study_db, capsys, monkeypatch):
    from tracetune.engine_adapter import registry

    def no_engine(*args, **kwargs):
        raise AssertionError("an engine was started")

    monkeypatch.setattr(registry, "make_engine", no_engine)
    before = digest(study_db)
    refused(capsys, ["engine", "check", "--json", study_db], says="is a database")
    assert digest(study_db) == before


# -- tune trace convert ----------------------------------------------------------------------------
class WordTokenizer:
    """Enough of a tokenizer for sharegpt conversion (a reply's length in tokens): one token a word."""

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return list(range(len(text.split())))


@pytest.fixture
def no_model(tmp_path, monkeypatch) -> None:
    """`tune trace convert` with a stand-in model: a context length and a word tokenizer, nothing loaded."""
    import tracetune.cli.replay as replay_cli
    import tracetune.engine_adapter.models as models

    model_dir = tmp_path / "model"
    model_dir.mkdir()
    (model_dir / "config.json").write_text(json.dumps({"max_position_embeddings": 4096}))
    monkeypatch.setattr(models, "resolve_model", lambda model, progress=None: model_dir)
    monkeypatch.setattr(replay_cli, "_tokenizer", lambda path: WordTokenizer())


def sharegpt(path: Path) -> Path:
    path.write_text(json.dumps([{"conversations": [{"from": "human", "value": "Say hi"},
                                                   {"from": "gpt", "value": "hi there you"}]}]))
    return path


def test_trace_convert_onto_a_link_is_refused_and_its_target_unchanged(tmp_path, capsys, no_model):
    source = sharegpt(tmp_path / "chats.json")
    target = tmp_path / "elsewhere.jsonl"
    target.write_text("not to be replaced\n")
    link = tmp_path / "out.jsonl"
    link.symlink_to(target)
    err = refused(capsys, ["trace", "convert", "--from", "sharegpt", source, link], says="symbolic link")
    assert str(link) in err
    assert link.is_symlink() and os.readlink(link) == str(target)
    assert target.read_text() == "not to be replaced\n"
    refused(capsys, ["trace", "convert", "--from", "sharegpt", source, "/dev/null"], says="not a regular file")
    assert leftovers(tmp_path) == [] and leftovers(Path("/dev")) == []
    # the same conversion onto a new file succeeds: the refusal was the link's
    code, _, err = tune(capsys, "trace", "convert", "--from", "sharegpt", source, tmp_path / "new.jsonl")
    assert code == 0, err
    assert load_trace(tmp_path / "new.jsonl").records[0].output_length == 3


def test_trace_convert_refuses_its_output_before_a_model_loads(tmp_path, capsys, monkeypatch):
    import tracetune.engine_adapter.models as models

    def no_model(*args, **kwargs):
        raise AssertionError("a model was loaded for an output that is refused")

    monkeypatch.setattr(models, "resolve_model", no_model)
    source = sharegpt(tmp_path / "chats.json")
    before = digest(source)
    link = tmp_path / "out.jsonl"
    link.symlink_to(tmp_path / "elsewhere.jsonl")
    (tmp_path / "folder").mkdir()
    for output, says in [(link, "symbolic link"), ("/dev/null", "not a regular file"),
                         (tmp_path / "folder", "is a folder"), (source, "the file this command reads")]:
        err = refused(capsys, ["trace", "convert", "--from", "sharegpt", source, output], says=says)
        assert f"OUTPUT {output}:" in err, err
    assert digest(source) == before and not (tmp_path / "elsewhere.jsonl").exists()


@pytest.mark.parametrize("fmt, text, line, field", [
    ("mooncake", '{"timestamp": 0, "input_length": 10, "output_length": 5}\n'
                 '{"timestamp": 1, "input_length": 10, "output_length": 1e30}\n', 2, "output_length"),
    ("mooncake", '{"timestamp": 0, "input_length": 100000000000000000000000000000, "output_length": 5}\n',
     1, "input_length"),
    ("mooncake", '{"timestamp": 0, "input_length": 10, "output_length": -4}\n', 1, "output_length"),
    ("mooncake", '{"timestamp": 0, "input_length": 10, "output_length": 1e400}\n', 1, "output_length"),
    ("azure", "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,374,44\n"
              "2023-11-16 18:15:47.0000000,99999999999999999999999,44\n", 3, "ContextTokens"),
])
def test_trace_convert_names_the_file_line_and_field_of_an_over_range_token_count(tmp_path, capsys, monkeypatch,
                                                                                 fmt, text, line, field):
    import tracetune.engine_adapter.models as models

    def no_model(*args, **kwargs):
        raise AssertionError("a model was loaded for a trace that cannot be converted")

    monkeypatch.setattr(models, "resolve_model", no_model)
    source = tmp_path / f"in.{'csv' if fmt == 'azure' else 'jsonl'}"
    source.write_text(text)
    refused(capsys, ["trace", "convert", "--from", fmt, source, tmp_path / "out.jsonl"],
            says=f"{source}:{line}: field '{field}'")
    assert not (tmp_path / "out.jsonl").exists()


def test_a_converted_trace_that_fails_midway_leaves_the_earlier_trace(tmp_path):
    out = tmp_path / "trace.jsonl"
    write_trace([TraceRecord(timestamp=0.0, prompt="old", output_length=4)], out)
    before = out.read_bytes()

    def records():
        yield TraceRecord(timestamp=0.0, prompt="new", output_length=8)
        raise RuntimeError("tokenizer crashed")

    with pytest.raises(RuntimeError, match="tokenizer crashed"):
        write_trace(records(), out)
    assert out.read_bytes() == before and leftovers(tmp_path) == []
    with pytest.raises(InputError, match="this command reads"):
        write_trace([], out, protected=[out])
    assert out.read_bytes() == before
