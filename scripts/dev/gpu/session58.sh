#!/usr/bin/env bash
# Session 58 on one H100/H200 (carry .gpu-carry: scripts/dev/gpu/prepare_carry.sh), in parts, each within
# LIMIT s (default 585) of its start:
#   PART=mla (a fresh machine): build-gpu/ and gr00t-n1.7-3b's full fine-tuning export (/dev/shm, kept for the
#     other parts; both by the first experiment's mla_compare.sh), then issue #47's NaN of MLA's virtual pools (Note [Virtual pools]; Note [Diagnosing the
#     virtual pools] in src/engines/mla/device_allocator.cpp), each a scripts/bench/mla_compare.sh run of
#     STEPS (8) steps, full fine-tuning, bf16, trainer.cuda_graphs=off (nothing is captured: the NaN of
#     session 56 came at step 3, before any capture), on a device of DEVICE_MIB (81559, an H100's; a larger
#     device has the rest held by a ballast process), logs under $OUT/eN/:
#       e1  virtual pools, micro-batch 64, mla.segment_mb=2 (each block's own pages only, as in session 56:
#           its NaN again, reclaims logged)
#       e2  MLA on cudaMalloc'd ranges, micro-batch 48, every block filled with NaN bytes when handed out
#           (LOONGFORGE_MLA_DEBUG=poison): does any kernel read memory it did not write?
#       e3  as e1, no page given back (LOONGFORGE_MLA_DEBUG=keep_pages)
#       e4  as e1 at micro-batch 48 (less pressure)
#       e5  as e1 with poison
#       e6  virtual pools, micro-batch 64, the default segments (Note [Backing a segment at a time])
#   PART=ckpt (the same warm machine, after PART=mla): issue #45 on the GPU host:
#     - scripts/bench/checkpoint.sh (GB=8 THREADS=8 STAGING_MB=4096 REPEAT=1) on /dev/shm and on the
#       machine's disk (build-gpu/): the storage's plain write against the checkpoint writer;
#     - gr00t-n1.7-3b full fine-tuning (micro-batch 16, TorchScript step as CUDA graphs, its output on the
#       disk): SIGTERM after step PREEMPT_AT (20); the preemption save's time from the signal until durable
#       (<run>/preemption.json) and the process's peak host memory;
#     - the same model trained CKPT_STEPS (290) steps with a checkpoint every CKPT_EVERY (150) steps written
#       in the background to the disk (one write: two 37.7 GB checkpoints would not fit the 64 GB disk):
#       step time inside the write against outside it (scripts/dev/gpu/ckpt_data_wait.py).
#   PART=tests (the same machine): `ctest -L gpu -LE long` in the time left.
#     PART=mla bash scripts/dev/gpu/session58.sh; then PART=ckpt ...; then PART=tests ...
# PART=ckpt's logic can be tried on the CPU (a small model, the CPU build):
#   PART=ckpt BUILD_DIR=build HMODEL=n16-tiny CFG=configs/n16-tiny.yaml FULL=build/test-models/n16-tiny.pt PREEMPT_AT=5 CKPT_STEPS=40
#   CKPT_EVERY=20 EXTRA_SETS="run.device=cpu precision.mode=fp32 data.path=build/datasets/robot_sim.PickNPlace.lf
#   trainer.micro_batch_size=4" GB=1 PYTHON=$(cat build/python-path) bash scripts/dev/gpu/session58.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh" session58-${PART:-mla}
LIMIT=${LIMIT:-585}
PART=${PART:-mla}
left() { echo $(( LIMIT - ($(date +%s) - t0) )); }
full=${FULL:-/dev/shm/mlac-gr00t-n1.7-3b-full.pt}
cfg=${CFG:-configs/bench/n16-1b-h200.yaml}
build=${BUILD_DIR:-build-gpu}
train_bin=$build/src/daemon/loongforge-train
extra=(); for kv in ${EXTRA_SETS:-}; do extra+=(--set "$kv"); done
stamp "environment: $(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | head -1), $(nproc) cores, commit $(git rev-parse --short HEAD 2>/dev/null)"

