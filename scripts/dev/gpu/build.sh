#!/usr/bin/env bash
# Builds LoongForge on the GPU machine (CUDA on, carried static FFmpeg) into
# build-gpu/: every target, or the ninja targets named. Used by the
# scripts/dev/gpu/issue*.sh runs. Logs to $OUT.
#   bash scripts/dev/gpu/build.sh [TARGET...]
set -uo pipefail
OUT=${OUT:-/tmp/loongforge-out}
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)
cd "$repo"
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DLOONGFORGE_PYTHON="$(command -v python3)" \
  -DLOONGFORGE_FFMPEG_ROOT="$repo/.gpu-carry/ffmpeg" \
  -DLOONGFORGE_CUDA=ON -DLOONGFORGE_DATASETS="$repo/.gpu-carry/datasets" \
  -DLOONGFORGE_TEST_DATASET_PREBUILT="$repo/.gpu-carry/datasets/robot_sim.PickNPlace.lf" > "$OUT/cmake.log" 2>&1 \
  || { tail -40 "$OUT/cmake.log"; exit 1; }
ninja -C build-gpu -j"$(nproc)" "$@" >> "$OUT/build.log" 2>&1 || { grep -E "error|FAILED" -A5 "$OUT/build.log" | tail -60; exit 1; }
