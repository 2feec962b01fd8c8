#!/usr/bin/env bash
# On the GPU host (after device_setup.sh). One step per run, each inside a 10-minute
# limit; studies resume across runs (same --study and storage). Results go to $OUT.
#   bash scripts/gpu/run_h200.sh ceiling|study-b|study-a|capacity|mooncake|start-cost|sustained|workers|tp|hour [seconds] [tune options...]
# CONFIG=default|best|fp8|gated picks the configuration of the `sustained` step; GPUS=0,1 (default) or 0
# the workers of the `workers` step (a host with two GPUs; its one-GPU baseline with GPUS=0).
# STOP_SIGNAL=INT|TERM|KILL (default TERM): how the time limit stops the tuner; after every step the
# GPU's processes and memory are printed (the kill tests read them).
set -uo pipefail
REPO=$(cd "$(dirname "$0")/../.." && pwd)
# TRACETUNE_SRC: a frozen copy of the source to run (default: this checkout).
SRC=${TRACETUNE_SRC:-$REPO}
export TRACETUNE_SRC=$SRC
source "$REPO/scripts/gpu/env.sh"
OUT=${OUT:-/root/out}; mkdir -p "$OUT" /root/runs
cd "$SRC"
TUNE="python3 -m tracetune"
step=$1; budget=${2:-540}; shift $(( $# < 2 ? $# : 2 )); extra=("$@")
stop=(timeout -s "${STOP_SIGNAL:-TERM}" -k 60 "$budget")
# The users' SLOs, stated before the runs (docs/results/h200.md): a chat SLO for the capacity studies.
CHAT_SLO="ttft:p95<1s,tpot:p95<50ms"
MODEL8B=(--model /root/models/llama3-8b-shape --load-format dummy)
# The capacity studies' settings, on either trace: 8 warm-up + 300 measured requests per level, x4 the
# trace's recorded rate as level 1x, bisection to 10%; no new trial in the last 270 s of the budget.
CAPACITY=(--space scripts/gpu/space_a.yaml "${MODEL8B[@]}" --time-scale 0.25 --max-requests 300 --warmup 8
          --slo "$CHAT_SLO" --attainment 0.95 --precision 0.1 --objectives ttft_p99,capacity --probe-prompts 2
          --probe-tokens 8 --gpu-hour-cost 3.5 --timeout $((budget - 270)))
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
    # Capacity per GPU at the chat SLO: the Azure conversation trace (first 300 measured requests after
    # 8 warm-up, x4 its recorded rate = ~16 req/s at level 1x), 8B-shaped model with random weights
    # (quality not measurable: study B measures it on real weights).
    "${stop[@]}" $TUNE --trace scripts/gpu/data/azure_conv_600.jsonl --study h200-cap --run-dir /root/runs/cap \
      --trials 12 "${CAPACITY[@]}" "${extra[@]}" 2>&1 | tee -a "$OUT/capacity.txt"
    cp /root/runs/cap/study.db "$OUT/study_cap.db"; cp /root/runs/cap/pareto.json "$OUT/pareto_cap.json" 2>/dev/null ;;
  mooncake)
    # The same SLO on the Mooncake conversation trace (prefix reuse: identical text for identical hash
    # ids), first 308 requests, input lengths x0.25 to fit the 8B shape's 8k context (31 truncated),
    # x4 its recorded rate (11.4 req/s at level 1x). The trace records arrivals on a 3 s grid (8.3
    # requests per instant, up to 16): MOONCAKE=bursts replays them so (the 2026-12-01 run, study
    # h200-moon); the default spreads each instant's requests over its step (study h200-moon-spread).
    name=mooncake_conv_308_spread study=h200-moon-spread
    [ "${MOONCAKE:-spread}" = bursts ] && name=mooncake_conv_308 study=h200-moon
    python3 -c 'import lzma, sys; open(sys.argv[1][:-3], "wb").write(lzma.open(sys.argv[1]).read())' \
      scripts/gpu/data/$name.jsonl.xz
    "${stop[@]}" $TUNE --trace scripts/gpu/data/$name.jsonl --study $study --run-dir /root/runs/$study \
      --trials 3 "${CAPACITY[@]}" "${extra[@]}" 2>&1 | tee -a "$OUT/$study.txt"
    cp /root/runs/$study/study.db "$OUT/study_${study#h200-}.db"
    cp /root/runs/$study/pareto.json "$OUT/pareto_${study#h200-}.json" 2>/dev/null ;;
  sustained)
    # Sustained capacity at the chat SLO (levels of >= 30 s, 5 request lifetimes = 59 s here, 300 requests;
    # held to the end: capacity/sustain.py) on the Azure trace's first 300 measured requests after 8 warm-up,
    # looped; one `tune capacity` per configuration, its search started near the rate the 2,400-request
    # levels of the sustained-capacity issue bracketed (k is a multiple of the trace's recorded 3.88 req/s).
    case ${CONFIG:-default} in
      default) cfg=(); start=5.16 ;;
      best) cfg=(--quantization fp8 --max-num-batched-tokens 2048 --max-num-seqs 512); start=7.22 ;;
      fp8) cfg=(--quantization fp8); start=7.22 ;;
      gated) cfg=(--max-num-batched-tokens 2048 --max-num-seqs 512); start=5.16 ;;
    esac
    "${stop[@]}" $TUNE capacity --trace scripts/gpu/data/azure_conv_600.jsonl "${MODEL8B[@]}" "${cfg[@]}" \
      --max-requests 300 --warmup 8 --max-duration 100000 --slo "$CHAT_SLO" --attainment 0.95 --precision 0.1 \
      --start-scale $start --json "$OUT/sustained_${CONFIG:-default}.json" --out "/root/runs/sustained-${CONFIG:-default}" \
      "${extra[@]}" 2>&1 | tee -a "$OUT/sustained_${CONFIG:-default}.txt" ;;
  workers|tp)
    # Two GPUs of one host. `workers`: one study, one worker per GPU (`--gpus 0,1`; GPUS=0 for the one-GPU
    # baseline of trials per GPU-hour), sustained capacity at the chat SLO. `tp`: one worker holding both
    # GPUs (`--gpus 0+1`), tensor parallel 1 vs 2 in the space, capacity compared per GPU. Both GPUs'
    # utilisation is sampled every 5 s into gpu_util_STEP.csv (both busy, or not).
    nvidia-smi --query-gpu=timestamp,index,utilization.gpu,memory.used --format=csv -l 5 > "$OUT/gpu_util_$step.csv" &
    sampler=$!
    if [ "$step" = workers ]; then
      gpus=${GPUS:-0,1}; study=h200-workers-${gpus//,/-}; space=(--space scripts/gpu/space_a.yaml --trials 6)
    else
      gpus=0+1; study=h200-tp; space=(--space scripts/gpu/space_tp.yaml --trials 4 --no-presets
        --try '{"tensor_parallel_size": 1, "weight_bits": 16}' --try '{"tensor_parallel_size": 2, "weight_bits": 16}'
        --try '{"tensor_parallel_size": 1, "weight_bits": 8}' --try '{"tensor_parallel_size": 2, "weight_bits": 8}')
    fi
    "${stop[@]}" $TUNE --trace scripts/gpu/data/azure_conv_600.jsonl --study $study --run-dir /root/runs/$study \
      --gpus "$gpus" "${CAPACITY[@]}" "${space[@]}" "${extra[@]}" 2>&1 | tee -a "$OUT/$study.txt"
    kill $sampler 2>/dev/null
    cp /root/runs/$study/study.db "$OUT/study_${study#h200-}.db"
    cp /root/runs/$study/pareto.json "$OUT/pareto_${study#h200-}.json" 2>/dev/null ;;
  start-cost)
    # Engine start of the 8B shape with vLLM's defaults: on a fresh machine (cold compile caches), again
    # (warm), and warm with CUDA graphs captured only up to 256 (the trace's batches; vLLM's default is
    # min(2 x max_num_seqs, 512)).
    for run in cold warm warm-capture-256; do
      args=(); [ "$run" = warm-capture-256 ] && args=(--engine-arg=--max-cudagraph-capture-size=256)
      "${stop[@]}" $TUNE engine check "${MODEL8B[@]}" --max-tokens 16 --run-dir "/root/runs/start-$run" \
        --json "$OUT/start-$run.json" "${args[@]}" "${extra[@]}" 2>&1 | grep -E "healthy after|^start:|rror" \
        | sed "s/^/[$run] /" | tee -a "$OUT/start_cost.txt"
    done ;;
  hour)
    # A full study on the whole Azure 2023 conversation hour (19,366 requests, 58.4 min, 5.53 req/s):
    # vLLM's defaults as the reference, then trials from space A, capacity by the windows that decide the
    # hour (the search's defaults: guided rules, repeats only where marginal, pruning). It outlasts one
    # command, so it runs in the background (setsid), from /root (run from the frozen source folder,
    # `python3 -m tracetune` imports its root modules instead of the package env.sh lays out), stopped with
    # SIGINT after BUDGET s; console and study stay in /root/hour ($OUT is emptied by every command).
    # The first call launches it (HOUR_TIMEOUT: the study's --timeout, counted from the reference's end;
    # RESUME=1 launches again a study that has stopped); later calls wait WAIT s, then copy what is stored.
    H=/root/hour; mkdir -p $H
    running=$(pgrep -f "^python3 -m tracetune --trace $H/" | head -1)
    if [ -z "$running" ] && { [ ! -f $H/console.txt ] || [ "${RESUME:-0}" = 1 ]; }; then
      [ -f $H/azure_conv_hour.jsonl ] || python3 -c 'import lzma, sys; open(sys.argv[2], "wb").write(lzma.open(sys.argv[1]).read())' \
        "$REPO"/scripts/gpu/data/azure_conv_hour.jsonl.xz $H/azure_conv_hour.jsonl
      (cd /root && setsid nohup timeout -s INT -k 120 "$budget" $TUNE --trace $H/azure_conv_hour.jsonl --study hour \
        --run-dir $H/run --trials 6 --space "$SRC"/scripts/gpu/space_a.yaml "${MODEL8B[@]}" --slo "$CHAT_SLO" \
        --attainment 0.95 --precision 0.1 --objectives ttft_p99,capacity --probe-prompts 2 --probe-tokens 8 --warmup 8 \
        --gpu-hour-cost 3.5 --timeout "${HOUR_TIMEOUT:-60}" "${extra[@]}" >> $H/console.txt 2>&1 < /dev/null &)
      sleep 15; echo "launched: $(pgrep -fa "^python3 -m tracetune --trace $H/")"
    else
      echo "study running: ${running:-no (stopped)}"; sleep "${WAIT:-0}"
    fi
    tail -c 6000 $H/console.txt
    cp $H/console.txt $H/run/study.db $H/run/*.json "$OUT"/ 2>/dev/null
    grep -HE "Model loading took|torch.compile took|Directly load the compiled|Compiling a graph for|Graph capturing finished|init engine \(" \
      $H/run/*/engine-*.log 2>/dev/null | sed "s|^$H/run/||" > "$OUT/hour_engine_start_lines.txt" ;;
esac
grep -HE "Model loading took|torch.compile took|Directly load the compiled|Compiling a graph for|Graph capturing finished|init engine \(" \
  /root/runs/*/*/engine-*.log /root/runs/*/engine-*.log 2>/dev/null > "$OUT/engine_start_lines.txt"
sleep 5; echo "GPU after $step (stop signal ${STOP_SIGNAL:-TERM}):"
nvidia-smi --query-gpu=memory.used --format=csv,noheader; nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv,noheader
pgrep -fa '[a]pi_server' || echo "no engine process"
tail -n 40 /root/runs/*/*/engine-*.log 2>/dev/null | grep -iE "error|Traceback|backend|KV cache|startup|Quantiz" | tail -20
