#!/usr/bin/env bash
# The headline benchmark of issue #41: on one GPU, the same episodes, side by side,
#   (a) LeRobot 0.6.1's own GR00T trainer: lerobot-train (lerobot/scripts/lerobot_train.py, its main()
#       run unchanged under a timing shim: scripts/bench/lerobot_side.py) with --policy.type=groot, a
#       GR00T N1.7 base checkpoint random-initialised offline by lerobot's own GR00TN17, its dataset class
#       (LeRobotDataset, v3.0 made by LeRobot's own converter), its decoder (torchcodec), DataLoader
#       workers, bf16 autocast and AdamW/cosine presets; only the model is run (gr00t-n1.7-3b's architecture);
#   (b) scripts/reference/train_torch.py --mode baseline (ref-base) and --mode optimized (ref-opt);
#   (c) loongforge-train with its GPU defaults (lf; since session 44 they decode keyframe spans with ADFE
#       on the cores less two, since session 50 they train the compiled step from the package cache, which
#       part lf fills first with --compile-only); with those settings spelled out (lf-tuned: data.video_decode=span,
#       adfe.enable=true, adfe.decode_threads = the cores less two: the defaults of 5dccf7a and before
#       were whole-video decoding without ADFE); and with one engine changed each: adfe.enable=true
#       (lf-adfe), gcts.enable=true at one GPU (lf-gcts), trainer.cuda_graphs=off (lf-nographs). MLA is
#       compared apart (issue #47); DMF cuts only the n16 family's text slot (the GR00T models' result
#       depends on theirs: loongforge-train refuses dmf.enable for them).
#       Each lf run takes one `loongforge profile-step` window (PROF_STEPS steps from step PROF_AT) for its
#       step split; those steps are left out of its window.
# Equal global batch (default fine-tuning: backbone frozen, micro-batch 32; FTS=full: everything trains,
# micro-batch 16), bf16 on the GPU, the trainable sets of upstream (docs/models.md). Report:
# scripts/bench/report.py (table, charts); how to run it: docs/benchmarks.md, the headline harness.
#
#   [PART="prep lerobot ref lf report"] [MODELS=gr00t-n1.7-3b] [FTS=default] [CODECS=av1]
#   [RUNS="lerobot ref-opt lf"] [WARM=5] [STEADY=30] [PART_BUDGET_S=540] [EPISODES=600]
#   [LR_WORKERS=] [DRY=1] bash scripts/bench/headline.sh
#
# Defaults are the headline rows: gr00t-n1.7-3b, default fine-tuning, AV1 as LeRobot writes it
# (libsvtav1, GOP 2), LeRobot's trainer against ref-opt and lf. CODECS=h264 is the second row
# (long-GOP h264 as the bundled Isaac-GR00T videos are). The other runs are RUNS="ref-base lf-adfe
# lf-gcts lf-nographs"; the other rows FTS=full, MODELS=gr00t-n1.6-3b / n16-1b.
#
# Measurement window (measure-based, not a fixed step count): the first WARM steps are warm-up
# (torch.compile's and CUDA-graph capture's steps, DataLoader start); once a run has STEADY steady
# steps after them (an lf run's profile window left out) scripts/bench/monitor.py stops it (the Python
# trainers with SIGTERM; loongforge-train with SIGKILL, which skips the final checkpoint it writes on
# SIGTERM: over 30 s for gr00t-n1.7-3b on the first GPU run; every trainer writes its metrics per step). A run
# also stops at its time budget: its cap (RUN_CAP_S) or what this call has left after the estimated
# needs of the runs still to come in it, whichever is less; the table says which rule ended each run.
# Each invocation (one device call) keeps within PART_BUDGET_S (540 s: device calls are at most 10 min),
# and prints each part's elapsed time and the budget left, of this call and of the plan (PLAN_BUDGET_S,
# 1200 s, summed over the calls made on this machine while it stays warm).
#
# Default plan (four device calls on one warm machine; timings of 2026-12-05 (H100) and 2026-12-07 (H200)):
#   PART=prep                ~4.5 min wheels; in the background the build of loongforge-train and the
#                                    gr00t-n1.7-3b export; the Qwen files, 600 AV1 episodes (replicate,
#                                    LeRobot's v3.0 conversion into ~4-minute files and a LeRobotDataset
#                                    read of every file's last frames, our shards, the reference's
#                                    decoder on one video), LeRobot's random-init base checkpoint
#   PART=lerobot             ~2 min  LeRobot's trainer (118 s on an H200, session 57)
#   PART="lf report"         ~9 min  the compiled step into the package cache first (--compile-only: 452 s for
#                                    gr00t-n1.7-3b with dropout on an H200; a hit, ~10 s, on a warm machine
#                                    that has it), then lf (16 s to the first step, 30 steady steps in ~4 s)
#   PART="ref report"        ~8 min  ref-opt (torch.compile's first step 118-283 s before, none within 243 s in
#                                    session 57 with dropout on: give it a call of its own; 480 s cap), the table
# so about 20 minutes with a compile (session 57: 19 min, ref-opt cut short); FTS="default full", CODECS="av1 h264" or more MODELS multiply the run parts: run
# them as further calls (MODELS=gr00t-n1.6-3b PART="ref lf" ...). LeRobot's trainer runs only for
# gr00t-n1.7-* models (it has no N1.6 or n16 policy).
# Every part writes its runs under $BENCH_WORK/results (kept on the machine between calls while it is
# warm) and leaves in $OUT at most 8 files: <part>.log, results.tar.gz (every run's metrics, monitor
# samples, launch record and log tail) and, for PART=report, headline.md/.json and two PNGs. A part
# whose inputs are missing (a cold machine) runs what it needs first (prep, the export).
# Cold reads: before every run the page cache is dropped (`echo 3 > /proc/sys/vm/drop_caches`); where
# that is refused, every file of the dataset is evicted with posix_fadvise(DONTNEED); launch.json and
# the table say which happened.
# DRY=1: the whole thing on this CPU machine with tiny sizes (gr00t-n1.7-tiny / gr00t-n1.6-tiny / n16-tiny
# exports, a tiny GR00T N1.7 base checkpoint for lerobot-train, 12 episodes, WARM=1 STEADY=4 of batch 2,
# every run), Python 3.12 from ~/.cache/loongforge/py312 (scripts/bench/setup_py312.sh), build/ (LF_BUILD)
# for the trainer; the page cache is only evicted per file (fadvise), never dropped, on the shared machine.
# Carry (scripts/bench/prepare_carry.sh fills them): .bench-carry (wheels, FFmpeg 7 libraries, ffprobe and
# ffmpeg, the Qwen BPE ranks, the distinct videos and parquet files) and .gpu-carry/ffmpeg (the trainer's build).
set -uo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$repo"
DRY=${DRY:-0}
OUT=${OUT:-/tmp/bench-out}
mkdir -p "$OUT"
WORK=${BENCH_WORK:-$repo/bench-work$([ "$DRY" = 1 ] && echo -dry)}
CARRY=${BENCH_CARRY:-$repo/.bench-carry}
RESULTS=$WORK/results
mkdir -p "$WORK" "$RESULTS"
PARTS=${PART:-prep lerobot ref lf report}
[ "$PARTS" = all ] && PARTS="prep lerobot ref lf report"
logname=$(echo "$PARTS" | tr ' ' '-')  # '+' does not come back from the device tool
exec > >(tee -a "$OUT/$logname.log") 2>&1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
t_start=$(date +%s)
stamp() { echo "== [$(( $(date +%s) - t_start ))s] $*"; }
die() { echo "headline.sh: $*" >&2; finish; exit 1; }

