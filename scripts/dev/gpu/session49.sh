#!/usr/bin/env bash
# One device call (~9.5 min, one H100/H200), issue #43 item 2: the compiled step of gr00t-n1.7-3b with bf16
# working copies against the graphed TorchScript step (which keeps them), same call, same GPU:
#   1. build-gpu/ and the export of gr00t-n1.7-3b (every dropout 0) as /dev/shm/g17d0.pt (issue11_step.sh);
#   2. a graphed run that stops once it has written <run dir>/bf16_weights.json (the weights it keeps as
#      copies; docs/operations.md, "bf16 working copies with a package");
#   3. scripts/compile_step.py ... --bf16-weights that file (tag g17c: a package of its own, so a carried
#      g17d0-step.pt2 of fp32 weights is not taken), then lf-compiled-adfe (the package: the run line should
#      say "... as bf16 working copies") and lf-graphs-adfe, STEPS each, with profile-step --kernels.
# Carry .gpu-carry (the package comes back as $OUT/g17c-step.pt2.partNN).
#   bash scripts/dev/gpu/session49.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh" session49
common=(MODEL=gr00t-n1.7-3b "EXPORT_SET=gr00t_dropout=0" MB=32 HORIZON=16)
env "${common[@]}" TAG=g17d0 SECTIONS="none" bash scripts/dev/gpu/issue11_step.sh || exit 1
stamp "the working copies' list"
rm -rf /tmp/lf-copies
timeout 90 build-gpu/src/daemon/loongforge-train --config configs/bench/n16-1b-h200.yaml \
  --set model.path=/dev/shm/g17d0.pt --set trainer.max_steps=2 --set trainer.micro_batch_size=32 \
  --set run.output_dir=/tmp/lf-copies --set run.name=list --set control.socket=/tmp/lf-ctl/list.sock \
  > "$OUT/list-run.log" 2>&1 & lpid=$!
for _ in $(seq 180); do [ -f /tmp/lf-copies/list/bf16_weights.json ] && break; kill -0 $lpid 2>/dev/null || break; sleep 0.5; done
pkill -KILL -P $lpid; kill -KILL $lpid 2>/dev/null; wait $lpid 2>/dev/null
list=/tmp/lf-copies/list/bf16_weights.json
[ -f $list ] || { echo "no $list"; tail -20 "$OUT/list-run.log"; exit 1; }
cp $list "$OUT/bf16_weights.json"
python3 -c 'import json,sys; print(len(json.load(open(sys.argv[1]))), "working copies listed")' $list
for _ in $(seq 60); do [ -z "$(nvidia-smi --query-compute-apps=pid --format=csv,noheader 2>/dev/null)" ] && break; sleep 1; done
ln -sf /dev/shm/g17d0.pt /dev/shm/g17c.pt  # the same model file under the package's tag (not exported again)
left=$(( ${BUDGET:-585} - ($(date +%s) - t0) ))
stamp "compile with the copies, then train ($left s left)"
env "${common[@]}" TAG=g17c SECTIONS="compiled train" BUILD=0 COMPILE_ARGS="--bf16-weights $list" \
  COMPILE_ENV=AOT_INDUCTOR_COMPILE_WRAPPER_OPT_LEVEL=O0 COMPILE_LIMIT=$(( left - 100 )) \
  TRAIN_RUNS="${TRAIN_RUNS:-lf-compiled-adfe lf-graphs-adfe}" STEPS=${STEPS:-100} PROFILE=${PROFILE:-1} \
  FINAL_KILL=1 RUN_LIMIT=${RUN_LIMIT:-50} BUDGET=$left bash scripts/dev/gpu/issue11_step.sh
stamp "done"
