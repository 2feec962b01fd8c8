#!/usr/bin/env bash
# Here (CPU machine): stage everything the H200 run needs into .gpu/ (git-ignored), in folders of
# at most 64 MiB each (with the working tree), for a GPU host reached only by file transfers.
#
#   bash scripts/gpu/stage.sh
#
# Then make the transfers listed at the end (docs/results/h200.md has the whole procedure):
# .gpu/cNN = one kit part (../shared/gpu kit, 50 MiB) + one payload chunk, .gpu/dNN = payload only.
# The payload holds the bundled SmolLM2-135M (its tokenizer always: the 8B shape uses it; its real
# weights only with STAGE_WEIGHTS=1, for a quality study), the wheels the GPU host lacks (optuna
# and its deps) and a frozen copy of this checkout's tracetune source (without docs/ and tests/).
#   STAGE_WEIGHTS=1 bash scripts/gpu/stage.sh    # also the real weights (5 more transfers)
set -euo pipefail
STAGE_WEIGHTS=${STAGE_WEIGHTS:-0}
cd "$(dirname "$0")/../.."
[ -d .gpu/p00 ] || bash ../shared/gpu/prepare.sh
MODEL=$(.venv/bin/python -c 'from tracetune.engine_adapter.models import prepare_default_model; print(prepare_default_model())')
work=.gpu/payload-build
rm -rf "$work" .gpu/c[0-9][0-9] .gpu/d[0-9][0-9] .gpu/extra
mkdir -p "$work/th/models" "$work/extra"
python3 -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 -d "$work/extra" \
  optuna==5.0.0 sqlalchemy==2.1.9 alembic==1.20.1 colorlog==6.12.0 mako==1.4.3 greenlet==3.5.6 2>/dev/null
if [ "$STAGE_WEIGHTS" = 1 ]; then
  cp -r "$MODEL" "$work/th/models/"
else
  mkdir -p "$work/th/models/$(basename "$MODEL")"
  cp "$MODEL"/*.json "$MODEL"/*.jinja "$work/th/models/$(basename "$MODEL")/"
fi
git archive --format=tar --prefix=src/ HEAD -- . ':!docs' ':!tests' | tar -x -C "$work"
tar -cf .gpu/payload.tar -C "$work" th extra src
sha256sum .gpu/payload.tar | cut -d' ' -f1 > .gpu/payload.sha256
rm -rf "$work"
# 8 small chunks (2 MiB) ride with the 8 kit parts (50 MiB), the rest go alone (48 MiB): each transfer
# stays under 64 MiB with a working tree of up to ~11 MiB (the rest: ~15 MiB).
mkdir -p .gpu/chunks && rm -f .gpu/chunks/*
head -c $((8 * 2 * 1048576)) .gpu/payload.tar | split -b $((2 * 1048576)) -d -a 2 - .gpu/chunks/s
tail -c +$((8 * 2 * 1048576 + 1)) .gpu/payload.tar | split -b $((48 * 1048576)) -d -a 2 - .gpu/chunks/t
for i in 00 01 02 03 04 05 06 07; do
  mkdir -p .gpu/c$i && cp .gpu/p$i/* .gpu/c$i/ && { [ -f .gpu/chunks/s$i ] && cp .gpu/chunks/s$i .gpu/c$i/ || true; }
done
cp .gpu/kit/* .gpu/c00/
cp .gpu/payload.sha256 .gpu/c00/
n=0; for f in .gpu/chunks/t*; do [ -s "$f" ] || continue; d=$(printf '.gpu/d%02d' $n); mkdir -p $d && cp "$f" $d/; n=$((n+1)); done
rm -rf .gpu/chunks
du -sh .gpu/c[0-9][0-9] $( ((n)) && echo .gpu/d[0-9][0-9]) | sed 's/^/  /'
echo "transfers: copy .gpu/c00 to the GPU host, there 'mkdir -p /root/stage && cp .gpu/c00/* /root/stage/', then .gpu/c01..c07"
((n == 0)) || echo "and .gpu/d00..d$(printf %02d $((n-1))) the same way (cp .gpu/XNN/* /root/stage/)"
echo "then: bash scripts/gpu/device_setup.sh"
