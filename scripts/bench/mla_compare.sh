#!/usr/bin/env bash
# Issue #47 on one GPU: MLA (mla.enable=true) against PyTorch's caching allocator and against the caching
# allocator with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True, same machine, same call:
#   bash scripts/bench/mla_compare.sh          (on the GPU machine; carry .gpu-carry, which
#                                               scripts/dev/gpu/prepare_carry.sh fills: FFmpeg, the bundled data)
# Parts, in this order, each started only when its time is left (what is skipped is said, and is missing
# from the table as "not run" / "not measured"):
#   (a) build build-gpu/ (scripts/dev/gpu/build.sh; BUILD=0 takes it as it is: about 110 s cold) and beside
#       it the exports (python3 scripts/model/export.py), kept in /dev/shm for a later call on the same warm
#       machine: each model of MODELS, one after the other, for full fine-tuning (--set tune_visual=true
#       --set tune_llm=true: every parameter trainable) as /dev/shm/mlac-MODEL-full.pt, and n16-1b (its
#       default freezing) as /dev/shm/mlac-n16-1b.pt for part (d);
#   (d) the bitwise check (BITWISE=1; two runs of at most 150 s each, about a minute each expected; the
#       pair started only with BITWISE_MIN s left): n16-1b, fp32
#       (precision.mode=fp32, run.deterministic=true, data.shuffle=false), BITWISE_STEPS (50) steps at
#       micro-batch BITWISE_MB (16), the config's seed, with the caching allocator and with MLA; per-step
#       losses compared exactly (scripts/bench/mla_report.py);
#   (b, c) per model of MODELS its ladder MB_LADDER_<model> (the model's name with every character other
#       than letters and digits as "_": MB_LADDER_gr00t_n1_7_3b, MB_LADDER_n16_3b), largest first, rung by
#       rung: at each micro-batch every allocator of ALLOCATORS that has not trained yet runs STEPS (12)
#       steps, so that a call cut short leaves the three at the same depth. The first micro-batch that
#       trains is that allocator's largest; an out-of-memory end (non-zero exit, the message in the log's
#       end) moves it down; any other failure is reported as such (Note [Outcomes] in mla_report.py) and
#       it moves down too, the row marked. A run gets at most RUN_LIMIT s (180) and is started only with
#       RUN_MIN s (75) left; it is stopped (SIGKILL) right after its last step's metrics record, so that no
#       final checkpoint is written (37 GB for these models), and when a failure checkpoint begins. Its
#       figures (samples/s: median after WARMUP steps; peak memory from nvidia-smi and from the trainer;
#       MLA's mla_* fields) are in Note [What the numbers are] in mla_report.py;
#   (e) the report (RESERVE s kept for it): $OUT/mla_compare.md (one row per model x allocator, printed
#       too), $OUT/mla_compare.json, $OUT/mla-compare-logs.tgz (each run's train.log, metrics.jsonl,
#       nvidia-smi samples and result.json), this log $OUT/mla_compare.log; build.sh adds cmake.log and
#       build.log.
# Every run's result stays in STATE (/tmp/mla-compare) on the machine: a later call on the same warm
# machine skips what is done and runs what is not (a run cut by the call's limit is run again), and its
# report covers all of them. Two 3B models x three allocators take more than one call: e.g.
#   MODELS=gr00t-n1.7-3b bash scripts/bench/mla_compare.sh; then on the same warm machine
#   BUILD=0 MODELS="gr00t-n1.7-3b n16-3b" bash scripts/bench/mla_compare.sh   (the report of both)
# FRESH=1 empties STATE first.
#
# Knobs: MODELS ("gr00t-n1.7-3b n16-3b"), MB_LADDER_<model>, STEPS (12), WARMUP (5), LIMIT (585 s for the
# whole call), RUN_LIMIT, RUN_MIN, ALLOCATORS ("caching expandable mla"), GRAPHS (trainer.cuda_graphs: on,
# so that a capture that runs out of memory ends the run instead of training eagerly), MLA_SETS (more
# --set for the MLA runs, space separated: "mla.global_pool_gb=60"; "mla.virtual_memory=true" for the experimental
# virtual pools), BITWISE (1), BITWISE_MODEL (n16-1b),
# BITWISE_MB, BITWISE_STEPS, BITWISE_MIN (150), BUILD (1), STATE, FRESH, BALLAST_PID (a process holding device
# memory on purpose, which the wait for an idle GPU between runs ignores); EXTRA_SETS (key=value for every run)
# and TRAIN_BIN (the trainer, default build-gpu's) let the script's logic be tried on a CPU, with a stand-in
# nvidia-smi first in PATH (one that prints a number every 0.5 s for -lms and nothing for compute-apps):
#   BUILD=0 TRAIN_BIN=build/src/daemon/loongforge-train GRAPHS=off ALLOCATORS="caching expandable" BITWISE=0
#   MODELS=n16-tiny MB_LADDER_n16_tiny="32 8" STEPS=6 WARMUP=2 RUN_MIN=20 EXTRA_SETS="run.device=cpu
#   precision.mode=fp32 data.path=build/datasets/robot_sim.PickNPlace.lf" bash scripts/bench/mla_compare.sh
# (MLA and trainer.cuda_graphs=on are refused on a CPU: such runs end "failed", with the trainer's words).
# Every run: configs/bench/n16-1b-h200.yaml (cuda, bf16, seed 42, the bundled PickNPlace data), the model's
# own action horizon, the TorchScript step (trainer.compiled_step=off: a package would be compiled per
# micro-batch, minutes each), no gradient accumulation.
#
# Default ladders (H100, 80 GB), from session 56's run (docs/mla.md): gr00t-n1.7-3b's largest micro-batch was
# 48 (caching allocator, MLA on cudaMalloc'd ranges) and 64 (expandable segments): "96 80 64 48"; every
# allocator trained n16-3b at 56, the old ladder's top: "72 64 56 48".
# shellcheck source=scripts/dev/gpu/common.sh  # cd to the repository, OUT, the log $OUT/mla_compare.log, t0, stamp
source "$(dirname "${BASH_SOURCE[0]}")/../dev/gpu/common.sh" mla_compare
LIMIT=${LIMIT:-585}
MODELS=${MODELS:-gr00t-n1.7-3b n16-3b}
STEPS=${STEPS:-12}
WARMUP=${WARMUP:-5}
RUN_LIMIT=${RUN_LIMIT:-180}
RUN_MIN=${RUN_MIN:-75}
RESERVE=${RESERVE:-15}
ALLOCATORS=${ALLOCATORS:-caching expandable mla}
GRAPHS=${GRAPHS:-on}
BITWISE=${BITWISE:-1}
BITWISE_MODEL=${BITWISE_MODEL:-n16-1b}
BITWISE_MB=${BITWISE_MB:-16}
BITWISE_STEPS=${BITWISE_STEPS:-50}
BITWISE_MIN=${BITWISE_MIN:-150}
STATE=${STATE:-/tmp/mla-compare}
extra=(); for kv in ${EXTRA_SETS:-}; do extra+=(--set "$kv"); done
cfg=configs/bench/n16-1b-h200.yaml
train_bin=${TRAIN_BIN:-build-gpu/src/daemon/loongforge-train}
report=scripts/bench/mla_report.py
[ "${FRESH:-0}" = 1 ] && rm -rf "$STATE"
mkdir -p "$STATE"

