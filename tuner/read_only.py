"""A study's storage opened so that nothing can write it: a SQLite file `mode=ro`, PostgreSQL
sessions whose transactions are read-only, Optuna without its table creation. The dashboard and
exports read studies this way, and so does a warm start (an earlier study, perhaps another user's)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from tracetune.errors import InputError
from tracetune.tuner.secrets import display_url
from tracetune.tuner.storage import normalize_url

if TYPE_CHECKING:
    import sqlite3

    import sqlalchemy


def sqlite_path(url: str) -> Path | None:
    """The file of a SQLite URL (None for another database or an in-memory one)."""
    if not url.startswith("sqlite:///"):
        return None
    from sqlalchemy.engine import make_url

    path = make_url(url).database  # as SQLAlchemy reads it (the writer did too)
    return Path(path) if path and path != ":memory:" and not path.startswith("file:") else None


def read_only_engine(url: str) -> sqlalchemy.Engine:
    """A SQLAlchemy engine that cannot write the database at `url`."""
    import sqlalchemy

    url = normalize_url(url)
    return sqlalchemy.create_engine(url, **_engine_kwargs(url))


def _connect_read_only(path: str) -> sqlite3.Connection:
    """A SQLite connection that cannot write `path` (nor create it): `mode=ro` on a `file:` URI."""
    import sqlite3
    from urllib.parse import quote

    return sqlite3.connect(f"file:{quote(str(Path(path).resolve()))}?mode=ro", uri=True, timeout=30,
                           check_same_thread=False)


def _engine_kwargs(url: str) -> dict[str, object]:
    """Read-only connections: a SQLite file opened `mode=ro` (waiting for a writer's lock up to
    30 s), PostgreSQL sessions whose transactions are read-only; a server that does not answer
    fails within 10 s."""
    import functools

    path = sqlite_path(url)
    if path is not None:
        # A module-level function (not a lambda), so the storage still pickles.
        return {"creator": functools.partial(_connect_read_only, str(path))}
    if url.startswith("sqlite"):
        return {"connect_args": {"timeout": 30}}
    if url.startswith("postgresql"):
        return {"pool_pre_ping": True, "connect_args": {"connect_timeout": 10,
                                                        "options": "-c default_transaction_read_only=on"}}
    return {"pool_pre_ping": True}


def optuna_storage(url: str, *, flag: str = "--storage"):
    """A plain RDBStorage on a read-only connection (no heartbeat: a reader never touches a trial's
    state), on a database found to hold a study's tables: Optuna creates neither tables nor version
    rows there. One that cannot be read is an InputError naming `flag`."""
    import optuna
    from sqlalchemy import exc

    optuna.logging.set_verbosity(optuna.logging.ERROR)
    url = normalize_url(url)
    try:
        return optuna.storages.RDBStorage(url, engine_kwargs=_engine_kwargs(url), skip_table_creation=True)
    except (exc.SQLAlchemyError, RuntimeError) as error:
        reason = str(getattr(error, "orig", None) or error).strip().splitlines()[0]
        raise InputError(f"{flag} {display_url(url)}: cannot read this study database read-only: "
                         f"{display_url(reason)}") from None
