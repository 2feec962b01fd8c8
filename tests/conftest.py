from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def default_model():
    """The bundled default model (prepared once; scripts/test.sh prepares it before the run)."""
    from engine_adapter.models import prepare_default_model

    return prepare_default_model()
