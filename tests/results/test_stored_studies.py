"""Every study database published under docs/results/ still reads: each of its studies through the
dashboard's reader (the one the console's results use too), every stored record of every trial
parsed back into its typed record, and written again as it was read."""

from __future__ import annotations

import json
import lzma
import math
from pathlib import Path

import pytest

from tracetune.capacity.result import CapacityResult
from tracetune.dashboard.data import load_study
from tracetune.dashboard.storage import study_names
from tracetune.quality.probe import QualityResult
from tracetune.replay.acceptance import stored_acceptance
from tracetune.replay.metrics import Summary

ROOT = Path(__file__).resolve().parents[2]
DATABASES = sorted((ROOT / "docs" / "results").rglob("*.db.xz"))


def same(a: object, b: object) -> bool:
    """Equal as JSON, NaN equal to NaN."""
    def canon(value: object) -> str:
        return json.dumps(value, sort_keys=True, default=str).replace("NaN", "null")
    return canon(a) == canon(b)


@pytest.fixture(scope="module", params=DATABASES, ids=lambda p: str(p.relative_to(ROOT / "docs" / "results")))
def database(request, tmp_path_factory) -> str:
    db = tmp_path_factory.mktemp("stored") / "study.db"
    db.write_bytes(lzma.decompress(request.param.read_bytes()))
    return f"sqlite:///{db}"


def test_the_published_databases_are_found():
    assert len(DATABASES) >= 6


def test_every_study_reads_and_every_record_writes_back_as_it_was_read(database):
    names = study_names(database)
    assert names
    for name in names:
        view = load_study(database, name)
        runs = [t for t in view.trials if t.summary is not None]
        for trial in runs + ([view.reference_run] if view.reference_run else []):
            summary = trial.summary
            assert isinstance(summary, Summary)
            assert same(Summary.from_dict(summary.as_dict()).as_dict(), summary.as_dict())
            if summary.capacity:
                capacity = CapacityResult.from_dict(summary.capacity)
                assert same(CapacityResult.from_dict(capacity.as_dict()).as_dict(), capacity.as_dict())
                assert all(math.isfinite(step.scale) for step in capacity.steps)
            stored_acceptance(summary.acceptance)
        for trial in view.trials:
            if trial.quality:
                quality = QualityResult.from_dict(trial.quality)
                assert same(QualityResult.from_dict(quality.as_dict()).as_dict(), quality.as_dict())
