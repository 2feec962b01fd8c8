#!/usr/bin/env bash
# llama.cpp's server on the GPU host (a host without network): CUDA build, a random-weight GGUF of
# the 8B shape, and one `tune capacity` on the H200 chat SLO (docs/results/h200.md, 2026-12-04).
#
# Here first: .gpu/llamacpp/ (git-ignored) holds src.tar.xz (llama-cpp-python 0.3.36's vendor/llama.cpp,
# without models/, docs/, tests/, media/, benches/ and the web UI's sources), vocab.gguf
# (`python3 scripts/gpu/random_gguf.py vocab <SmolLM2 F16 GGUF> .gpu/llamacpp/vocab.gguf`), tok/
# (SmolLM2's tokenizer.json, tokenizer_config.json, chat_template.jinja) and whl/, what the host lacks
# for tracetune without vLLM (pip download --no-deps for cp312 manylinux: pydantic 2.14.4, pydantic_core
# 2.50.5, annotated_types 0.8.0, typing_inspection 0.4.5, and as scripts/gpu/stage.sh: optuna 5.0.0,
# sqlalchemy 2.1.9, alembic 1.20.1, colorlog 6.12.0, mako 1.4.3, greenlet 3.5.6): 20 MB, one transfer.
# On the GPU host, one run each (bringing .gpu/llamacpp), back to back:
#   bash scripts/gpu/llamacpp_h200.sh start 560   # set up, start the pipeline in the background, wait
#   bash scripts/gpu/llamacpp_h200.sh wait 570    # wait for it; when it ends, its files go to $OUT
# The pipeline (detached, so it outlasts one run): compile llama-server and llama-quantize for sm_90
# while the GGUF is written, then the capacity search (PARALLEL slots, each with the model's whole
# 8192-token context; 96 slots if the first search writes no result). The host is kept only 30 s between
# runs: start each as soon as the last returns.
set -uo pipefail
REPO=$(cd "$(dirname "$0")/../.." && pwd)
W=/root/lcpp; OUT=${OUT:-/root/out}
mode=$1; budget=${2:-560}; t0=$(date +%s)
PARALLEL=${PARALLEL:-112}; START_SCALE=${START_SCALE:-1.0}

pipeline() {  # runs detached; every step's time in $W/times.txt
  stamp() { echo "$(date +%s) $*" >> $W/times.txt; }
  export PATH=/usr/local/cuda/bin:$PATH
  command -v nvcc > /dev/null || export PATH=$(dirname "$(find / -xdev -name nvcc -type f 2>/dev/null | head -1)"):$PATH
  stamp build-start
  (cd $W && cmake -S llama.cpp -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON \
     -DCMAKE_CUDA_ARCHITECTURES=90 -DGGML_CUDA_FA_ALL_QUANTS=OFF -DGGML_CUDA_NCCL=OFF -DLLAMA_BUILD_SERVER=ON \
     -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_USE_PREBUILT_UI=OFF \
     > $W/configure.log 2>&1 && cmake --build build --target llama-server llama-quantize -j 16 > $W/build.log 2>&1) \
    || { stamp build-failed; return 1; }
  stamp build-done
  mkdir -p $W/dist/bin && cp $W/build/bin/llama-server $W/build/bin/llama-quantize $W/dist/bin/
  echo "llama-cpp-python 0.3.36 (vendor/llama.cpp, b11312), CUDA sm_90" > $W/dist/SOURCE
  while [ ! -f $W/gguf.done ]; do [ -f $W/gguf.failed ] && { stamp gguf-failed; return 1; }; sleep 2; done
  source "$REPO/scripts/gpu/env.sh"
  export TRACETUNE_PLATFORM=cuda TRACETUNE_LLAMACPP_DIR=$W/dist PYTHONUNBUFFERED=1
  cd /root
  for slots in $PARALLEL 96; do
    stamp "capacity-start parallel=$slots"
    python3 -m tracetune capacity --engine llamacpp --trace /root/stage/azure_conv_hour.jsonl \
      --model /root/models/llama3-8b-shape --gguf /root/models/llama3-8b-shape-F16-random.gguf \
      --parallel "$slots" --ctx-size $((slots * 8192)) --engine-arg=-ngl --engine-arg=99 --start-timeout 600 \
      --warmup 8 --slo "ttft:p95<1s,tpot:p95<50ms" --attainment 0.95 --precision 0.1 \
      --start-scale "$START_SCALE" --json $W/llamacpp_$slots.json --out $W/run_$slots > $W/capacity_$slots.txt 2>&1
    stamp "capacity-end parallel=$slots rc=$?"
    [ -f $W/llamacpp_$slots.json ] && break
  done
  stamp done
}

