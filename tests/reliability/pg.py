"""A throwaway PostgreSQL server for tests (`benchmarks/pg_server.py`: Debian's postgresql binaries
run as the `postgres` system user on a free port, trust auth on 127.0.0.1 only). Skips the test
when the binaries are missing."""

from __future__ import annotations

import pytest

from benchmarks.pg_server import bindir, postgres_server


@pytest.fixture(scope="module")
def postgres_url():
    """URL of a fresh database `tracetune` on a private PostgreSQL server (stopped afterwards)."""
    if bindir() is None:
        pytest.skip("PostgreSQL server binaries not installed (Debian: apt-get install postgresql)")
    with postgres_server() as url:
        yield url
