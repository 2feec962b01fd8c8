#!/usr/bin/env bash
# llama.cpp's server and tools (llama-server, llama-quantize, llama-perplexity, the GGUF converter),
# compiled once for this machine's CPU and cached.
#
# The package registry has no official llama-server binary. The llama-cpp-python source
# distribution (pinned below, checked by its sha256) carries llama.cpp's whole source under
# vendor/llama.cpp: this script downloads it with pip (your pip configuration, proxies and indexes
# apply), builds the three tools with -DGGML_NATIVE=ON (the machine's own CPU features: AVX2,
# AVX-512, AMX...) and keeps them in a cache keyed by the source version, the CPU's features and the
# compiler. A second run on the same machine finds the cache and returns at once.
#
# Cost, measured: a 76 MB download, then about 11 minutes of compiling on 2 cores; about 60 MB
# on disk. Needs a C++ compiler; cmake and ninja come from the registry into .venv when the
# machine has none.
#
#   bash scripts/install_llamacpp.sh          # prints the directory holding bin/llama-server
#
# Environment: TRACETUNE_LLAMACPP_CACHE (default ~/.cache/tracetune/llama.cpp),
# TRACETUNE_BUILD_JOBS (default: every core).
set -euo pipefail
cd "$(dirname "$0")/.."

VERSION=0.3.36
SHA256=832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e
TOOLS=(llama-server llama-quantize llama-perplexity)
CACHE=${TRACETUNE_LLAMACPP_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/tracetune/llama.cpp}
PY=.venv/bin/python
[ -x "$PY" ] || PY=python3

say() { echo "install_llamacpp: $*" >&2; }

cpu_key() {
  # What -DGGML_NATIVE compiles for: the CPU's vector and matrix features, and the compiler.
  local flags compiler
  flags=$(grep -m1 -o -w -E 'avx|avx2|avx512[a-z_0-9]*|amx[a-z_0-9]*|fma|f16c|bmi2|sse4_2|asimd|sve|i8mm' \
          /proc/cpuinfo 2>/dev/null | sort -u | tr '\n' ' ' || true)
  [ -n "$flags" ] || flags=$(grep -o -w -E 'avx|avx2|avx512[a-z_0-9]*|amx[a-z_0-9]*|fma|f16c|bmi2|sse4_2' \
          /proc/cpuinfo 2>/dev/null | sort -u | tr '\n' ' ' || true)
  compiler=$(c++ --version 2>/dev/null | head -1 || echo none)
  printf '%s|%s|%s|%s' "$VERSION" "$(uname -m)" "$flags" "$compiler" | sha256sum | cut -c1-12
}

DEST="$CACHE/$VERSION-$(cpu_key)"
if [ -f "$DEST/SOURCE" ]; then  # written last: a complete build
  say "cached: $DEST"
  echo "$DEST"
  exit 0
fi

command -v c++ >/dev/null || { say "no C++ compiler: install one (Debian: apt-get install g++) and run again"; exit 2; }
if ! command -v cmake >/dev/null || ! command -v ninja >/dev/null; then
  say "cmake or ninja missing: installing both from the registry into .venv"
  "$PY" -m pip install --disable-pip-version-check -q cmake ninja
  export PATH="$(dirname "$PY"):$PATH"
fi

WORK=$(mktemp -d "${TMPDIR:-/tmp}/tracetune-llamacpp.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
say "downloading llama-cpp-python $VERSION's source (76 MB) for llama.cpp"
"$PY" -m pip download --disable-pip-version-check -q --no-deps --no-binary :all: --no-build-isolation \
  "llama-cpp-python==$VERSION" -d "$WORK" >/dev/null 2>&1 \
  || "$PY" -m pip download --disable-pip-version-check -q --no-deps --no-binary :all: \
       "llama-cpp-python==$VERSION" -d "$WORK"
SDIST="$WORK/llama_cpp_python-$VERSION.tar.gz"
echo "$SHA256  $SDIST" | sha256sum -c --quiet - || { say "checksum mismatch for $SDIST"; exit 2; }
tar -xzf "$SDIST" -C "$WORK" "llama_cpp_python-$VERSION/vendor/llama.cpp"
SRC="$WORK/llama_cpp_python-$VERSION/vendor/llama.cpp"

JOBS=${TRACETUNE_BUILD_JOBS:-$(nproc)}
say "compiling ${TOOLS[*]} for this CPU with $JOBS jobs (about 11 minutes on 2 cores)"
start=$(date +%s)
cmake -S "$SRC" -B "$WORK/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON \
  -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_CURL=OFF \
  -DBUILD_SHARED_LIBS=OFF > "$WORK/configure.log" 2>&1 \
  || { tail -20 "$WORK/configure.log" >&2; say "cmake configure failed (log above)"; exit 1; }
cmake --build "$WORK/build" -j "$JOBS" --target "${TOOLS[@]}" > "$WORK/build.log" 2>&1 \
  || { tail -30 "$WORK/build.log" >&2; say "compile failed (log above)"; exit 1; }

# Into the cache atomically: a half-copied directory is never taken for a build.
mkdir -p "$CACHE"
STAGE=$(mktemp -d "$CACHE/.partial.XXXXXX")
mkdir -p "$STAGE/bin"
for tool in "${TOOLS[@]}"; do cp "$WORK/build/bin/$tool" "$STAGE/bin/"; done
# The converter and what it imports (its model classes, llama.cpp's own gguf package).
cp "$SRC/convert_hf_to_gguf.py" "$STAGE/"
for dir in conversion gguf-py; do [ -d "$SRC/$dir" ] && cp -r "$SRC/$dir" "$STAGE/"; done
cp "$SRC/LICENSE" "$STAGE/LICENSE" 2>/dev/null || true
printf 'llama-cpp-python %s (vendor/llama.cpp), sha256 %s\nbuilt %s in %s s\n' \
  "$VERSION" "$SHA256" "$(date -u +%FT%TZ)" "$(( $(date +%s) - start ))" > "$STAGE/SOURCE"
rm -rf "$DEST" && mv "$STAGE" "$DEST"
say "built in $(( $(date +%s) - start )) s: $DEST"
echo "$DEST"
