#!/usr/bin/env bash
# Session 59 on one H100/H200 (carry .gpu-carry: scripts/dev/gpu/prepare_carry.sh), in parts, each within
# LIMIT s (default 585) of its start:
#   PART=fault (a fresh machine): build-gpu/, with gr00t-n1.7-3b's full fine-tuning export made beside it
#     (/dev/shm/mlac-gr00t-n1.7-3b-full.pt, for PART=ckpt); then issue #48's NCCL path on one rank:
#     test_nccl_gpu (settling, abort, regroup) and comm_fault_one_rank_gpu (the trainer's recovery with CUDA
#     graphs); the price of settling each step: n16-tiny on the GPU, STEPS (300) steps with fault.enable
#     against without (one-rank world, LOONGFORGE_TEST_ONE_RANK_WORLD=1), steady samples/s of each; then
#     `ctest -L gpu -LE long` in the time left.
#   PART=ckpt, PART=mla: scripts/dev/gpu/session58.sh's parts (issue #45's checkpoint figures, issue #47's
#     NaN), on the same warm machine.
source "$(dirname "${BASH_SOURCE[0]}")/common.sh" session59-${PART:-fault}
LIMIT=${LIMIT:-585}
PART=${PART:-fault}
stamp "environment: $(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | head -1), $(nproc) cores, commit $(git rev-parse --short HEAD 2>/dev/null)"

case $PART in
fault)
  full=/dev/shm/mlac-gr00t-n1.7-3b-full.pt
  if [ ! -f $full ]; then
    (PYTHONPATH=scripts timeout 500 python3 scripts/model/export.py --config gr00t-n1.7-3b --set tune_visual=true \
       --set tune_llm=true --out $full.tmp > "$OUT/export-g17-full.log" 2>&1 && mv $full.tmp $full) &
    export_pid=$!
  fi
  stamp "build"
  bash scripts/dev/gpu/build.sh || exit 1
  stamp "the NCCL path of fault tolerance on one rank"
  (cd build-gpu && ctest -R '^(test_nccl_gpu|comm_fault_one_rank_gpu)$' --output-on-failure > "$OUT/ctest-fault.log" 2>&1
   echo "ctest exit $?")
  grep -E "Test +#|tests passed|FAILED|Failed|regrouped in|relative loss|REQUIRE|with expansion" "$OUT/ctest-fault.log" | head -40

  stamp "settling's price: n16-tiny on the GPU, ${STEPS:=300} steps, fault.enable on and off"
  for mode in off on; do
    d=/tmp/settle-$mode; rm -rf $d
    sets=(--set run.device=cuda --set model.path=build-gpu/test-models/n16-tiny.pt
          --set data.path=.gpu-carry/datasets/robot_sim.PickNPlace.lf --set trainer.max_steps=$STEPS
          --set trainer.micro_batch_size=8 --set trainer.compiled_step=off --set gcts.enable=true
          --set logging.progress=lines --set logging.interval_steps=1 --set checkpoint.interval_steps=1000000
          --set run.output_dir=$d --set run.name=run)
    [ $mode = on ] && sets+=(--set fault.enable=true --set fault.comm_timeout_s=60)
    LOONGFORGE_TEST_ONE_RANK_WORLD=1 WORLD_SIZE=1 RANK=0 LOCAL_RANK=0 MASTER_ADDR=127.0.0.1 MASTER_PORT=$((29500 + RANDOM % 1000)) \
      timeout 120 build-gpu/src/daemon/loongforge-train --config configs/n16-tiny.yaml "${sets[@]}" > $d.log 2>&1
    echo "fault.enable=$mode: exit $?"; cp $d/run/metrics.jsonl "$OUT/lf-fault-${mode}_metrics.jsonl"
    grep -E "rror" $d.log | head -3
  done
  python3 scripts/dev/gpu/steady_state.py "$OUT" lf-fault-on lf-fault-off
  [ -n "${export_pid:-}" ] && { wait $export_pid; echo "g17 full export: $(tail -1 "$OUT/export-g17-full.log" | cut -c1-200)"; }
  gpu_tests_in_time_left $(( LIMIT - 10 ))
  ;;
ckpt|mla)
  LIMIT=$LIMIT bash scripts/dev/gpu/session58.sh
  ;;
*) echo "PART: fault, ckpt or mla"; exit 2 ;;
esac
stamp "done"