collect() {  # at most 8 files come back: the engine's log (verbosity 4) as its head and tail only
  mkdir -p "$OUT"
  cp $W/times.txt $W/llamacpp_*.json $W/capacity_*.txt "$OUT/" 2>/dev/null
  tail -c 100000 $W/build.log > "$OUT/build_tail.log" 2>/dev/null
  for d in $W/run_*; do
    [ -d "$d" ] || continue
    tar -czf "$OUT/$(basename "$d").tgz" -C "$d" --exclude='llamacpp-slots-*' --exclude='engine-*.log' .
    for l in "$d"/engine-*.log; do { head -c 3000000 "$l"; echo; echo "[...]"; tail -c 3000000 "$l"; } > "$OUT/$(basename "$d")_engine.log"; done
  done
}

case $mode in
  start)
    echo "== host"; export PATH=/usr/local/cuda/bin:$PATH
    which nvcc cmake ninja; nvcc --version | tail -2; cmake --version | head -1; nproc; df -h /root | tail -1
    nvidia-smi --query-gpu=name,memory.total,memory.used --format=csv,noheader
    rm -rf $W /root/src; mkdir -p $W /root/stage /root/models/llama3-8b-shape
    cp -r "$REPO" /root/src  # a frozen copy: later runs replace the checkout under a running search
    tar -xJf "$REPO/.gpu/llamacpp/src.tar.xz" -C $W
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site2 \
      "$REPO"/.gpu/llamacpp/whl/*.whl || exit 1
    xz -dc "$REPO/scripts/gpu/data/azure_conv_hour.jsonl.xz" > /root/stage/azure_conv_hour.jsonl
    M=/root/models/llama3-8b-shape
    cp "$REPO"/scripts/gpu/llama3-8b-shape/*.json "$REPO"/.gpu/llamacpp/tok/* $M/
    python3 -c "import json,struct; h=json.dumps({'__metadata__':{'note':'placeholder: served from the GGUF'}}).encode(); open('$M/placeholder.safetensors','wb').write(struct.pack('<Q',len(h))+h)"
    REPO=/root/src; export REPO W PARALLEL START_SCALE TRACETUNE_SRC=/root/src; export -f pipeline
    setsid bash -c pipeline > $W/pipeline.log 2>&1 < /dev/null &
    setsid bash -c "cd $W && PYTHONPATH=$W/llama.cpp/gguf-py python3 $REPO/scripts/gpu/random_gguf.py model \
      $M/config.json $REPO/.gpu/llamacpp/vocab.gguf /root/models/llama3-8b-shape-F16-random.gguf > $W/gguf.log 2>&1 \
      && date +%s > $W/gguf.done || touch $W/gguf.failed" < /dev/null > /dev/null 2>&1 & ;;
esac
# wait (both modes): until the pipeline ends or the budget is spent, showing where it is
while (( $(date +%s) - t0 < budget )); do
  grep -q "^[0-9]* \(done\|build-failed\|gguf-failed\)" $W/times.txt 2>/dev/null && break
  sleep 10
done
echo "== after $(( $(date +%s) - t0 )) s"; cat $W/times.txt 2>/dev/null; ls -la /root/models/*.gguf $W/gguf.* 2>/dev/null
tail -c 300 $W/build.log 2>/dev/null; echo; tail -5 $W/gguf.log 2>/dev/null
for f in $W/capacity_*.txt; do [ -f "$f" ] && { echo "== $f"; tail -c 2500 "$f"; }; done
grep -h -m6 "offloaded\|n_ctx_seq\|KV buffer size\|n_slots =" $W/run_*/engine-*.log 2>/dev/null
grep -q "build-failed" $W/times.txt 2>/dev/null && tail -40 $W/configure.log $W/build.log
nvidia-smi --query-gpu=memory.used,utilization.gpu --format=csv,noheader
collect
