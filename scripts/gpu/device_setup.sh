#!/usr/bin/env bash
# On the GPU host, after the staged transfers (scripts/gpu/stage.sh): installs vLLM 0.24.0 from
# the shared kit, the wheels the image lacks (optuna, sqlalchemy, ...), and unpacks the payload
# (bundled SmolLM2 into TRACETUNE_HOME, the 8B-shaped config beside its tokenizer). Idempotent.
set -euo pipefail
REPO=$(cd "$(dirname "$0")/../.." && pwd)
mkdir -p /root/stage && cd /root/stage
if [ ! -f install.sh ] && [ -f /root/xfer/piece.00 ]; then  # the pieces stage.sh cut, joined and unpacked
  cat /root/xfer/piece.[0-9][0-9] | tar -x -C /root/stage || { echo "a staged transfer is missing or cut"; exit 1; }
fi
if [ ! -f /root/.payload-ok ]; then
  shopt -s nullglob
  got=$(cat s[0-9][0-9] t[0-9][0-9] | sha256sum | cut -d' ' -f1)
  [ "$got" = "$(cat payload.sha256)" ] || { echo "payload sha256 mismatch: a staged transfer is missing"; ls -la; exit 1; }
  cat s[0-9][0-9] t[0-9][0-9] | tar -x -C /root
  touch /root/.payload-ok
fi
bash install.sh > /root/install.log 2>&1 || { tail -30 /root/install.log; exit 1; }
tail -3 /root/install.log
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site2 /root/extra/*.whl
M=/root/models/llama3-8b-shape
mkdir -p $M && cp "$REPO"/scripts/gpu/llama3-8b-shape/*.json $M/
SMOL=$(ls -d /root/th/models/SmolLM2-*/ | head -1)
cp "$SMOL"/tokenizer.json "$SMOL"/tokenizer_config.json "$SMOL"/chat_template.jinja $M/
# tracetune checks that a model directory has weights; with --load-format dummy vLLM never reads
# them, so an empty placeholder stands in (random weights of the 8B shape are generated on the GPU).
[ -f $M/placeholder.safetensors ] || python3 - <<'PY'
import json, struct
header = json.dumps({"__metadata__": {"note": "placeholder: served with --load-format dummy"}}).encode()
open("/root/models/llama3-8b-shape/placeholder.safetensors", "wb").write(struct.pack("<Q", len(header)) + header)
PY
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