MODELS=${MODELS:-gr00t-n1.7-3b}
FTS=${FTS:-default}
CODECS=${CODECS:-av1}
# every run on the CPU dry run; on the GPU the headline rows (the others by RUNS=..., see above)
RUNS=${RUNS:-$([ "$DRY" = 1 ] && echo "lerobot ref-base ref-opt lf lf-tuned lf-adfe lf-gcts lf-nographs" || echo "lerobot ref-opt lf")}
EPISODES=${EPISODES:-600}
WARM=${WARM:-5}               # warm-up steps of every run (compile, graph capture, worker start)
STEADY=${STEADY:-30}          # a run stops once it has this many steady-state steps after them
PROF_STEPS=${PROF_STEPS:-5}   # lf: one `loongforge profile-step` window of at most this many steps (and 1 s) ...
PROF_AT=${PROF_AT:-$((WARM + 3))}   # ... from this step (its steps are left out of the window)
LR_WORKERS=${LR_WORKERS:-}    # empty: lerobot-train's default (--num_workers 4)
V30_FILE_S=${V30_FILE_S:-240} # LeRobot's v3.0 files hold about this many seconds of video (make_dataset.py v30)
PART_BUDGET_S=${PART_BUDGET_S:-540}   # this invocation (one device call) keeps within it
PLAN_BUDGET_S=${PLAN_BUDGET_S:-1200}  # the plan's device time, summed over this machine's calls
MIN_RUN_S=${MIN_RUN_S:-60}    # a run that would get less than this is skipped (the table says so)
if [ "$DRY" = 1 ]; then
  EPISODES=${DRY_EPISODES:-12}; WARM=1; STEADY=${DRY_STEADY:-4}; PROF_AT=2; PROF_STEPS=1
  V30_FILE_S=${DRY_V30_FILE_S:-60}   # 12 episodes of ~21 s: several files here too
  PART_BUDGET_S=${DRY_PART_BUDGET_S:-3600}; PLAN_BUDGET_S=${DRY_PLAN_BUDGET_S:-7200}; MIN_RUN_S=0
  PY=${PY:-$(cat build/python-path 2>/dev/null || echo "$HOME/.cache/loongforge/venv/bin/python")}
  LPY=${LPY:-$HOME/.cache/loongforge/py312/bin/python}
  LFBUILD=${LF_BUILD:-build}
  DEVICE=cpu
else
  PY=${PY:-python3}; LPY=${LPY:-python3}; LFBUILD=build-gpu; DEVICE=cuda
