#!/usr/bin/env bash
# The README's main job (run by `scripts/setup.sh --demo`): export n16-tiny,
# convert the bundled robot_sim.PickNPlace dataset, train on the CPU with
# progress, a checkpoint and a final summary. Each preparation step is
# skipped when its output is up to date.
#
# Environment: LOONGFORGE_DATASETS (default <repo>/../shared/datasets),
#              LOONGFORGE_BUILD (default <repo>/build); extra args go to loongforge-train.
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${LOONGFORGE_BUILD:-$repo/build}
datasets=${LOONGFORGE_DATASETS:-$repo/../shared/datasets}
python=$(cat "$build/python-path" 2>/dev/null || { [ -x "$HOME/.cache/loongforge/venv/bin/python" ] && echo "$HOME/.cache/loongforge/venv/bin/python"; } || echo python3)
cd "$repo"

src="$datasets/robot_sim.PickNPlace"
if [ ! -f "$src/meta/info.json" ]; then
  echo "demo.sh: the bundled dataset is not at $src; set LOONGFORGE_DATASETS to the folder holding robot_sim.PickNPlace" >&2
  exit 1
fi
model=build/models/n16-tiny.pt
if [ ! -f "$model" ] || [ -n "$(find scripts/model -name '*.py' -newer "$model")" ]; then
  echo "== [demo] exporting n16-tiny -> $model"
  PYTHONPATH=scripts "$python" scripts/model/export.py --config n16-tiny --out "$model"
fi
data=build/datasets/robot_sim.PickNPlace.lf
if [ ! -f "$data/loongforge_dataset.json" ] || [ -n "$(find scripts/convert_lerobot.py scripts/lerobot_convert -newer "$data/loongforge_dataset.json")" ]; then
  echo "== [demo] converting $src -> $data"
  rm -rf "$data"
  PYTHONPATH=scripts "$python" scripts/convert_lerobot.py "$src" "$data"
fi
echo "== [demo] training: $build/src/daemon/loongforge-train --config configs/n16-tiny.yaml $*"
exec "$build/src/daemon/loongforge-train" --config configs/n16-tiny.yaml "$@"
