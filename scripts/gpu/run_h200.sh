#!/usr/bin/env bash
# On the device machine (after device_setup.sh). One step per call, each inside the 10-minute
# limit; studies resume across calls (same --study and storage). Results go to $OUT.
#   bash scripts/gpu/run_h200.sh ceiling|study-b|study-a|capacity [seconds]
set -uo pipefail
REPO=$(cd "$(dirname "$0")/../.." && pwd)
# TRACETUNE_SRC: a frozen copy of the source to run (default: this checkout).
SRC=${TRACETUNE_SRC:-$REPO}
export TRACETUNE_SRC=$SRC
source "$REPO/scripts/gpu/env.sh"
OUT=${OUT:-/root/out}; mkdir -p "$OUT" /root/runs
cd "$SRC"
TUNE="python3 -m cli"
step=$1; budget=${2:-540}
case $step in
  ceiling)
    timeout "$budget" python3 benchmarks/harness_ceiling.py --rates 100,200,400,800,1600 --seconds 3 --tokens 64 \
      2>&1 | tee "$OUT/ceiling.txt" ;;
  study-b)
    timeout "$budget" $TUNE --trace scripts/gpu/data/sharegpt_120.jsonl --space scripts/gpu/space_b.yaml \
      --study h200-b --run-dir /root/runs/b --trials 6 --sampler random --max-requests 100 \
      --probe-prompts 16 --probe-tokens 32 --warmup 4 \
      --try '{"weight_bits": 16, "speculative": "ngram", "num_speculative_tokens": 2}' \
      --try '{"weight_bits": 16, "speculative": "ngram", "num_speculative_tokens": 4}' \
      --try '{"weight_bits": 16, "speculative": "ngram", "num_speculative_tokens": 8}' \
      --try '{"weight_bits": 8, "speculative": "none"}' \
      --try '{"weight_bits": 4, "speculative": "none"}' \
      --try '{"weight_bits": 8, "speculative": "ngram", "num_speculative_tokens": 4}' 2>&1 | tee -a "$OUT/study_b.txt"
    cp /root/runs/b/study.db "$OUT/study_b.db"; cp /root/runs/b/pareto.json "$OUT/pareto_b.json" 2>/dev/null ;;
  study-a)
    echo "quality: not measured in this study -- random weights (--load-format dummy) make it meaningless; see study B"
    # Azure conversation trace (first 600 requests, real inter-arrival times x0.25 = 4x faster,
    # ~16 req/s, prompts synthesized to the recorded lengths), 8B-shaped model with random weights.
    timeout "$budget" $TUNE --trace scripts/gpu/data/azure_conv_600.jsonl --space scripts/gpu/space_a.yaml \
      --study h200-a --run-dir /root/runs/a --trials 8 --model /root/models/llama3-8b-shape --load-format dummy \
      --time-scale 0.25 --slo "ttft:p99<2s,tpot:p99<50ms" --objectives ttft_p99,goodput \
      --probe-prompts 2 --probe-tokens 8 --warmup 8 --timeout $((budget - 200)) \
      --try '{"weight_bits": 8, "kv_cache_dtype": "fp8", "max_num_seqs": 256, "max_num_batched_tokens": 8192, "enable_prefix_caching": true, "enable_chunked_prefill": true}' \
      2>&1 | tee -a "$OUT/study_a.txt"
    cp /root/runs/a/study.db "$OUT/study_a.db"; cp /root/runs/a/pareto.json "$OUT/pareto_a.json" 2>/dev/null ;;
  capacity)
    # Capacity per GPU at a chat SLO stated before the run (docs/results/h200.md): the Azure conversation
    # trace (first 300 measured requests after 8 warm-up, x4 its recorded rate = ~16 req/s at level 1x),
    # 8B-shaped model with random weights (quality not measurable: study B measures it on real weights).
    timeout "$budget" $TUNE --trace scripts/gpu/data/azure_conv_600.jsonl --space scripts/gpu/space_a.yaml \
      --study h200-cap --run-dir /root/runs/cap --trials 12 --model /root/models/llama3-8b-shape --load-format dummy \
      --time-scale 0.25 --max-requests 300 --warmup 8 --slo "ttft:p95<1s,tpot:p95<50ms" --attainment 0.95 \
      --precision 0.1 --objectives ttft_p99,capacity --probe-prompts 2 --probe-tokens 8 \
      --gpu-hour-cost 3.5 --timeout $((budget - 270)) 2>&1 | tee -a "$OUT/capacity.txt"
    cp /root/runs/cap/study.db "$OUT/study_cap.db"; cp /root/runs/cap/pareto.json "$OUT/pareto_cap.json" 2>/dev/null ;;
esac
tail -n 40 /root/runs/*/*/engine-*.log 2>/dev/null | grep -iE "error|Traceback|backend|KV cache|startup|Quantiz" | tail -20
