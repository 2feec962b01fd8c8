#!/usr/bin/env bash
# The main job on the bundled default model: install, prepare the model, run what tracetune can do.
# Until the tuner exists, that is an engine check: start vLLM (eager) on SmolLM2-135M through the
# adapter, stream a real completion, and print start-up time, TTFT, ITL and engine counters.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
.venv/bin/tune model prepare
.venv/bin/tune engine check --eager --prefix-caching --repeat 2 --json runs/engine-check/result.json "$@"
