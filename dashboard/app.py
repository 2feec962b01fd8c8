"""Streamlit entry point of `tune dashboard` (run by `streamlit run dashboard/app.py`)."""

from tracetune.dashboard.views import main

main()
