"""A throwaway PostgreSQL server on this machine, for the tests that claim a database
(tests/reliability/pg.py) and the benchmarks that measure one (fleet_scale.py): Debian's
postgresql binaries, run as the `postgres` system user (the server refuses root) in a temporary
directory, on a free port, trust auth on 127.0.0.1 only, fsync off. Stopped and removed on exit.

It lives here rather than under tests/ so that a benchmark can start one without importing pytest.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator, Mapping
from pathlib import Path

from tracetune.engine_adapter.process import free_port


def bindir() -> str | None:
    """The newest installed PostgreSQL server's bin folder, or None when none is installed."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"))
    return os.path.dirname(found[-1]) if found else None


def _as_postgres(argv: list[str]) -> list[str]:
    return ["runuser", "-u", "postgres", "--", *argv] if os.geteuid() == 0 else argv


def _run(argv: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(_as_postgres(argv), capture_output=True, text=True, check=True)


def _ensure_postgres_user() -> None:
    if os.geteuid() != 0:
        return
    try:
        pwd.getpwnam("postgres")
    except KeyError:
        subprocess.run(["useradd", "--system", "--no-create-home", "postgres"], check=True)


def _create_database(port: int, name: str) -> None:
    import psycopg

    for attempt in range(50):
        try:
            with psycopg.connect(f"host=127.0.0.1 port={port} user=postgres dbname=postgres", autocommit=True) as conn:
                conn.execute(f'CREATE DATABASE "{name}"')
            return
        except psycopg.OperationalError:
            if attempt == 49:
                raise
            time.sleep(0.2)


@contextlib.contextmanager
def postgres_server(database: str = "tracetune", settings: Mapping[str, str] | None = None) -> Iterator[str]:
    """URL of a fresh database `database` on a private server, with extra server `settings`
    (`-c name=value`, e.g. {"max_connections": "200"}). Raises FileNotFoundError when no
    server binaries are installed (Debian: apt-get install postgresql)."""
    bins = bindir()
    if bins is None:
        raise FileNotFoundError("PostgreSQL server binaries not installed (Debian: apt-get install postgresql)")
    _ensure_postgres_user()
    root = Path(tempfile.mkdtemp(prefix="tracetune-pg-"))
    os.chmod(root, 0o755)
    if os.geteuid() == 0:
        shutil.chown(root, "postgres")
    data, port = root / "data", free_port()
    options = f"-p {port} -k {root} -c listen_addresses=127.0.0.1 -c fsync=off"
    options += "".join(f" -c {k}={v}" for k, v in (settings or {}).items())
    try:
        _run([f"{bins}/initdb", "-D", str(data), "-A", "trust", "-U", "postgres", "--no-sync"])
        _run([f"{bins}/pg_ctl", "-D", str(data), "-l", str(root / "server.log"), "-w", "-t", "60", "-o", options,
              "start"])
        _create_database(port, database)
        yield f"postgresql://postgres@127.0.0.1:{port}/{database}"
    finally:
        subprocess.run(_as_postgres([f"{bins}/pg_ctl", "-D", str(data), "-m", "fast", "-w", "stop"]),
                       capture_output=True)
        shutil.rmtree(root, ignore_errors=True)


def postmaster_pid(url: str) -> int | None:
    """The server's main process id, from the running server itself (for its CPU time)."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute("SELECT setting FROM pg_settings WHERE name = 'data_directory'").fetchone()
    if row is None:
        return None
    try:
        return int((Path(row[0]) / "postmaster.pid").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
