#!/usr/bin/env bash
# The main job on the bundled default model: install, prepare the model, then tune for the example
# chat trace (examples/chat.jsonl: 30 s of a real chat service's arrivals with real prompts,
# scripts/make_chat_trace.py) at a chat SLO for a CPU (first token within 2 s and 200 ms per output
# token, about reading speed, for 95% of requests: at 100 ms vLLM-CPU's defaults fail at every load
# on a 2-core AVX2 machine, measured, and a study needs a reference that serves some load).
# On a CPU with llama.cpp built (scripts/install.sh builds it once), the study chooses between both
# engines (search_spaces/cpu.yaml): vLLM's defaults are the reference, llama.cpp's defaults are
# measured as trial 0, then one informed configuration of each engine (8-bit weights). vLLM runs in
# eager mode so that each server starts in well under a minute.
# Measured 8m25s-9m20s on a 2-core AVX-512 + AMX machine, 9m26s-10m41s on a 2-core AVX-512 EPYC
# without AMX, 6m21s on a 2-core AVX2 one, where
# even 200 ms per token is beyond vLLM-CPU's defaults, measured at the trace's rate only, as a
# trial would be (README, docs/results/cpu.md). Each choice is
# said there: capacities to 20%, a load level lasts 2 request lifetimes within the SLO (~52 s here)
# instead of 5 and at least the trace's 60 requests instead of 100 (matters only below its rate),
# and quality is gated
# at the default (+1% perplexity) with a quarter of the default probe (16 texts x 256 sampled tokens:
# intervals about +-0.8 points instead of +-0.3), because the full probe costs minutes per quality
# setting on 2 cores (docs/quality.md). Running it again resumes the study; more trials:
# `bash scripts/quickstart.sh --trials 8` (extra arguments go to `tune`).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
.venv/bin/tune model prepare
exec .venv/bin/tune --trace examples/chat.jsonl --trials 3 --precision 0.2 --level-lifetimes 2 \
  --level-requests 60 --slo "ttft:p95<2s,tpot:p95<200ms" --probe-prompts 16 --probe-tokens 256 "$@"
