#!/usr/bin/env bash
# Fills .gpu-carry/ (git-ignored) with what a GPU run needs and the GPU
# machine lacks: a static FFmpeg and the converted bundled dataset; with
# BEFORE=<commit>, also that commit's scripts/model/ as .gpu-carry/model-before/model
# (the baseline model code of scripts/dev/gpu/issue11_step.sh).
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)
python=$(cat "$repo/build/python-path" 2>/dev/null || { [ -x "$HOME/.cache/loongforge/venv/bin/python" ] && echo "$HOME/.cache/loongforge/venv/bin/python"; } || echo python3)
carry=$repo/.gpu-carry
bash "$repo/scripts/dev/gpu/build_ffmpeg_static.sh"
mkdir -p "$carry/datasets"
rm -rf "$carry/ffmpeg" && cp -r "$HOME/.cache/loongforge/ffmpeg-static" "$carry/ffmpeg"
rm -rf "$carry/ffmpeg/share"
# The raw dataset too: the GPU tests' fixtures convert it as the CPU tests do.
src=${LOONGFORGE_DATASETS:-$repo/../shared/datasets}/robot_sim.PickNPlace
rm -rf "$carry/datasets/robot_sim.PickNPlace" && cp -r "$src" "$carry/datasets/robot_sim.PickNPlace"
# (Re)convert when missing or written before video hashes were recorded (the trainer refuses those).
ds=$carry/datasets/robot_sim.PickNPlace.lf
if ! "$python" -c "import json,sys; d=json.load(open(sys.argv[1])); sys.exit(0 if all('sha256' in v for e in d['episodes'] for v in e['videos']) else 1)" \
    "$ds/loongforge_dataset.json" 2>/dev/null; then
  PYTHONPATH=$repo/scripts "$python" "$repo/scripts/convert_lerobot.py" --overwrite "$src" "$ds"
fi
rm -rf "$carry/model-before"
if [ -n "${BEFORE:-}" ]; then
  mkdir -p "$carry/model-before"
  git -C "$repo" archive "$BEFORE" scripts/model | tar -x -C "$carry/model-before" --strip-components=1
  git -C "$repo" log --oneline -1 "$BEFORE" > "$carry/model-before/COMMIT"
fi
du -sh "$carry"
