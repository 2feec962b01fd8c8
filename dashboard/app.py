"""Streamlit entry point of `tune dashboard` (run by `streamlit run dashboard/app.py`)."""

import sys
from pathlib import Path

# `streamlit run` puts this file's folder, not the project root, on sys.path.
_ROOT = str(Path(__file__).resolve().parents[1])
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

from dashboard.views import main  # noqa: E402

main()