fi
MAX_STEPS=${MAX_STEPS:-$((WARM + STEADY + PROF_STEPS + 10))}   # the trainers' step limit; the stop rule ends runs sooner
NPROC=$(nproc)
DECODE_THREADS=${LF_DECODE_THREADS:-$(( NPROC > 4 ? NPROC - 2 : 2 ))}   # lf-tuned: the cores less the trainer's and the batch thread
export PATH="$CARRY/ffmpeg7/bin:$PATH"   # ffprobe (convert_lerobot.py) and ffmpeg (the reference's decoder)
LFBIN=$LFBUILD/src/daemon/loongforge-train
LFCLI=$LFBUILD/cli/loongforge
LSITE=$WORK/lerobot-site
CKPT=${CKPT_DIR:-$([ "$DRY" = 1 ] && echo "$WORK/ckpt" || echo /dev/shm/bench-ckpt)}
# Exports on disk beside the data (read cold, as LeRobot's base checkpoint is); a 3B export is 12.6 GB:
# MODEL_DIR=/dev/shm/bench-models where the 64 GB disk runs short (then they are read from memory).
MODELDIR=${MODEL_DIR:-$WORK/models}
mkdir -p "$MODELDIR"

# ------------------------------------------------------------------------------------------- budget
# Estimated seconds of each run on an H100 (model load, warm-up, STEADY steps, exit), from the first GPU
# run (2026-12-05), used to keep room for the runs still to come in this call; and each run's cap.
est_s() { case $1 in lerobot) echo 150 ;; ref-opt) echo 450 ;; ref-base) echo 150 ;; lf) echo 90 ;;
                     lf-tuned) echo 90 ;; *) echo 100 ;; esac; }
RUN_CAP_S=${RUN_CAP_S:-}   # one cap for every run (seconds); empty: cap_s below
cap_s() { [ -n "$RUN_CAP_S" ] && { echo "$RUN_CAP_S"; return; }
          case $1 in lerobot) echo 240 ;; ref-opt) echo 480 ;; ref-base) echo 240 ;; lf) echo 180 ;;
                     lf-tuned) echo 150 ;; *) echo 180 ;; esac; }
stop_grace_s() { echo 15; }   # the monitor stops a run this long before its budget (the timeout's backstop)
stop_signal() { case $1 in lf*) echo KILL ;; *) echo TERM ;; esac; }   # monitor.py says why
FINISH_S=20   # the results tarball and the last lines

# The runs this invocation will make, in order (the part functions below walk the same loops).
planned_runs() {
  local p model ft codec run
  for p in $PARTS; do
    for model in $MODELS; do for ft in $FTS; do for codec in $CODECS; do
      case $p in
        lerobot) [[ $model == gr00t-n1.7-* ]] && [[ " $RUNS " == *" lerobot "* ]] && echo lerobot ;;
        ref) for run in $RUNS; do [[ $run == ref-* ]] && echo "$run"; done ;;
        lf) for run in $RUNS; do [[ $run == lf || $run == lf-* ]] && echo "$run"; done ;;
      esac
    done; done; done
  done
}
read -r -a PLANNED <<< "$(planned_runs | tr '\n' ' ')"
RUN_I=0   # index into PLANNED of the run being started

run_budget() {  # run_budget KIND: sets BUDGET (seconds this run may take; 0: skip it) and BUDGET_WHY
  local kind=$1 left reserve=$FINISH_S i cap
  left=$(( PART_BUDGET_S - ($(date +%s) - t_start) ))
  for ((i = RUN_I + 1; i < ${#PLANNED[@]}; i++)); do reserve=$((reserve + $(est_s "${PLANNED[$i]}"))); done
  [[ " $PARTS " == *" report "* ]] && reserve=$((reserve + 15))
  cap=$(cap_s "$kind")
  local b=$(( left - reserve < cap ? left - reserve : cap ))
  BUDGET_WHY="cap ${cap}s; this call has ${left}s left of ${PART_BUDGET_S}s, ${reserve}s kept for what follows"
  BUDGET=$b
  if [ "$b" -lt "$MIN_RUN_S" ] || [ "$b" -le "$(stop_grace_s "$kind")" ]; then BUDGET=0; fi
}

part_done() {  # part_done NAME SECONDS: the part's time and what is left of the call and of the plan
  local el=$2 call=$(( $(date +%s) - t_start ))
  stamp "part $1: ${el}s; this call ${call}s of ${PART_BUDGET_S}s ($((PART_BUDGET_S - call))s left)"
}

# The default plan's calls, with their estimates (seconds), for the budget line at the end of a call
DEFAULT_CALLS=("prep:270" "lerobot lf:430" "ref report:500")
finish() {  # $OUT: the part's log (tee'd already) and every run so far, small files only
  tar -C "$WORK" -czf "$OUT/results.tar.gz" --exclude='*/out' --exclude='*/checkpoints' --exclude='*.pt' \
    --exclude='*.trace.json' \
    results 2>/dev/null
  local call=$(( $(date +%s) - t_start ))
  echo "$PARTS|$call" >> "$WORK/device_calls.log"
  local used; used=$(awk -F'|' '{s += $2} END {print s + 0}' "$WORK/device_calls.log")
  local pending_s=0 c parts est done_parts; done_parts=$(cut -d'|' -f1 "$WORK/device_calls.log" | tr '\n' ' ')
  for c in "${DEFAULT_CALLS[@]}"; do
    parts=${c%%:*}; est=${c##*:}
    local all=1 q; for q in $parts; do [[ " $done_parts " == *" $q "* ]] || all=0; done
    [ $all = 1 ] || pending_s=$((pending_s + est))
  done
  stamp "done: $PARTS in ${call}s ($(du -sh "$OUT/results.tar.gz" 2>/dev/null | cut -f1) of results in \$OUT)"
  echo "budget: this call ${call}s of ${PART_BUDGET_S}s; this machine's calls so far $(wc -l < "$WORK/device_calls.log"), ${used}s of the plan's ${PLAN_BUDGET_S}s: $((PLAN_BUDGET_S - used))s left; the default plan's calls not yet made here are estimated at ${pending_s}s"
}

# ------------------------------------------------------------------------------------------- helpers
our_config() {  # our_config MODEL -> the scripts/model config that stands for it (DRY: its tiny form)
  if [ "$DRY" = 1 ]; then
    case $1 in gr00t-n1.7-3b) echo gr00t-n1.7-tiny ;; gr00t-n1.6-3b) echo gr00t-n1.6-tiny ;; *) echo n16-tiny ;; esac
  else echo "$1"; fi
}
model_sets() {  # model_sets MODEL FT -> export.py --set values (space-separated)
  local s=""
  case $1 in gr00t-n1.6-3b) s="max_state_dim=64 max_action_dim=64" ;; esac   # its 29 < the data's 44
  [ "$2" = full ] && s="$s tune_visual=true tune_llm=true"
  echo "$s"
}
horizon() {  # the model's action horizon, which both of our trainers' data.action_horizon follow
  PYTHONPATH=scripts "$PY" -c "from model.config import get_config; print(get_config('$1').action_horizon)"
}
batch_of() { if [ "$DRY" = 1 ]; then echo 2; elif [ "$1" = full ]; then echo 16; else echo 32; fi; }
gpu_name() { nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1; }
idle_gpu_mb() { nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits 2>/dev/null | head -1; }

