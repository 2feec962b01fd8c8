#!/usr/bin/env bash
# Here (CPU machine): stage everything the H200 run needs into .gpu/ (git-ignored), in folders of
# at most 64 MiB each (with the working tree), for a GPU host reached only by file transfers.
#
#   bash scripts/gpu/stage.sh
#
# Then make the transfers listed at the end (docs/results/h200.md has the whole procedure): .gpu/xNN,
# each one piece of a single stream (the kit, its 8 wheel parts, the payload), sized so that a piece
# and the working tree fit one 64 MiB transfer; device_setup.sh joins and unpacks them.
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
rm -rf "$work" .gpu/c[0-9][0-9] .gpu/d[0-9][0-9] .gpu/x[0-9][0-9] .gpu/extra
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
# One stream of the kit's files, its 8 parts and the payload (cut as device_setup.sh joins it), split
# into pieces that fit one transfer each beside the working tree (64 MiB in all, the tree included).
tree=$(git ls-files -co --exclude-standard -z | du -cb --files0-from=- 2>/dev/null | tail -1 | cut -f1)
piece=$(( (64 * 1048576 - tree) / 1048576 - 2 ))
((piece >= 8)) || { echo "the working tree ($((tree / 1048576)) MiB) leaves no room in a 64 MiB transfer"; exit 1; }
mkdir -p .gpu/chunks && rm -f .gpu/chunks/* && rm -rf .gpu/x[0-9][0-9]
split -b $((48 * 1048576)) -d -a 2 .gpu/payload.tar .gpu/chunks/t
cp .gpu/payload.sha256 .gpu/chunks/
tar -cf - -C .gpu/kit . $(for i in 00 01 02 03 04 05 06 07; do echo "-C $PWD/.gpu/p$i ."; done) -C "$PWD/.gpu/chunks" . \
  | split -b $((piece * 1048576)) -d -a 2 - .gpu/piece.
n=0; for f in .gpu/piece.*; do d=$(printf '.gpu/x%02d' $n); mkdir -p $d && mv "$f" $d/; n=$((n+1)); done
rm -rf .gpu/chunks
du -sh .gpu/x[0-9][0-9] | sed 's/^/  /'
echo "transfers: $n, each .gpu/xNN (pieces of ${piece} MiB beside a $((tree / 1048576)) MiB working tree): copy it to the"
echo "GPU host, there 'mkdir -p /root/xfer && cp .gpu/xNN/* /root/xfer/'; then bash scripts/gpu/device_setup.sh"