left() { echo $(( LIMIT - RESERVE - ($(date +%s) - t0) )); }  # seconds left for the parts
ladder_of() {  # ladder_of MODEL: MB_LADDER_<model>, else the default above
  local var="MB_LADDER_${1//[^A-Za-z0-9]/_}"
  local dflt=""
  case $1 in gr00t-n1.7-3b) dflt="96 80 64 48" ;; n16-3b) dflt="72 64 56 48" ;; esac
  echo "${!var:-$dflt}"
}
horizon_of() { PYTHONPATH=scripts python3 -c "from model.config import get_config; print(get_config('$1').action_horizon)"; }
full_file() { echo "/dev/shm/mlac-$1-full.pt"; }
bitwise_file=/dev/shm/mlac-$BITWISE_MODEL.pt

# ------------------------------------------------------------------------------------------- (a)
stamp "environment"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
gpu=$(nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | head -1)
for model in $MODELS; do
  [ -n "$(ladder_of "$model")" ] || { echo "no ladder for $model: set MB_LADDER_${model//[^A-Za-z0-9]/_}"; exit 1; }
done

export_model() {  # export_model FILE CONFIG [k=v ...]: unless FILE is there; log $STATE/export-NAME.log
  local f=$1 c=$2 log kv args=(); shift 2
  log="$STATE/export-$(basename "$f" .pt).log"
  [ -f "$f" ] && { echo "export: $f is there (kept from an earlier call)"; return 0; }
  for kv in "$@"; do args+=(--set "$kv"); done
  if PYTHONPATH=scripts timeout 600 python3 scripts/model/export.py --config "$c" ${args[@]+"${args[@]}"} \
       --out "$f.tmp" > "$log" 2>&1 && mv "$f.tmp" "$f"; then
    echo "exported $f: $(tail -1 "$log" | cut -c1-200)"
  else
    echo "export of $c FAILED: $(tail -3 "$log")"; rm -f "$f.tmp"; return 1
  fi
}
stamp "(a) build, and the exports beside it"
bitwise_pid=""
if [ "$BITWISE" = 1 ]; then export_model "$bitwise_file" "$BITWISE_MODEL" & bitwise_pid=$!; fi
# The 3B exports one after the other (each holds tens of GB of host memory while it scripts and saves);
# the ladders need them only after the build and the bitwise check.
(for model in $MODELS; do
   full=(tune_visual=true tune_llm=true)
   [ "$model" = gr00t-n1.6-3b ] && full+=(max_state_dim=64 max_action_dim=64)  # the data's 44 > its 29
   export_model "$(full_file "$model")" "$model" "${full[@]}"
 done) & big_pid=$!
