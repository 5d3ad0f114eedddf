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
#   PART=settle (after PART=fault: build-gpu/ and the export): settling's price on a real step,
#     gr00t-n1.7-3b full fine-tuning, micro-batch 16, the TorchScript step (CUDA graphs: auto), GCTS on,
#     60 steps with fault.enable against without (one-rank world); median samples/s of steps 21-60. Each run
#     ends with a 37.7 GB checkpoint that /tmp may not hold (exit 4 then): the step figures stand.
#   PART=nan (after PART=fault): issue #47's NaN against CUDA graphs and MLA's segments: gr00t-n1.7-3b full
#     fine-tuning through scripts/bench/mla_compare.sh, each case MICRO_BATCH:GRAPHS:DEBUG:MLA_SETS.
source "$(dirname "${BASH_SOURCE[0]}")/common.sh" session59-${PART:-fault}
LIMIT=${LIMIT:-585}
PART=${PART:-fault}
stamp "environment: $(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | head -1), $(nproc) cores, commit $(git rev-parse --short HEAD 2>/dev/null)"

# settle_pair NAME CONFIG LIMIT_S [--set k=v ...]: one run with fault.enable off and one with it on, in a one-rank
# world (LOONGFORGE_TEST_ONE_RANK_WORLD=1), the TorchScript step (CUDA graphs: auto), GCTS on, the bundled data;
# metrics in $OUT/lf-NAME-fault-{off,on}_metrics.jsonl.
settle_pair() {
  local name=$1 cfg=$2 limit=$3 mode d on; shift 3
  for mode in off on; do
    d=/tmp/$name-$mode; rm -rf $d; on=()
    [ $mode = on ] && on=(--set fault.enable=true)
    LOONGFORGE_TEST_ONE_RANK_WORLD=1 WORLD_SIZE=1 RANK=0 LOCAL_RANK=0 MASTER_ADDR=127.0.0.1 MASTER_PORT=$((29500 + RANDOM % 1000)) \
      timeout $limit build-gpu/src/daemon/loongforge-train --config $cfg "$@" \
      --set data.path=.gpu-carry/datasets/robot_sim.PickNPlace.lf --set trainer.compiled_step=off --set gcts.enable=true \
      --set logging.progress=lines --set logging.interval_steps=1 --set checkpoint.interval_steps=1000000 \
      --set run.output_dir=$d --set run.name=run ${on[@]+"${on[@]}"} > $d.log 2>&1
    echo "$name fault.enable=$mode: exit $?"; cp $d/run/metrics.jsonl "$OUT/lf-$name-fault-${mode}_metrics.jsonl"
    grep -E "rror" $d.log | head -3
  done
}

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
  settle_pair tiny configs/n16-tiny.yaml 120 --set run.device=cuda --set model.path=build-gpu/test-models/n16-tiny.pt \
    --set trainer.max_steps=$STEPS --set trainer.micro_batch_size=8
  python3 scripts/dev/gpu/steady_state.py "$OUT" lf-tiny-fault-on lf-tiny-fault-off
  [ -n "${export_pid:-}" ] && { wait $export_pid; echo "g17 full export: $(tail -1 "$OUT/export-g17-full.log" | cut -c1-200)"; }
  gpu_tests_in_time_left $(( LIMIT - 10 ))
  ;;
settle)
  settle_pair g17 configs/bench/n16-1b-h200.yaml 150 --set model.path=/dev/shm/mlac-gr00t-n1.7-3b-full.pt \
    --set trainer.max_steps=60 --set trainer.micro_batch_size=16 --set data.action_horizon=40
  python3 - <<'PY'
import json, os, statistics
for m in ("off", "on"):
    r = [json.loads(l) for l in open(os.environ["OUT"] + f"/lf-g17-fault-{m}_metrics.jsonl") if '"samples_per_s"' in l]
    r = [x for x in r if x.get("step", 0) > 20]
    print(m, len(r), "median samples/s", statistics.median(x["samples_per_s"] for x in r))
PY
  ;;
nan)
  # The first (log: each capture's start with the device's free memory) repeats session 59's NaN; the second
  # tells a race on reused memory (sync: the device idle before each block is handed out) from the rest;
  # session 59 ran the others.
  for v in ${CASES:-"64:on:log:mla.virtual_memory=true" "64:on:sync:mla.virtual_memory=true" \
                   "64:off::mla.virtual_memory=true" "64:on:poison:mla.virtual_memory=true" \
                   "64:off:poison:mla.virtual_memory=true" "48:on::mla.virtual_memory=true" \
                   "64:on::mla.virtual_memory=true mla.segment_mb=2" "64:on::mla.virtual_memory=true mla.segment_mb=8"}; do
    IFS=: read -r mb g dbg sets <<< "$v"
    n=$(echo "$v" | tr -c 'a-z0-9' '_')
    env ${dbg:+LOONGFORGE_MLA_DEBUG=$dbg} OUT="$OUT/$n" STATE=/tmp/mla-$n FRESH=1 BUILD=0 MODELS=gr00t-n1.7-3b \
      MB_LADDER_gr00t_n1_7_3b=$mb ALLOCATORS=mla GRAPHS=$g BITWISE=0 STEPS=${STEPS:-10} WARMUP=3 RUN_MIN=60 RUN_LIMIT=120 \
      LIMIT=100 MLA_SETS="$sets" bash scripts/bench/mla_compare.sh > /tmp/nan.log 2>&1
    echo "mb=$mb graphs=$g debug=$dbg $sets: $(grep -E "mla-mb$mb:" /tmp/nan.log | cut -c1-220)"
    grep -hE "capture begins|captured|handed out" /tmp/mla-$n/runs/*/mla-mb$mb/train.log 2>/dev/null | head -6 | cut -c1-250
  done
  ;;
ckpt|mla)
  LIMIT=$LIMIT bash scripts/dev/gpu/session58.sh
  ;;
*) echo "PART: fault, ckpt, mla, settle or nan"; exit 2 ;;
esac
stamp "done"
