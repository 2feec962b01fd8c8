#!/usr/bin/env bash
# Rebuild examples/traffic.jsonl from the Mooncake conversation sample in examples/public_traces:
# the first 24 requests (6 s of real arrivals, with the trace's prefix sharing), lengths scaled by
# 0.25 (512-token blocks -> 128, vLLM-CPU block size) and inputs truncated at 256 tokens so a
# 2-core machine can serve it; outputs capped at 32 tokens. The converter reports what it did.
set -euo pipefail
cd "$(dirname "$0")/.."
.venv/bin/tune trace convert --from mooncake examples/public_traces/mooncake_conversation_60.jsonl examples/traffic.jsonl \
  --limit 24 --length-scale 0.25 --max-input-tokens 256 --overlong truncate --max-output-tokens 32