if [ "${BUILD:-1}" = 1 ]; then
  bash scripts/dev/gpu/build.sh || exit 1
elif [ ! -x "$train_bin" ]; then
  echo "BUILD=0 but $train_bin is missing: run with BUILD=1"; exit 1
fi
stamp "built"

wait_gpu_idle() {  # a killed trainer's device memory is freed once the driver has reaped it (BALLAST_PID's is not)
  for _ in $(seq 60); do
    [ -z "$(nvidia-smi --query-compute-apps=pid --format=csv,noheader 2>/dev/null | grep -vxF "${BALLAST_PID:-none}")" ] \
      && return 0; sleep 1
  done
  echo "warning: the GPU still has a process after 60 s: $(nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader)"
}

# train_run DIR LIMIT_S ALLOCATOR MODEL_FILE HORIZON MB STEPS [--set k=v ...]: one loongforge-train run in
# DIR (train.log, run/metrics.jsonl, smi.csv), watched every 0.5 s and stopped with SIGKILL after its last
# step's record, when a failure checkpoint begins, or after LIMIT_S (or what is left of the call, if less:
# then it is "cut", to be run again); then DIR/result.json (mla_report.py run).
train_run() {
  local dir=$1 own=$2 alloc=$3 file=$4 horizon=$5 mb=$6 steps=$7; shift 7
  local limit; limit=$(left); [ "$limit" -gt "$own" ] && limit=$own
  local envs=(env -u PYTORCH_CUDA_ALLOC_CONF) sets=() kv
  case $alloc in
    caching) ;;
    expandable) envs=(env PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True) ;;
    mla) sets=(--set mla.enable=true); for kv in ${MLA_SETS:-}; do sets+=(--set "$kv"); done ;;
    *) echo "unknown allocator $alloc (caching, expandable, mla)"; return 1 ;;
  esac
  rm -rf "$dir"; mkdir -p "$dir"
  wait_gpu_idle
  nvidia-smi --id=0 --query-gpu=memory.used --format=csv,noheader,nounits -lms 500 > "$dir/smi.csv" 2>/dev/null &
  local smi=$!
  sleep 0.6  # the first sample: the GPU before the run
  local start; start=$(date +%s)
  "${envs[@]}" "$train_bin" --config $cfg --set model.path="$file" --set trainer.micro_batch_size="$mb" \
    --set trainer.gradient_accumulation_steps=1 --set trainer.max_steps="$steps" --set data.action_horizon="$horizon" \
    --set run.output_dir="$dir" --set run.name=run --set logging.progress=lines --set logging.interval_steps=1 \
    --set trainer.compiled_step=off --set trainer.cuda_graphs="$GRAPHS" --set checkpoint.interval_steps=1000000 \
    ${extra[@]+"${extra[@]}"} ${sets[@]+"${sets[@]}"} "$@" > "$dir/train.log" 2>&1 &
  local pid=$! rc="" stopped="" n
  while :; do
    if ! kill -0 $pid 2>/dev/null; then wait $pid; rc=$?; break; fi
    n=$(grep -c '"samples_per_s"' "$dir/run/metrics.jsonl" 2>/dev/null); n=${n:-0}
    if [ "$n" -ge "$steps" ]; then stopped=after_last_step
    elif [ -n "$(ls -A "$dir/run/checkpoints" 2>/dev/null)" ]; then stopped=failure_checkpoint
    elif [ $(( $(date +%s) - start )) -ge "$limit" ]; then
      stopped=time_limit; [ "$limit" -lt "$own" ] && stopped=call_limit
    fi
    if [ -n "$stopped" ]; then kill -KILL $pid 2>/dev/null; wait $pid 2>/dev/null; break; fi
    sleep 0.5
  done
  kill $smi 2>/dev/null; wait $smi 2>/dev/null
  rm -rf "$dir/run/checkpoints"  # a failure checkpoint's partial files (tens of GB)
  echo "  $(( $(date +%s) - start )) s, ${stopped:-exit $rc}"
  python3 $report run "$dir" --steps "$steps" --warmup "$WARMUP" --limit-s "$limit" --rc "$rc" --stopped "$stopped"
}
outcome_of() { python3 $report outcome "$1"; }
final() { case $1 in ok|oom|failed|timeout) return 0 ;; *) return 1 ;; esac; }