drop_cache() {  # drop_cache DIR... -> prints what was done
  if [ "$DRY" != 1 ] && sync && (echo 3 > /proc/sys/vm/drop_caches) 2>/dev/null; then
    echo "page cache dropped (echo 3 > /proc/sys/vm/drop_caches)"; return
  fi
  "$PY" - "$@" <<'PY'
import os, sys
n = b = 0
def paths(root):
    if os.path.isfile(root):
        yield root
    for d, _, files in os.walk(root):
        for f in files:
            yield os.path.join(d, f)
for root in sys.argv[1:]:
        for p in paths(root):
            try:
                fd = os.open(p, os.O_RDONLY)
            except OSError:
                continue
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                n += 1; b += os.fstat(fd).st_size
            finally:
                os.close(fd)
print(f"drop_caches refused or skipped (DRY); {n} files of the dataset and model ({b / 2**20:.0f} MiB) evicted with posix_fadvise(DONTNEED)")
PY
}

# run_measured NAME KIND MODEL FT CODEC BATCH METRICS_FILE DATA_DIR -- command...
# Takes the run's budget (run_budget), drops the cache, starts the command under `timeout` and
# scripts/bench/monitor.py beside it (which samples it and stops it at STEADY steady steps or at its
# budget; MON_EXTRA adds monitor arguments), writes launch.json. KIND is the run (lerobot, ref-opt, lf-tuned...).
run_measured() {
  local name=$1 trainer=$2 model=$3 ft=$4 codec=$5 batch=$6 metrics=$7 data=$8; shift 9
  local tmp=$RESULTS/.tmp-$name R=$RESULTS/$name
  rm -rf "$R" "$tmp"; mkdir -p "$tmp"
  run_budget "$trainer"; local budget=$BUDGET why=$BUDGET_WHY
  RUN_I=$((RUN_I + 1))
  if [ "$budget" = 0 ]; then
    stamp "$name: skipped: not enough time left in this call ($why); run it in a call of its own"
    mkdir -p "$R" && rmdir "$tmp"
    "$PY" - "$R/launch.json" <<PY
import json, sys
json.dump({"name": "$name", "trainer": "$trainer", "model": "$model", "ft": "$ft", "codec": "$codec",
           "batch": $batch, "skipped": """not enough time left in this call ($why)"""}, open(sys.argv[1], "w"), indent=1)
PY
    return 0
  fi
  local grace; grace=$(stop_grace_s "$trainer")
  local cache; cache=$(drop_cache $data | tail -1)   # $data: the dataset and the model file(s), unquoted
  stamp "$name: budget ${budget}s ($why); $cache"
  local idle; idle=$(idle_gpu_mb)
  local t0; t0=$(date +%s.%N)
  timeout --signal=TERM --kill-after=20 "$budget" "$@" > "$tmp/run.log" 2>&1 &
  local pid=$!
  # shellcheck disable=SC2086
  "$LPY" scripts/bench/monitor.py --pid $pid --metrics "$metrics" --out "$tmp/monitor.jsonl" \
    --warm "$WARM" --steady "$STEADY" --budget $((budget - grace)) --stop-signal "$(stop_signal "$trainer")" \
    ${MON_EXTRA:-} &
  local mpid=$!
  [ -n "${AFTER_LAUNCH:-}" ] && $AFTER_LAUNCH $pid
  wait $pid; local rc=$?
  wait $mpid
  local t1; t1=$(date +%s.%N)
  mkdir -p "$R"
  [ "$metrics" != "$R/metrics.jsonl" ] && cp "$metrics" "$R/metrics.jsonl" 2>/dev/null
  mv "$tmp"/* "$R/" && rmdir "$tmp"
  "$PY" - "$R/launch.json" "$R/monitor.jsonl" <<PY
import json, sys
stop = {}
for line in open(sys.argv[2]):
    try:
        r = json.loads(line)
    except ValueError:
        continue
    if r.get("stop"):
        stop = {"stop": r["stop"], "stop_step": r.get("stop_step"), "stop_steady_steps": r.get("steady_steps")}
json.dump({"name": "$name", "trainer": "$trainer", "model": "$model", "ft": "$ft", "codec": "$codec",
           "batch": $batch, "exit": $rc, "launch_t": $t0, "end_t": $t1, "warm": $WARM, "steady_target": $STEADY,
           "budget_s": $budget, "budget_why": """$why""", **stop, "settings": "${RUN_SETTINGS:-}",
           "skip_steps": [int(x) for x in "${SKIP_STEPS:-}".split()] or [], "cache_drop": """$cache""",
           "gpu": """$(gpu_name)""", "idle_gpu_mem_mb": float("${idle:-0}" or 0),
           "model_config": "${MODEL_CONFIG:-}", "model_sets": "${MODEL_SETS:-}".split(),
           "our_seq_len": ${OUR_SEQ:-0}, "image_tokens": ${IMAGE_TOKENS:-64},
           "command": """$(printf '%q ' "$@" | cut -c1-3000)"""}, open(sys.argv[1], "w"), indent=1)
PY
  tail -3 "$R/run.log" | cut -c1-300
  local by; by=$(grep -o '"stop": "[a-z]*"' "$R/launch.json" | cut -d'"' -f4)
  case $by in steady) by="the stop rule ($STEADY steady steps)" ;; budget) by="its time budget" ;;
              *) by="itself (its step limit, an error or the timeout)" ;; esac
  stamp "$name: exit $rc, $(grep -c . "$R/metrics.jsonl" 2>/dev/null) steps; ended by $by"
  return 0
}

# ------------------------------------------------------------------------------------------- prep
lerobot_env() {  # the carried wheels, installed once into $LSITE (a --target folder first on PYTHONPATH)
  local want; want=$(ls "$CARRY"/wheels/*.whl 2>/dev/null | xargs -n1 basename | sort | md5sum | cut -c1-12)
  [ -n "$want" ] || die "no wheels in $CARRY/wheels: run scripts/bench/prepare_carry.sh on the CPU machine"
  if [ "$(cat "$LSITE/.wheels" 2>/dev/null)" != "$want" ]; then
    stamp "lerobot: installing $(ls "$CARRY"/wheels/*.whl | wc -l) carried wheels into $LSITE (--no-index --no-deps)"
    rm -rf "$LSITE"
    "$LPY" -m pip install -q --no-index --no-deps --disable-pip-version-check --target "$LSITE" \
      "$CARRY"/wheels/*.whl || die "pip install of the carried wheels failed"
    echo "$want" > "$LSITE/.wheels"
  fi
}
lerobot_cmd() {  # the environment lerobot runs in
  echo env PYTHONPATH="$LSITE" LD_LIBRARY_PATH="$CARRY/ffmpeg7/lib" HF_HOME="$WORK/hf-home" HF_HUB_OFFLINE=1 \
    HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false "$LPY"
}

prep() {
  local t_prep; t_prep=$(date +%s)
  stamp "prep: $([ "$DRY" = 1 ] && echo "DRY (CPU)" || gpu_name), $(nproc) cores, models $MODELS, codecs $CODECS, runs $RUNS"
  [ -d "$CARRY" ] || die "no $CARRY: run scripts/bench/prepare_carry.sh on the CPU machine and carry it"
  lerobot_env
  [ -x "$CARRY/ffmpeg7/bin/ffmpeg" ] || die "no $CARRY/ffmpeg7/bin/ffmpeg (the reference's decoder): run scripts/bench/prepare_carry.sh again"
  ffprobe -version | head -1
  command -v ffmpeg
  $(lerobot_cmd) -c "import lerobot, transformers, diffusers, torchcodec, av, torch; print('lerobot', lerobot.__version__ if hasattr(lerobot, '__version__') else '0.6.1', 'transformers', transformers.__version__, 'diffusers', diffusers.__version__, 'torchcodec', torchcodec.__version__, 'av', av.__version__, 'ffmpeg', av.ffmpeg_version_info, 'torch', torch.__version__)" \
    || die "the lerobot environment does not import"
  # The build and the exports run in the background, beside the data (they need none of it)
  local build_pid="" export_pid=""
  if [ "$DRY" != 1 ]; then
    stamp "build loongforge-train (in the background; \$OUT/build.log)"
    bash scripts/dev/gpu/build.sh loongforge-train loongforge > "$WORK/build.out" 2>&1 &
    build_pid=$!
  fi
  if [[ " $RUNS " == *" ref-"* ]] || [[ " $RUNS " == *" lf"* ]]; then
    stamp "exports of $MODELS ($FTS fine-tuning) for our trainers (in the background)"
    ( for model in $MODELS; do for ft in $FTS; do export_file "$model" "$ft" || exit 1; done; done ) \
      > "$WORK/export.log" 2>&1 &
    export_pid=$!
  fi
  if [[ " $RUNS " == *" lerobot "* ]]; then
    stamp "Qwen3-VL processor files for nvidia/Cosmos-Reason2-2B in an offline HF cache"
    "$PY" -c "import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], 'wb'))" \
      "$CARRY/qwen.tiktoken.xz" "$WORK/qwen.tiktoken"
    $(lerobot_cmd) scripts/bench/lerobot_side.py assets --tiktoken "$WORK/qwen.tiktoken" --hf-home "$WORK/hf-home" \
      2>&1 | grep -v "Flax classes"
    [ "${PIPESTATUS[0]}" = 0 ] || die "assets failed (above)"
  fi
  for codec in $CODECS; do
    local d=$WORK/data/$codec
    stamp "data $codec: $EPISODES episodes"
    rm -rf "$d" && mkdir -p "$d"
    $(lerobot_cmd) scripts/bench/make_dataset.py replicate --src "$CARRY/data" --codec "$codec" \
      --episodes "$EPISODES" --out "$d/lerobot" || die "replicate failed"
    # LeRobot's own converter, its video files sized to hold about V30_FILE_S seconds each (make_dataset.py
    # says why: LeRobot's float32 timestamp check fails past 1024 s into a file); it prints the longest
    $(lerobot_cmd) scripts/bench/make_dataset.py v30 --root "$d/lerobot" --max-file-s "$V30_FILE_S" 2>&1 |
      grep -v "it/s\]$\|Flax classes" | tail -3
    [ "${PIPESTATUS[0]}" = 0 ] || die "v3.0 conversion failed (above)"
    grep -q '"v3.0"' "$d/lerobot/meta/info.json" || die "v3.0 conversion failed: $d/lerobot/meta/info.json"
    # LeRobotDataset reads the last frames of every file, where a timestamp error would show
    $(lerobot_cmd) scripts/bench/make_dataset.py check-v30 --root "$d/lerobot" 2>&1 | grep -v "Flax classes" | tail -3
    [ "${PIPESTATUS[0]}" = 0 ] || die "LeRobotDataset cannot read the $codec v3.0 dataset (above)"
    PYTHONPATH=scripts "$PY" scripts/convert_lerobot.py --quiet --jobs "$(nproc)" "$d/lerobot_old" "$d/lf" 2>&1 | tail -2
    [ "${PIPESTATUS[0]}" = 0 ] || die "convert_lerobot failed (above)"
    PYTHONPATH=scripts/reference "$PY" scripts/bench/make_dataset.py check-ref --lf "$d/lf" 2>&1 | tail -2
    [ "${PIPESTATUS[0]}" = 0 ] || die "the reference trainer's decoder cannot read the $codec videos (above)"
    du -sh "$d/lerobot" "$d/lerobot_old" "$d/lf" | tr '\n' ' '; echo
  done
  [[ " $RUNS " == *" lerobot "* ]] && lerobot_base
  if [ -n "$export_pid" ]; then
    wait "$export_pid"; local rc=$?
    grep -v "^\s*$" "$WORK/export.log" | tail -4
    [ $rc = 0 ] || die "export failed ($WORK/export.log, above)"
  fi
  if [ -n "$build_pid" ]; then
    wait "$build_pid" || { cat "$WORK/build.out"; die "build failed (\$OUT/build.log)"; }
    stamp "build done"
  fi
  [ -x "$LFBIN" ] || die "no $LFBIN"
  df -h "$WORK" | tail -1
  touch "$WORK/.prep-done"
  part_done prep $(( $(date +%s) - t_prep ))
}
LEROBOT_BASE=$WORK/lerobot-base$([ "$DRY" = 1 ] && echo -tiny)
lerobot_base() {  # LeRobot's random-init GR00T N1.7 base checkpoint, once per machine (GR00T N1.7 models only)
  local model n17=0; for model in $MODELS; do [[ $model == gr00t-n1.7-* ]] && n17=1; done
  [ $n17 = 1 ] && [ ! -f "$LEROBOT_BASE/config.json" ] || return 0
  stamp "lerobot: random-init GR00T N1.7 base checkpoint (lerobot's GR00TN17) -> $LEROBOT_BASE"
  $(lerobot_cmd) scripts/bench/lerobot_side.py init-model --out "$LEROBOT_BASE" $([ "$DRY" = 1 ] && echo --tiny) \
    2>&1 | grep -v "Flax classes\|Writing model shards"
  [ "${PIPESTATUS[0]}" = 0 ] && [ -f "$LEROBOT_BASE/config.json" ] || die "init-model failed (above)"
}
need_prep() {  # prep again on a cold machine, or when a codec (CODECS) or the Qwen files are missing
  local ok=1 c
  [ -f "$WORK/.prep-done" ] && [ -x "$LFBIN" ] || ok=0
  for c in $CODECS; do
    [ -f "$WORK/data/$c/lf/loongforge_dataset.json" ] && [ -f "$WORK/data/$c/lerobot/meta/info.json" ] || ok=0
  done
  [[ " $RUNS " != *" lerobot "* ]] || [ -f "$WORK/hf-home/hub/models--nvidia--Cosmos-Reason2-2B/refs/main" ] || ok=0
  [ $ok = 1 ] || prep
}

model_file() { if [ "$DRY" = 1 ]; then echo "$MODELDIR/$1.$2.tiny.pt"; else echo "$MODELDIR/$1.$2.pt"; fi; }
export_file() {  # export_file MODEL FT: the TorchScript export our trainers load, unless it exists (status 1 on failure)
  local f cfg sets xs=() kv; f=$(model_file "$1" "$2"); cfg=$(our_config "$1"); sets=$(model_sets "$1" "$2")
  [ -f "$f" ] && return 0
  echo "== export $cfg ($2 fine-tuning; --set $sets) -> $f"
  for kv in $sets; do xs+=(--set "$kv"); done
  PYTHONPATH=scripts "$PY" scripts/model/export.py --config "$cfg" "${xs[@]}" --out "${f%.pt}.partial.pt" | tail -2
  [ "${PIPESTATUS[0]}" = 0 ] && mv "${f%.pt}.partial.pt" "$f"
}
export_model() {  # export_model MODEL FT -> sets MODEL_FILE, MODEL_CONFIG, MODEL_SETS (exports it if missing)
  MODEL_CONFIG=$(our_config "$1"); MODEL_SETS=$(model_sets "$1" "$2"); MODEL_FILE=$(model_file "$1" "$2")
  if [ ! -f "$MODEL_FILE" ]; then
    stamp "export $MODEL_CONFIG"
    export_file "$1" "$2" || die "export failed (above)"
  fi
  OUR_SEQ=$(PYTHONPATH=scripts "$PY" -c "from model.config import get_config, apply_overrides
c = apply_overrides(get_config('$MODEL_CONFIG'), '$MODEL_SETS'.split()); print(c.vl_len())")
  IMAGE_TOKENS=$(PYTHONPATH=scripts "$PY" -c "from model.config import get_config; c = get_config('$MODEL_CONFIG'); print(c.num_views * c.tokens_per_view)")
}

# ------------------------------------------------------------------------------------------- (a)
part_lerobot() {
  [[ " $RUNS " == *" lerobot "* ]] || { echo "lerobot: not in RUNS ($RUNS)"; return 0; }
  local t_part; t_part=$(date +%s)
  need_prep
  lerobot_env
  lerobot_base
  local base=$LEROBOT_BASE
  for model in $MODELS; do
    [[ $model == gr00t-n1.7-* ]] || { echo "lerobot: no LeRobot policy for $model (GR00T N1.7 only)"; continue; }
    for ft in $FTS; do
      for codec in $CODECS; do
        local name=$model.$ft.$codec.lerobot B; B=$(batch_of "$ft")
        # FLOPs of LeRobot's run: gr00t-n1.7-3b is its architecture; the DRY run's tiny GR00TN17 has no config of ours
        MODEL_CONFIG=$([ "$DRY" = 1 ] || our_config "$model"); MODEL_SETS=$(model_sets "$model" "$ft")
        OUR_SEQ=$(PYTHONPATH=scripts "$PY" -c "from model.config import get_config; print(get_config('$(our_config "$model")').vl_len())")
        IMAGE_TOKENS=64   # LeRobot's 256 x 256 frames, patch 16, merge 2: 64 tokens per view
        local args=(--policy.type=groot "--policy.base_model_path=$base" --policy.push_to_hub=false
                    "--policy.device=$DEVICE" "--dataset.repo_id=local/picknplace-$codec"
                    "--dataset.root=$WORK/data/$codec/lerobot" "--batch_size=$B" "--steps=$MAX_STEPS"
                    --save_checkpoint=false "--output_dir=$RESULTS/.tmp-$name/out" --wandb.enable=false)
        [ "$ft" = full ] && args+=(--policy.tune_llm=true --policy.tune_visual=true)
        [ -n "$LR_WORKERS" ] && args+=("--num_workers=$LR_WORKERS")
        SKIP_STEPS="" run_measured "$name" lerobot "$model" "$ft" "$codec" "$B" "$RESULTS/.tmp-$name/metrics.jsonl" \
          "$WORK/data/$codec/lerobot $base" -- $(lerobot_cmd) scripts/bench/lerobot_side.py train \
          --metrics "$RESULTS/.tmp-$name/metrics.jsonl" -- "${args[@]}"
        rm -rf "$RESULTS/$name/out"
      done
    done
  done
  part_done lerobot $(( $(date +%s) - t_part ))
}

# ------------------------------------------------------------------------------------------- (b), (c)
common_sets() {  # common_sets MODEL FT NAME -> the trainers' --set list (both read the same config)
  local B; B=$(batch_of "$2")
  local H; H=$(horizon "$(our_config "$1")")
  echo "--config configs/bench/headline.yaml --set model.path=$MODEL_FILE --set data.path=$WORK/data/$CODEC/lf
        --set trainer.micro_batch_size=$B --set trainer.max_steps=$MAX_STEPS --set data.action_horizon=$H
        --set run.device=$DEVICE --set run.output_dir=$RESULTS --set run.name=$3
        --set checkpoint.dir=$CKPT/$3"
}

part_ref() {
  local t_part; t_part=$(date +%s)
  need_prep
  for model in $MODELS; do for ft in $FTS; do
    export_model "$model" "$ft"
    for codec in $CODECS; do
      CODEC=$codec
      for run in $RUNS; do
        case $run in ref-base) mode=baseline ;; ref-opt) mode=optimized ;; *) continue ;; esac
        local name=$model.$ft.$codec.$run
        # shellcheck disable=SC2046
        SKIP_STEPS="" run_measured "$name" "$run" "$model" "$ft" "$codec" "$(batch_of "$ft")" \
          "$RESULTS/.tmp-$name/run/metrics.jsonl" "$WORK/data/$codec/lf $MODEL_FILE" -- \
          env PYTHONPATH=scripts "$PY" scripts/bench/ref_phases.py --phases "$RESULTS/.tmp-$name/phases.jsonl" -- \
          $(common_sets "$model" "$ft" "$name") --set control.enable=false --mode $mode \
          --loongforge-train "$LFBIN" --out "$RESULTS/.tmp-$name/run"
        [ -d "$RESULTS/$name/run" ] && mv "$RESULTS/$name/run/summary.json" "$RESULTS/$name/" 2>/dev/null
        rm -rf "$RESULTS/$name/run"
      done
    done
  done; done
  part_done ref $(( $(date +%s) - t_part ))
}

lf_profile() {  # AFTER_LAUNCH hook of the lf run: one profile-step window from step PROF_AT
  local pid=$1 sock=/tmp/lf-bench/$LF_NAME.sock
  ( for _ in $(seq 900); do [ -S "$sock" ] && break; kill -0 "$pid" 2>/dev/null || exit 0; sleep 0.2; done
    for _ in $(seq 600); do
      kill -0 "$pid" 2>/dev/null || exit 0
      n=$(grep -c . "$RESULTS/$LF_NAME/metrics.jsonl" 2>/dev/null)
      [ "${n:-0}" -ge "$PROF_AT" ] && break; sleep 0.5
    done
    "$LFCLI" profile-step --socket "$sock" --duration 1 --max-steps "$PROF_STEPS" --output "$RESULTS/.tmp-$LF_NAME/profile.json" \
      > "$RESULTS/.tmp-$LF_NAME/profile.log" 2>&1 ) &
}

part_lf() {
  local t_part; t_part=$(date +%s)
  need_prep
  for model in $MODELS; do for ft in $FTS; do
    export_model "$model" "$ft"
    # The compiled step (trainer.compiled_step=auto, a default on the GPU) is prepared in the package cache
    # before the runs, as a user's first run or `--compile-only` would, so no run's window holds the compile;
    # its time is printed here (the cache keeps it across calls on a warm machine).
    if [[ " $RUNS " == *" lf"* ]] && [ "$DRY" != 1 ]; then
      CODEC=${CODECS%% *}
      stamp "the compiled step of $model ($ft) into the package cache: loongforge-train --compile-only"
      local t_compile; t_compile=$(date +%s)
      # shellcheck disable=SC2046
      "$LFBIN" $(common_sets "$model" "$ft" "compile-only") --compile-only 2>&1 | tail -3
      echo "compile-only: $(( $(date +%s) - t_compile )) s"
    fi
    for codec in $CODECS; do
      CODEC=$codec
      for run in $RUNS; do
        local sets=()
        case $run in
          lf) sets=() ;;
          lf-tuned) sets=(--set data.video_decode=span --set adfe.enable=true --set "adfe.decode_threads=$DECODE_THREADS") ;;
          lf-adfe) sets=(--set adfe.enable=true) ;;
          lf-gcts) sets=(--set gcts.enable=true) ;;
          lf-nographs) sets=(--set trainer.cuda_graphs=off) ;;
          *) continue ;;
        esac
        local name=$model.$ft.$codec.$run settings="${sets[*]}"
        # every lf run takes one profile-step window for its step split; report.py leaves its steps out
        LF_NAME=$name
        sets+=(--set "control.socket=/tmp/lf-bench/$name.sock")
        mkdir -p /tmp/lf-bench && chmod 700 /tmp/lf-bench   # the trainer refuses a socket folder others can reach
        rm -f "/tmp/lf-bench/$name.sock"   # left by an earlier run of this name that was killed
        rm -rf "$RESULTS/$name"
        # shellcheck disable=SC2046
        RUN_SETTINGS="$settings" \
        MON_EXTRA="--exclude-json $RESULTS/.tmp-$name/profile.json --exclude-max $((PROF_STEPS + 2))" \
        AFTER_LAUNCH=lf_profile SKIP_STEPS="" run_measured "$name" "$run" "$model" "$ft" "$codec" "$(batch_of "$ft")" \
          "$RESULTS/$name/metrics.jsonl" "$WORK/data/$codec/lf $MODEL_FILE" -- \
          "$LFBIN" $(common_sets "$model" "$ft" "$name") "${sets[@]}"
        rm -rf "${CKPT:?}/$name"
      done
    done
  done; done
  part_done lf $(( $(date +%s) - t_part ))
}

part_report() {
  local t_part; t_part=$(date +%s)
  stamp "report"
  PYTHONPATH=scripts "$PY" scripts/bench/report.py "$RESULTS" --out "$OUT" | tail -40
  part_done report $(( $(date +%s) - t_part ))
}

for p in $PARTS; do
  case $p in
    prep) prep ;;
    lerobot) part_lerobot ;;
    ref) part_ref ;;
    lf) part_lf ;;
    report) part_report ;;
    *) die "PART: unknown part '$p' (prep, lerobot, ref, lf, report, all)" ;;
  esac
done
finish
