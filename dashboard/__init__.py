"""The dashboard (`tune dashboard`) and exports (`tune export`): read-only views of a study's storage.

- `data.py`: loading a study, Pareto logic, filters, tables, per-request data (plain functions).
- `capacity.py`: capacity at the SLO (bracket, caveats, load steps) from a run's stored result.
- `charts.py`: plotly figures from those views.
- `export.py`: vllm-cmd / compose / k8s / helm-values / json exporters and `--pick` rules.
- `views.py` + `app.py`: the Streamlit pages (thin); `cli.py`: the two subcommands.
"""