# ------------------------------------------------------------------------------------------- (d)
if [ "$BITWISE" = 1 ]; then
  stamp "(d) bitwise: $BITWISE_MODEL fp32, $BITWISE_STEPS steps, micro-batch $BITWISE_MB, caching allocator against MLA"
  wait $bitwise_pid || echo "the bitwise check's export failed (above)"
  bw_h=$(horizon_of "$BITWISE_MODEL")
  bw_left=$(left)  # the pair starts with BITWISE_MIN s left, or not at all
  for alloc in caching mla; do
    dir=$STATE/bitwise/$alloc
    o=$(outcome_of "$dir")
    if final "$o"; then echo "$alloc: $o (from an earlier call)"; continue; fi
    if [ ! -f "$bitwise_file" ]; then echo "$alloc: not run (no model file)"; continue; fi
    if [ "$bw_left" -lt "$BITWISE_MIN" ]; then echo "$alloc: not run: $bw_left s left, the check starts with $BITWISE_MIN"; continue; fi
    train_run "$dir" 150 "$alloc" "$bitwise_file" "$bw_h" "$BITWISE_MB" "$BITWISE_STEPS" \
      --set precision.mode=fp32 --set run.deterministic=true --set data.shuffle=false
  done
else
  stamp "(d) bitwise: skipped (BITWISE=$BITWISE)"
fi

# ------------------------------------------------------------------------------------------- (b), (c)
stamp "(b, c) ladders: waiting for the exports of $MODELS"
wait $big_pid
out_of_time=0
for model in $MODELS; do
  file=$(full_file "$model"); ladder=$(ladder_of "$model")
  stamp "$model (full fine-tuning), ladder: $ladder"
  [ -f "$file" ] || { echo "$model: not run (no model file; its export log: $STATE/export-$(basename "$file" .pt).log)"; continue; }
  h=$(horizon_of "$model")
  unset trained; declare -A trained=()
  for mb in $ladder; do
    for alloc in $ALLOCATORS; do
      [ -n "${trained[$alloc]:-}" ] && continue
      dir=$STATE/runs/$model/$alloc-mb$mb
      o=$(outcome_of "$dir")
      if final "$o"; then
        echo "$model, $alloc, micro-batch $mb: $o (from an earlier call)"
      elif [ $out_of_time = 1 ] || [ "$(left)" -lt "$RUN_MIN" ]; then
        [ $out_of_time = 0 ] && echo "not run from here on: $(left) s left, a run starts with $RUN_MIN s (RUN_MIN)"
        out_of_time=1; continue
      else
        stamp "$model, $alloc, micro-batch $mb"
        train_run "$dir" "$RUN_LIMIT" "$alloc" "$file" "$h" "$mb" "$STEPS"
        o=$(outcome_of "$dir")
      fi
      [ "$o" = ok ] && trained[$alloc]=1
    done
  done
done

# ------------------------------------------------------------------------------------------- (e)
stamp "(e) report"
ladder_args=(); for model in $MODELS; do ladder_args+=(--ladder "$model=$(ladder_of "$model" | tr ' ' ',')"); done
python3 $report report "$STATE" "${ladder_args[@]}" --allocators "${ALLOCATORS// /,}" \
  --bitwise-steps "$BITWISE_STEPS" --out "$OUT" \
  --meta "GPU=$gpu" --meta "commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)" \
  --meta "runs=full fine-tuning (every parameter trainable), bf16, $cfg, TorchScript step, trainer.cuda_graphs=$GRAPHS, no accumulation, $STEPS steps each, samples/s the median of steps $((WARMUP + 1))-$STEPS" \
  --meta "bitwise=$BITWISE_MODEL, fp32, run.deterministic=true, data.shuffle=false, micro-batch $BITWISE_MB, $BITWISE_STEPS steps" \
  --meta "MLA keys=mla.enable=true ${MLA_SETS:-(the defaults)}" ${EXTRA_SETS:+--meta "EXTRA_SETS (every run)=$EXTRA_SETS"}
tar -czf "$OUT/mla-compare-logs.tgz" -C "$STATE" --exclude=checkpoints --exclude=tb . 2>/dev/null
stamp "done"
