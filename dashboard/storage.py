"""Reading a study's storage, never writing it: which database a user named, checked it can be
opened (one clear line when it cannot), the study's names, tracetune's rows, Optuna's heartbeats."""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from tracetune.errors import InputError
from tracetune.tuner.secrets import display_url
from tracetune.tuner.storage import normalize_url


# -- loading -------------------------------------------------------------------------------------
def default_storage(root: Path | None = None) -> str | None:
    """The study database of the most recent `tune --trace` run under ./runs (None when none)."""
    root = Path.cwd() if root is None else root
    dbs = sorted((root / "runs").glob("*/study.db"), key=lambda p: p.stat().st_mtime, reverse=True)
    return f"sqlite:///{dbs[0].resolve()}" if dbs else None


_SQLITE_HEADER = b"SQLite format 3\x00"


def storage_url(given: str | None) -> str:
    """The study database a user named: a URL, a plain path to a study.db, or (None) the newest
    runs/*/study.db here, as a URL (`study_names`, which every reader of a study goes through,
    checks it can be opened)."""
    url = given or default_storage()
    if url is None:
        raise InputError("no --storage given and no runs/*/study.db here; run `tune --trace FILE` first or "
                         "pass --storage URL (e.g. sqlite:///runs/traffic/study.db)")
    if "://" not in url:  # a plain path to a SQLite file
        if not Path(url).is_file():
            raise InputError(f"--storage {url}: no such file; give the study.db a `tune --trace` run wrote "
                             f"(runs/STUDY/study.db) or a database URL (sqlite:///PATH, postgresql://USER@HOST/DB)")
        url = f"sqlite:///{Path(url).resolve()}"
    return url


def check_storage(url: str) -> None:
    """Refuse, with one line that says what to do, a storage that cannot hold a study: a SQLite URL
    whose file does not exist (opening it would create an empty database) or is not a database, a
    URL SQLAlchemy cannot read, a database server that does not answer."""
    if url.startswith("sqlite:///"):
        path = url[len("sqlite:///"):].split("?", 1)[0]
        if path and path != ":memory:" and not Path(path).is_file():
            raise InputError(f"--storage {url}: no such database file {path!r}; run `tune --trace FILE` first "
                             f"(it writes runs/STUDY/study.db) or give the URL of an existing study database")
        if path and path != ":memory:" and Path(path).stat().st_size and not _is_sqlite(Path(path)):
            raise InputError(f"--storage {url}: {path!r} is not a SQLite database; give the study.db a "
                             f"`tune --trace` run wrote (runs/STUDY/study.db)")
    _connect_once(url)


def _is_sqlite(path: Path) -> bool:
    with path.open("rb") as f:
        return f.read(len(_SQLITE_HEADER)) == _SQLITE_HEADER


def _connect_once(url: str) -> None:
    """Open and close one connection, so a bad URL or a server that does not answer is one clear
    error here, not a traceback from deep inside the first query."""
    import sqlalchemy
    from sqlalchemy import exc

    shown = display_url(url)
    try:
        engine = sqlalchemy.create_engine(normalize_url(url), **_engine_kwargs(normalize_url(url)))
    except (exc.ArgumentError, exc.NoSuchModuleError, ValueError):
        raise InputError(f"--storage {shown}: not a database URL SQLAlchemy can read; write sqlite:///PATH, a "
                         f"path to a study.db, or postgresql://USER@HOST/DB") from None
    try:
        with engine.connect():
            pass
    except exc.DBAPIError as error:
        reason = str(error.orig).strip().splitlines()[0] if error.orig else type(error).__name__
        raise InputError(f"--storage {shown}: cannot open the database: {display_url(reason)}; check that it "
                         f"runs and the URL (host, port, user, database name) is right") from None
    finally:
        engine.dispose()


def _engine_kwargs(url: str) -> dict[str, Any]:
    """SQLite waits for a writer's lock; a server that does not answer fails within 10 s."""
    if url.startswith("sqlite"):
        return {"connect_args": {"timeout": 30}}
    if url.startswith("postgresql"):
        return {"pool_pre_ping": True, "connect_args": {"connect_timeout": 10}}
    return {"pool_pre_ping": True}


def optuna_storage(url: str):
    """A plain RDBStorage (no heartbeat: the dashboard never touches a trial's state)."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.ERROR)
    url = normalize_url(url)
    return optuna.storages.RDBStorage(url, engine_kwargs=_engine_kwargs(url))


def study_names(url: str) -> list[str]:
    import optuna

    check_storage(url)
    summaries = optuna.get_all_study_summaries(storage=optuna_storage(url), include_best_trial=False)
    return sorted(s.study_name for s in summaries)


def resolve_study(url: str, name: str | None) -> str:
    names = study_names(url)
    if not names:
        raise InputError(f"--storage {url} holds no study yet; run `tune --trace FILE --storage {url}` first")
    if name is None:
        if len(names) > 1:
            raise InputError(f"--storage {url} holds several studies {names}; choose one with --study NAME")
        return names[0]
    if name not in names:
        raise InputError(f"--study {name!r} is not in {url}; studies there: {names}")
    return name


def silent_for(engine: Any, name: str) -> dict[int, float]:
    """Seconds since each RUNNING trial's worker last sent its heartbeat (Optuna's heartbeat table,
    on the database's own clock); trials without one are left out."""
    from sqlalchemy import func, inspect, select, text

    if "trial_heartbeats" not in set(inspect(engine).get_table_names()):
        return {}
    query = text("SELECT t.number, h.heartbeat FROM trials t JOIN trial_heartbeats h ON h.trial_id = t.trial_id "
                 "JOIN studies s ON s.study_id = t.study_id WHERE s.study_name = :name AND t.state = 'RUNNING'")
    with engine.connect() as conn:
        now = conn.execute(select(func.now())).scalar()
        beats = conn.execute(query, {"name": name}).all()
    now = _as_datetime(now)
    return {number: (now - _as_datetime(beat)).total_seconds() for number, beat in beats}


def _as_datetime(value: Any) -> Any:
    """A timestamp as a naive datetime (SQLite hands back text)."""
    import datetime as dt

    if isinstance(value, str):
        value = dt.datetime.fromisoformat(value)
    return value.replace(tzinfo=None)


def read_results(engine: Any, name: str) -> tuple[dict[int, dict[str, Any]], dict[str, Any] | None]:
    """tracetune's rows for a study, read with plain SELECTs (tuner.storage's ResultStore would
    create missing tables: the dashboard never writes)."""
    from sqlalchemy import inspect, select

    from tracetune.tuner.storage import references, trial_results, unpack_records

    def decoded(row: Any, fields: Iterable[str]) -> dict[str, Any]:
        item = dict(row)
        for field in fields:
            raw = item.pop(f"{field}_json", None)
            item[field] = json.loads(raw) if raw else None
        return item

    tables = set(inspect(engine).get_table_names())
    rows: dict[int, dict[str, Any]] = {}
    reference = None
    with engine.connect() as conn:
        if trial_results.name in tables:
            query = select(trial_results).where(trial_results.c.study_name == name)
            for row in conn.execute(query).mappings():
                item = decoded(row, ("values", "config", "summary", "quality", "engine"))
                item["requests_jsonl"] = unpack_records(item.get("requests_jsonl"))
                rows[item["trial_number"]] = item
        if references.name in tables:
            row = conn.execute(select(references).where(references.c.study_name == name)).mappings().first()
            if row is not None:
                reference = decoded(row, ("config", "probe", "summary"))
    return rows, reference
