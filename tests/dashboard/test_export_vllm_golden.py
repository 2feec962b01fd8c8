"""vLLM's exports stay byte for byte what they were before the export learned llama.cpp
(tests/dashboard/golden/vllm_exports.json, written by tests/dashboard/vllm_golden.py)."""

from __future__ import annotations

import json

import pytest

from tests.dashboard.vllm_golden import GOLDEN, cases
from tracetune.dashboard import data


@pytest.fixture(scope="module")
def exports(synthetic_url) -> dict[str, str]:
    return dict(cases(data.load_study(synthetic_url, "synth")))


def test_every_recorded_vllm_export_is_unchanged(exports):
    recorded = json.loads(GOLDEN.read_text())
    assert sorted(exports) == sorted(recorded) and len(recorded) == 30
    changed = [name for name in recorded if exports[name] != recorded[name]]
    assert not changed, f"vLLM exports changed: {changed}; first:\n{exports[changed[0]] if changed else ''}"

