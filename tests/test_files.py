"""tracetune.files: writes appear whole or not at all, and never land on something tracetune reads."""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

import pytest

import tracetune.files as files
from tracetune.errors import InputError
from tracetune.files import database_files, is_database, open_atomic, refuse_overwrite, write_atomic


def leftovers(folder: Path, name: str) -> list[str]:
    """Temporary files write_atomic would leave beside `name` in `folder`."""
    return sorted(p.name for p in folder.iterdir() if p.name.startswith(f".{name}.") and p.name.endswith(".tmp"))


def make_db(path: Path) -> Path:
    with sqlite3.connect(path) as db:
        db.execute("create table t (x)")
    return path


def test_write_atomic_writes_text_and_bytes_and_makes_the_folder(tmp_path):
    text = tmp_path / "new" / "deeper" / "out.json"
    assert write_atomic(text, '{"é": 1}\n') == text
    assert text.read_bytes() == '{"é": 1}\n'.encode()
    raw = tmp_path / "out.bin"
    write_atomic(raw, b"\x00\xff")
    assert raw.read_bytes() == b"\x00\xff"
    assert leftovers(text.parent, text.name) == [] and leftovers(tmp_path, raw.name) == []


def test_write_atomic_replaces_an_existing_file_whole(tmp_path):
    out = tmp_path / "best.json"
    out.write_text("old " * 1000)
    write_atomic(out, "new")
    assert out.read_text() == "new"


def test_a_failed_rename_leaves_the_old_file_and_no_temporary_file(tmp_path, monkeypatch):
    out = tmp_path / "pareto.json"
    out.write_text("the earlier result")

    def fail(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", fail)
    with pytest.raises(OSError, match="No space left"):
        write_atomic(out, "x" * 100_000)
    assert out.read_text() == "the earlier result"
    assert leftovers(tmp_path, out.name) == []


def test_an_error_while_writing_leaves_the_old_file_and_no_temporary_file(tmp_path):
    out = tmp_path / "trace.jsonl"
    out.write_text("line 1\n")
    with pytest.raises(RuntimeError, match="mid-write"), open_atomic(out) as f:
        f.write("half a new file")
        raise RuntimeError("mid-write")
    assert out.read_text() == "line 1\n"
    assert leftovers(tmp_path, out.name) == []


def test_readers_see_the_old_file_until_the_new_one_is_whole(tmp_path):
    out = tmp_path / "records.jsonl"
    out.write_text("old\n")
    with open_atomic(out) as f:
        f.write("new line 1\n")
        f.flush()
        assert out.read_text() == "old\n"  # not truncated, not half-written
        f.write("new line 2\n")
    assert out.read_text() == "new line 1\nnew line 2\n"


def test_open_atomic_refuses_a_reading_mode(tmp_path):
    with pytest.raises(ValueError, match="mode 'r'"), open_atomic(tmp_path / "x", "r"):
        pass
    assert list(tmp_path.iterdir()) == []


def test_permissions_are_those_of_a_plain_write_or_of_the_file_replaced(tmp_path):
    mask = os.umask(0o027)
    try:
        files._umask.cache_clear()
        fresh = write_atomic(tmp_path / "fresh.yaml", "a: 1\n")
        assert fresh.stat().st_mode & 0o777 == 0o640  # 0666 less the umask, not mkstemp's 0600
    finally:
        os.umask(mask)
        files._umask.cache_clear()
    kept = tmp_path / "kept.sh"
    kept.write_text("old")
    kept.chmod(0o755)
    write_atomic(kept, "new")
    assert kept.stat().st_mode & 0o777 == 0o755


def test_is_database(tmp_path):
    assert is_database(make_db(tmp_path / "study.db"))
    (tmp_path / "text.db").write_text("SQLite format 2 (not one)")
    assert not is_database(tmp_path / "text.db")
    assert not is_database(tmp_path / "missing.db")
    assert not is_database(tmp_path)  # a folder


def test_database_files_are_the_database_and_sqlites_sidecars(tmp_path):
    names = [p.name for p in database_files(tmp_path / "study.db")]
    assert names == ["study.db", "study.db-wal", "study.db-shm", "study.db-journal"]


def test_refuse_overwrite_accepts_a_new_or_ordinary_file(tmp_path):
    assert refuse_overwrite(tmp_path / "new.json", flag="-o") == tmp_path / "new.json"
    (tmp_path / "old.json").write_text("{}")
    assert refuse_overwrite(tmp_path / "old.json", flag="-o", protected=[tmp_path / "study.db"]) == \
        tmp_path / "old.json"


def test_refuse_overwrite_refuses_a_protected_file_by_any_name(tmp_path, monkeypatch):
    trace = tmp_path / "trace.jsonl"
    trace.write_text("{}\n")
    monkeypatch.chdir(tmp_path)
    os.link(trace, tmp_path / "hard.jsonl")
    for name in ("trace.jsonl", tmp_path / "sub" / ".." / "trace.jsonl", "hard.jsonl"):
        with pytest.raises(InputError, match="that is the file this command reads") as exc:
            refuse_overwrite(name, flag="OUTPUT", protected=[trace])
        assert str(exc.value).startswith(f"OUTPUT {name}:")
    # not there yet: refused all the same (the protected file may be created by this command)
    with pytest.raises(InputError, match="this command reads"):
        refuse_overwrite(tmp_path / "later.db", flag="-o", protected=[tmp_path / "later.db"])


def test_refuse_overwrite_refuses_any_database(tmp_path):
    db = make_db(tmp_path / "other-study.db")
    before = db.read_bytes()
    with pytest.raises(InputError, match="is a database"):
        refuse_overwrite(db, flag="-o")
    assert db.read_bytes() == before


def test_refuse_overwrite_refuses_links_folders_and_devices(tmp_path):
    target = tmp_path / "target.txt"
    target.write_text("precious")
    (tmp_path / "link").symlink_to(target)
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    cases = {tmp_path / "link": "symbolic link", tmp_path / "dangling": "symbolic link",
             tmp_path: "is a folder", Path("/dev/null"): "device or other special file"}
    for path, what in cases.items():
        with pytest.raises(InputError, match=what):
            refuse_overwrite(path, flag="--json")
    assert target.read_text() == "precious" and (tmp_path / "link").is_symlink()
