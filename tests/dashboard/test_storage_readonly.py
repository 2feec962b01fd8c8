"""Read-only means read-only (#27): the dashboard's and exports' storage never creates or alters a
database. SQLite is opened `mode=ro`, PostgreSQL sessions are read-only, and a file that is empty,
missing or holds no study is refused before Optuna could write its schema into it."""

from __future__ import annotations

import hashlib
import os
import shutil
import sqlite3
from pathlib import Path

import pytest
import sqlalchemy

from tests.dashboard.synthetic import make_study
from tests.reliability.pg import postgres_url  # noqa: F401 - fixture
from tracetune.dashboard import data, storage
from tracetune.dashboard.export import FORMATS, export
from tracetune.errors import InputError
from tracetune.tuner.storage import normalize_url


def fingerprint(path: Path) -> tuple[str, int, int]:
    """The file's bytes (hash), size and modification time: all three stay as they were."""
    st = path.stat()
    return hashlib.sha256(path.read_bytes()).hexdigest(), st.st_size, st.st_mtime_ns


@pytest.fixture
def study_copy(synthetic_url, tmp_path) -> Path:
    db = tmp_path / "study.db"
    shutil.copy(synthetic_url[len("sqlite:///"):], db)
    os.utime(db, ns=(1_000_000_000_000_000_000, 1_000_000_000_000_000_000))  # a known mtime to compare with
    return db


def test_loading_and_exporting_a_study_leaves_its_file_byte_identical(study_copy):
    before = fingerprint(study_copy)
    url = f"sqlite:///{study_copy}"
    study = data.load_study(url, "synth")
    assert [t.number for t in study.front] == [0, 1]  # it did read the study
    for fmt in FORMATS:
        export(study, study.trial(1), fmt)
    assert storage.study_names(url) == ["synth"]
    assert fingerprint(study_copy) == before
    assert sorted(p.name for p in study_copy.parent.iterdir()) == ["study.db"]  # no journal left either


def test_the_storage_cannot_write_even_if_asked(study_copy):
    """The connection itself is read-only: an INSERT fails, the file is unchanged."""
    before = fingerprint(study_copy)
    engine = storage.optuna_storage(f"sqlite:///{study_copy}").engine
    with pytest.raises(sqlalchemy.exc.OperationalError, match="readonly"), engine.begin() as conn:
        conn.execute(sqlalchemy.text("INSERT INTO studies (study_name) VALUES ('intruder')"))
    assert fingerprint(study_copy) == before


@pytest.mark.parametrize("make, message", [
    (lambda p: p.write_bytes(b""), "is empty, not a study database"),
    (lambda p: sqlite3.connect(p).execute("CREATE TABLE notes (x)").connection.commit(),
     "has no alembic_version, studies, trials, version_info tables"),
    (lambda p: sqlite3.connect(p).execute("PRAGMA user_version = 7").connection.commit(), "holds no tables"),
])
def test_an_empty_or_foreign_file_is_refused_and_left_as_it_was(tmp_path, make, message):
    db = tmp_path / "other.db"
    make(db)
    before = fingerprint(db)
    for url in (f"sqlite:///{db}", storage.storage_url(str(db))):
        with pytest.raises(InputError, match=message) as info:
            storage.study_names(url)
        assert str(db) in str(info.value) and "tune --trace" in str(info.value)  # names the file and what to do
    assert fingerprint(db) == before


def test_a_missing_file_is_not_created(tmp_path):
    with pytest.raises(InputError, match="no such database file"):
        storage.study_names(f"sqlite:///{tmp_path / 'none.db'}")
    assert not list(tmp_path.iterdir())


def test_a_path_with_uri_characters_opens(tmp_path):
    """The read-only connection quotes the path into a `file:` URI: "&", "=", quotes and spaces stay part of it."""
    db = tmp_path / "a dir 'x'&mode=rwc" / "study.db"
    db.parent.mkdir()
    url = make_study(db)
    assert storage.study_names(url) == ["synth"]
    assert data.load_study(url, "synth").trial(1).metric("output_tps") == 45.0


def test_postgresql_is_read_through_read_only_sessions(postgres_url):  # noqa: F811
    """A study on PostgreSQL reads as before; the dashboard's sessions refuse to write; an empty
    database is refused, not given Optuna's schema."""
    with pytest.raises(InputError, match="holds no tables"):
        storage.study_names(postgres_url)
    engine = sqlalchemy.create_engine(normalize_url(postgres_url))
    with engine.connect() as conn:
        assert not sqlalchemy.inspect(conn).get_table_names()  # still empty
    import optuna

    optuna.create_study(study_name="pg", storage=normalize_url(postgres_url))
    assert storage.study_names(postgres_url) == ["pg"]
    ro = storage.optuna_storage(postgres_url).engine
    with pytest.raises(sqlalchemy.exc.InternalError, match="read-only transaction"), ro.begin() as conn:
        conn.execute(sqlalchemy.text("INSERT INTO studies (study_name) VALUES ('intruder')"))
    engine.dispose()
    ro.dispose()
