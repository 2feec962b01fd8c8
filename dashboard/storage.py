"""Reading a study's storage, never writing it: which database a user named, checked it can be
opened (one clear line when it cannot), the study's names, tracetune's rows, Optuna's heartbeats."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from tracetune.errors import InputError
from tracetune.files import is_database
from tracetune.tuner.read_only import optuna_storage, read_only_engine, sqlite_path
from tracetune.tuner.secrets import display_url
from tracetune.types import JsonDict

if TYPE_CHECKING:
    from sqlalchemy import Engine, RowMapping

    from tracetune.tuner.storage import StoredReference, StoredRun


# -- loading -------------------------------------------------------------------------------------
def default_storage(root: Path | None = None) -> str | None:
    """The study database of the most recent `tune --trace` run under ./runs (None when none)."""
    root = Path.cwd() if root is None else root
    dbs = sorted((root / "runs").glob("*/study.db"), key=lambda p: p.stat().st_mtime, reverse=True)
    return f"sqlite:///{dbs[0].resolve()}" if dbs else None


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
    """Refuse, with one line that says what to do, a storage that cannot hold a study, before
    anything opens it through Optuna (which would write its schema into it): a SQLite URL whose file
    does not exist, is empty or is not a database, a URL SQLAlchemy cannot read, a database server
    that does not answer, a database without a study's tables."""
    path = sqlite_path(url)
    if path is not None:
        if not path.is_file():
            raise InputError(f"--storage {url}: no such database file {str(path)!r}; run `tune --trace FILE` first "
                             f"(it writes runs/STUDY/study.db) or give the URL of an existing study database")
        if not path.stat().st_size:
            raise InputError(f"--storage {url}: {str(path)!r} is empty, not a study database (the dashboard and "
                             f"exports only read: they never create one); give the study.db a `tune --trace` run "
                             f"wrote (runs/STUDY/study.db)")
        if not is_database(path):
            raise InputError(f"--storage {url}: {str(path)!r} is not a SQLite database; give the study.db a "
                             f"`tune --trace` run wrote (runs/STUDY/study.db)")
    tables = database_tables(url)
    missing = sorted(STUDY_TABLES - tables)
    if missing:
        shown = display_url(url)
        what = "holds no tables" if not tables else f"has no {', '.join(missing)} table{'s' * (len(missing) > 1)}"
        raise InputError(f"--storage {shown}: this database {what}, so it is not a tracetune study database (the "
                         f"dashboard and exports only read: they never create one); give the database a "
                         f"`tune --trace` run wrote (runs/STUDY/study.db, or its --storage URL)")


# Optuna's tables every study database has (tracetune's own come with the first result).
STUDY_TABLES = frozenset({"studies", "trials", "version_info", "alembic_version"})


def database_tables(url: str, *, flag: str = "--storage") -> set[str]:
    """The tables of the database at `url`, read through one read-only connection, so a bad URL or a
    server that does not answer is one clear error here (naming `flag`), not a traceback from deep
    inside a query (also the main job's check of its storages, before it creates anything)."""
    import sqlalchemy
    from sqlalchemy import exc

    shown = display_url(url)
    try:
        engine = read_only_engine(url)
    except (exc.ArgumentError, exc.NoSuchModuleError, ValueError):
        raise InputError(f"{flag} {shown}: not a database URL SQLAlchemy can read; write sqlite:///PATH, a "
                         f"path to a study.db, or postgresql://USER@HOST/DB") from None
    try:
        with engine.connect() as conn:
            return set(sqlalchemy.inspect(conn).get_table_names())
    except exc.DBAPIError as error:
        reason = str(error.orig).strip().splitlines()[0] if error.orig else type(error).__name__
        raise InputError(f"{flag} {shown}: cannot open the database: {display_url(reason)}; check that it "
                         f"runs and the URL (host, port, user, database name) is right") from None
    finally:
        engine.dispose()


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


def silent_for(engine: Engine, name: str) -> dict[int, float]:
    """Seconds since each RUNNING trial's worker last sent its heartbeat (Optuna's heartbeat table,
    on the database's own clock); trials without one are left out."""
    from sqlalchemy import func, inspect, select, text

    if "trial_heartbeats" not in set(inspect(engine).get_table_names()):
        return {}
    query = text("SELECT t.number, h.heartbeat FROM trials t JOIN trial_heartbeats h ON h.trial_id = t.trial_id "
                 "JOIN studies s ON s.study_id = t.study_id WHERE s.study_name = :name AND t.state = 'RUNNING'")
    with engine.connect() as conn:
        now = _as_datetime(conn.execute(select(func.now())).scalar_one())
        beats = conn.execute(query, {"name": name}).all()
    return {number: (now - _as_datetime(beat)).total_seconds() for number, beat in beats}


def _as_datetime(value: dt.datetime | str) -> dt.datetime:
    """A timestamp as a naive datetime (SQLite hands back text)."""
    if isinstance(value, str):
        value = dt.datetime.fromisoformat(value)
    return value.replace(tzinfo=None)


def read_results(engine: Engine, name: str) -> tuple[dict[int, StoredRun], StoredReference | None]:
    """tracetune's rows for a study, read with plain SELECTs (tuner.storage's ResultStore would
    create missing tables: the dashboard never writes): each trial's run (`StoredRun`), and the
    reference as stored ({"config", "probe", "summary"})."""
    from sqlalchemy import inspect, select

    from tracetune.tuner.storage import StoredRun, references, trial_results, unpack_records

    def decoded(row: RowMapping, fields: Iterable[str]) -> JsonDict:
        item = dict(row)
        for field in fields:
            raw = item.pop(f"{field}_json", None)
            item[field] = json.loads(raw) if raw else None
        return item

    tables = set(inspect(engine).get_table_names())
    rows: dict[int, StoredRun] = {}
    reference: StoredReference | None = None
    with engine.connect() as conn:
        if trial_results.name in tables:
            query = select(trial_results).where(trial_results.c.study_name == name)
            for row in conn.execute(query).mappings():
                item = decoded(row, ("values", "config", "summary", "quality", "engine"))
                item["requests_jsonl"] = unpack_records(item.get("requests_jsonl"))
                rows[item["trial_number"]] = StoredRun.from_row(item)
        if references.name in tables:
            found = conn.execute(select(references).where(references.c.study_name == name)).mappings().first()
            if found is not None:
                item = decoded(found, ("config", "probe", "summary"))
                reference = {"config": item["config"], "probe": item["probe"], "summary": item["summary"]}
    return rows, reference
