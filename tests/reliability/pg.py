"""A throwaway PostgreSQL server for tests: Debian's postgresql binaries, run as the `postgres`
system user (the server refuses root) in a temporary directory, on a free port, trust auth on
127.0.0.1 only. Skips the test when the binaries are missing."""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import subprocess
import tempfile
import time

import pytest

from tracetune.engine_adapter.process import free_port


def _bindir() -> str | None:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"))
    return os.path.dirname(found[-1]) if found else None


def _as_postgres(argv: list[str], **kwargs) -> subprocess.CompletedProcess:
    if os.geteuid() == 0:
        argv = ["runuser", "-u", "postgres", "--", *argv]
    return subprocess.run(argv, capture_output=True, text=True, check=True, **kwargs)


@pytest.fixture(scope="module")
def postgres_url():
    """URL of a fresh database `tracetune` on a private PostgreSQL server (stopped afterwards)."""
    bindir = _bindir()
    if bindir is None:
        pytest.skip("PostgreSQL server binaries not installed (Debian: apt-get install postgresql)")
    if os.geteuid() == 0:
        try:
            pwd.getpwnam("postgres")
        except KeyError:
            subprocess.run(["useradd", "--system", "--no-create-home", "postgres"], check=True)
    root = tempfile.mkdtemp(prefix="tracetune-pg-")
    os.chmod(root, 0o755)
    data = os.path.join(root, "data")
    if os.geteuid() == 0:
        shutil.chown(root, "postgres")
    port = free_port()
    _as_postgres([f"{bindir}/initdb", "-D", data, "-A", "trust", "-U", "postgres", "--no-sync"])
    _as_postgres([f"{bindir}/pg_ctl", "-D", data, "-l", os.path.join(root, "server.log"), "-w", "-t", "60",
                  "-o", f"-p {port} -k {root} -c listen_addresses=127.0.0.1 -c fsync=off", "start"])
    try:
        import psycopg

        for _ in range(50):
            try:
                with psycopg.connect(f"host=127.0.0.1 port={port} user=postgres dbname=postgres",
                                     autocommit=True) as conn:
                    conn.execute("CREATE DATABASE tracetune")
                break
            except psycopg.OperationalError:
                time.sleep(0.2)
        yield f"postgresql://postgres@127.0.0.1:{port}/tracetune"
    finally:
        subprocess.run(["runuser", "-u", "postgres", "--", f"{bindir}/pg_ctl", "-D", data, "-m", "fast", "-w",
                        "stop"] if os.geteuid() == 0 else [f"{bindir}/pg_ctl", "-D", data, "-m", "fast", "-w", "stop"],
                       capture_output=True)
        shutil.rmtree(root, ignore_errors=True)
