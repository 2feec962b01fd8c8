"""The dashboard (`tune dashboard`) and exports (`tune export`): read-only views of a study's storage.

- `data.py`: a study read from its storage (`storage.py`: safely) into a `StudyView` (`study_view.py`) of
  `TrialView`s (`trial.py`), each run's stored records read back as their types; `standing.py`: the front
  with the reference, ties, why a trial is off it; `metrics.py`, `tables.py`, `records.py`, `progress.py`:
  what pages show.
- `capacity.py`: capacity at the SLO (bracket, caveats, load steps) from a run's stored result.
- `charts.py`: plotly figures from those views.
- `export.py`: command / compose / k8s / helm-values / json exporters; `pick.py`: which trial (`--pick`).
- `views.py` + `app.py`: the Streamlit pages (thin); the two commands are `cli/dashboard.py`.
"""

from pathlib import Path

APP = Path(__file__).resolve().parent / "app.py"  # what `tune dashboard` runs under Streamlit
# How `tune dashboard` tells the app which study to open.
ENV_STORAGE = "TRACETUNE_DASHBOARD_STORAGE"
ENV_STUDY = "TRACETUNE_DASHBOARD_STUDY"
# "0" hides the sidebar's storage box (`tune dashboard --no-storage-picker`, and by default when the
# dashboard listens beyond localhost): a visitor cannot point it at other files on the server.
ENV_STORAGE_PICKER = "TRACETUNE_DASHBOARD_STORAGE_PICKER"