mla_experiment() {  # mla_experiment NAME MB MLA_SETS DEBUG: one mla_compare.sh run, its own STATE and OUT
  local name=$1 mb=$2 sets=$3 debug=$4 budget
  budget=$(( $(left) - 5 ))
  [ "$budget" -gt 80 ] || { echo "$name: not run, $(left) s left"; return 0; }
  stamp "$name: micro-batch $mb, MLA_SETS='$sets', LOONGFORGE_MLA_DEBUG='$debug' ($budget s)"
  env ${debug:+LOONGFORGE_MLA_DEBUG=$debug} OUT="$OUT/$name" STATE=/tmp/mla-$name FRESH=1 BUILD=${mla_build:-0} \
    MODELS=gr00t-n1.7-3b MB_LADDER_gr00t_n1_7_3b="$mb" ALLOCATORS=mla GRAPHS=off BITWISE=0 STEPS=${STEPS:-8} \
    WARMUP=3 RUN_MIN=60 RUN_LIMIT=200 LIMIT="$budget" MLA_SETS="$sets" bash scripts/bench/mla_compare.sh \
    | grep -vE "^== \[" | tail -25
  # Per step: the loss, and MLA's reclaims and re-backed pages; the log's MLA and error lines.
  local run; run=$(ls -d /tmp/mla-$name/runs/*/mla-mb$mb 2>/dev/null | head -1)
  [ -n "$run" ] || return 0
  python3 - "$run/run/metrics.jsonl" <<'PY'
import json, sys
try:
    recs = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
except OSError as e:
    print(f"no metrics: {e}"); sys.exit(0)
for r in recs:
    print(f"  step {r.get('step')}: loss {r.get('loss')}, grad_norm {r.get('grad_norm')}, "
          f"MLA reserved {r.get('mla_reserved_mb', '-')} MB, pages or ranges after step 1 "
          f"{r.get('mla_cuda_malloc_after_step_1', '-')}")
PY
  grep -E "MLA|NaN|nan|rror|Traceback|terminate" "$run/train.log" | grep -v "^\s*$" | head -30 | cut -c1-400
}

# ballast_to MIB: a process holding all but MIB of the device's memory (an H200 made an 80 GB H100 for
# the allocator: the NaN came under memory pressure on an H100), its pid in $BALLAST_PID; none on a
# device with MIB or less.
ballast_to() {
  local total; total=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
  BALLAST_PID=""
  [ "$total" -gt $(( $1 + 1024 )) ] || { echo "no ballast: the device has $total MiB"; return 0; }
  python3 - "$(( total - $1 ))" > "$OUT/ballast.log" 2>&1 <<'PY' &
import sys, time, torch
mib = int(sys.argv[1])
free_before = torch.cuda.mem_get_info()[0] >> 20
x = torch.empty(mib << 20, dtype=torch.uint8, device="cuda")
print(f"ballast: {mib} MiB held, the device had {free_before} MiB free, now {torch.cuda.mem_get_info()[0] >> 20}", flush=True)
time.sleep(100000)
PY
  BALLAST_PID=$!
  trap 'kill $BALLAST_PID 2>/dev/null' EXIT  # never left holding memory for the next call
  for _ in $(seq 60); do grep -q "held" "$OUT/ballast.log" && break; sleep 0.5; done
  cat "$OUT/ballast.log"
  export BALLAST_PID
}

case $PART in
mla)
  ballast_to ${DEVICE_MIB:-81559}  # an H100 80GB HBM3's memory.total
  v56="mla.virtual_memory=true mla.segment_mb=2"  # session 56's backing: a block's own pages
  # the most telling first: a call cut short (LIMIT) skips the last ones, saying so; PART=mla again on the
  # same warm machine (BUILD_SKIP=1) runs those named in ONLY. The first experiment's mla_compare.sh builds
  # build-gpu/ and exports the model (its part a; the export is kept in /dev/shm for the others and PART=ckpt).
  mla_build=1; [ "${BUILD_SKIP:-0}" = 1 ] && mla_build=0
  for e in ${ONLY:-e1 e2 e5 e3 e6 e4}; do
    case $e in
      e1) mla_experiment e1 64 "$v56" "" ;;
      e2) mla_experiment e2 48 "" "poison" ;;
      e3) mla_experiment e3 64 "$v56" "keep_pages" ;;
      e4) mla_experiment e4 48 "$v56" "" ;;
      e5) mla_experiment e5 64 "$v56" "poison" ;;
      e6) mla_experiment e6 64 "mla.virtual_memory=true" "" ;;
    esac
    [ -x $train_bin ] || { echo "no $train_bin: the build failed ($OUT/$e/build.log)"; exit 1; }
    mla_build=0
  done
  [ -n "$BALLAST_PID" ] && kill $BALLAST_PID
  ;;
ckpt)
  [ -x $train_bin ] && [ -f $full ] || { echo "run PART=mla first on this machine (build-gpu/ and $full)"; exit 1; }
  ninja -C $build bench_checkpoint > /dev/null || exit 1
  stamp "checkpoint.sh: /dev/shm and the disk (build-gpu/)"
  GB=${GB:-8} THREADS=8 STAGING_MB=4096 REPEAT=1 BUILD=$build timeout $(( $(left) - 200 )) \
    bash scripts/bench/checkpoint.sh /dev/shm/lf-bench-ckpt "$PWD/$build/bench-ckpt" 2>&1 | tail -30
  df -h /dev/shm "$PWD/$build" | cat
  h=$(PYTHONPATH=scripts ${PYTHON:-python3} -c "from model.config import get_config; print(get_config('${HMODEL:-gr00t-n1.7-3b}').action_horizon)")
  common=(--config $cfg --set model.path=$full --set trainer.micro_batch_size=16 --set data.action_horizon=$h ${extra[@]+"${extra[@]}"}
          --set trainer.compiled_step=off --set logging.progress=lines --set logging.interval_steps=1
          --set run.name=run)
  [ -n "$h" ] || { echo "no action horizon for ${HMODEL:-gr00t-n1.7-3b}"; exit 1; }
  stamp "preemption save: $full, SIGTERM after step ${PREEMPT_AT:=20}"
  d=$PWD/$build/preempt; rm -rf "$d"; mkdir -p "$d"
  /usr/bin/time -v $train_bin "${common[@]}" --set run.output_dir="$d" --set trainer.max_steps=100000 \
    --set checkpoint.interval_steps=1000000 --set checkpoint.preempt_lead_s=30 > "$d/train.log" 2> "$d/time.log" &
  pid=$!
  for _ in $(seq 240); do
    n=$(grep -c '"samples_per_s"' "$d/run/metrics.jsonl" 2>/dev/null); [ "${n:-0}" -ge $PREEMPT_AT ] && break
    kill -0 $pid 2>/dev/null || break; sleep 0.5
  done
  pkill -TERM -f "^$train_bin .*$d"
  timeout 150 tail --pid=$pid -f /dev/null; wait $pid; echo "exit $?"
  grep -hE "preemption save|lead time|rror" "$d/train.log" "$d/time.log" | tail -5 | cut -c1-500  # the log is on stderr, beside time -v
  cat "$d/run/preemption.json" 2>/dev/null
  grep -E "Maximum resident|Elapsed" "$d/time.log"
  du -sh "$d/run/checkpoints"/* 2>/dev/null
  rm -rf "$d"
  stamp "step time during background writes: ${CKPT_STEPS:=290} steps, a checkpoint every ${CKPT_EVERY:=150}"
  d=$PWD/$build/ckptrun; rm -rf "$d"; mkdir -p "$d"; df -h "$PWD/$build" | tail -1
  $train_bin "${common[@]}" --set run.output_dir="$d" --set trainer.max_steps=$CKPT_STEPS \
    --set checkpoint.interval_steps=$CKPT_EVERY --set checkpoint.keep_last=1 > "$d/train.log" 2>&1 &
  pid=$!
  end=$(( $(date +%s) + $(left) - 20 ))
  while kill -0 $pid 2>/dev/null && [ "$(date +%s)" -lt $end ]; do
    n=$(grep -c '"samples_per_s"' "$d/run/metrics.jsonl" 2>/dev/null); [ "${n:-0}" -ge $CKPT_STEPS ] && break
    sleep 0.5
  done
  kill -KILL $pid 2>/dev/null; wait $pid 2>/dev/null
  cp "$d/train.log" "$OUT/ckptrun.log"; cp "$d/run/metrics.jsonl" "$OUT/ckptrun_metrics.jsonl"
  grep -E "checkpoint .*MB in" "$d/train.log" | cut -c1-300
  ${PYTHON:-python3} scripts/dev/gpu/ckpt_data_wait.py "$OUT" ckptrun
  rm -rf "$d"
  ;;
tests)
  bash scripts/dev/gpu/build.sh || exit 1
  gpu_tests_in_time_left "$LIMIT"
  ;;
*) echo "PART: mla, ckpt or tests"; exit 2 ;;
esac
stamp "done"
