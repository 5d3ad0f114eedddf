#!/usr/bin/env bash
# Fills .gpu-carry/ (git-ignored) with what a GPU run needs and the GPU
# machine lacks: a static FFmpeg and the converted bundled dataset.
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
python=$(cat "$repo/build/python-path" 2>/dev/null || { [ -x "$HOME/.cache/loongforge/venv/bin/python" ] && echo "$HOME/.cache/loongforge/venv/bin/python"; } || echo python3)
carry=$repo/.gpu-carry
bash "$repo/scripts/gpu/build_ffmpeg_static.sh"
mkdir -p "$carry/datasets"
rm -rf "$carry/ffmpeg" && cp -r "$HOME/.cache/loongforge/ffmpeg-static" "$carry/ffmpeg"
rm -rf "$carry/ffmpeg/share"
# The raw dataset too: the GPU tests' fixtures convert it as the CPU tests do.
src=${LOONGFORGE_DATASETS:-$repo/../shared/datasets}/robot_sim.PickNPlace
rm -rf "$carry/datasets/robot_sim.PickNPlace" && cp -r "$src" "$carry/datasets/robot_sim.PickNPlace"
if [ ! -f "$carry/datasets/robot_sim.PickNPlace.lf/loongforge_dataset.json" ]; then
  PYTHONPATH=$repo/scripts "$python" "$repo/scripts/convert_lerobot.py" \
    "${LOONGFORGE_DATASETS:-$repo/../shared/datasets}/robot_sim.PickNPlace" "$carry/datasets/robot_sim.PickNPlace.lf"
fi
du -sh "$carry"
