from __future__ import annotations

import pytest

from tests.dashboard.synthetic import make_study


@pytest.fixture(scope="session")
def synthetic_url(tmp_path_factory) -> str:
    """A study database with known numbers (tests/dashboard/synthetic.py), for `tune export` and `tune dashboard`."""
    return make_study(tmp_path_factory.mktemp("synthetic") / "study.db")
