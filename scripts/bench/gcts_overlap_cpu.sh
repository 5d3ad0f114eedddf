#!/usr/bin/env bash
# GCTS overlap on the CPU: 2 local Gloo ranks of n16-tiny (micro-batch 4,
# accumulation 2, hybrid, 40 steps), gcts.overlap on and off alternately,
# PAIRS times; prints per run the median and mean step time and exposed
# communication (metrics.jsonl: step_ms, exposed_comm_ms) over steps 11-40.
# SHARDED=true adds gcts.shard_optimizer: overlap then also sends the
# parameter all-gather in pieces during the update and waits for it before the
# next forward (counted in exposed_comm_ms); off, the one all-gather is waited
# for inside the update (not in exposed_comm_ms: compare step_ms).
#
#   bash scripts/bench/gcts_overlap_cpu.sh [OUT_DIR]     (PAIRS=2, SHARDED=false by default)
#
# Needs the build's n16-tiny export and converted test dataset
# (ctest --test-dir build -R 'export_test_models|convert_test_dataset').
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
out=${1:-$(mktemp -d)}
py=$(cat "$repo/build/python-path" 2>/dev/null || echo python3)
run() {  # run <dir> <overlap>
  LOG_DIR=$1 bash "$repo/scripts/launch_local.sh" 2 --config "$repo/configs/n16-tiny.yaml" \
    --set model.path="$repo/build/test-models/n16-tiny.pt" \
    --set data.path="$repo/build/test-data/robot_sim.PickNPlace.lf" \
    --set run.output_dir="$1" --set run.name=b --set trainer.max_steps=40 --set trainer.micro_batch_size=4 \
    --set trainer.gradient_accumulation_steps=2 --set run.threads=1 --set logging.progress=lines \
    --set checkpoint.interval_steps=1000000 --set control.enable=false \
    --set gcts.enable=true --set gcts.comm_strategy=hybrid --set gcts.overlap="$2" \
    --set gcts.shard_optimizer="${SHARDED:-false}" > /dev/null
}
dirs=()
for i in $(seq 1 "${PAIRS:-2}"); do
  run "$out/on$i" true && dirs+=("$out/on$i")
  run "$out/off$i" false && dirs+=("$out/off$i")
done
"$py" - "${dirs[@]}" <<'PY'
import json, statistics as st, sys
for d in sys.argv[1:]:
    rows = [json.loads(l) for l in open(d + "/b/metrics.jsonl")][10:]
    step, ex = [r["step_ms"] for r in rows], [r["exposed_comm_ms"] for r in rows]
    print(f"{d}: steps {rows[0]['step']}-{rows[-1]['step']}: step_ms median {st.median(step):.1f} "
          f"(mean {st.mean(step):.1f}), exposed_comm_ms median {st.median(ex):.2f} (mean {st.mean(ex):.2f})")
PY
