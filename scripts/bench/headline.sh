#!/usr/bin/env bash
# The headline benchmark of issue #41: on one GPU, the same episodes, side by side,
#   (a) LeRobot 0.6.1's own GR00T trainer: lerobot-train (lerobot/scripts/lerobot_train.py, its main()
#       run unchanged under a timing shim: scripts/bench/lerobot_side.py) with --policy.type=groot, a
#       GR00T N1.7 base checkpoint random-initialised offline by lerobot's own GR00TN17, its dataset class
#       (LeRobotDataset, v3.0 made by LeRobot's own converter), its decoder (torchcodec), DataLoader
#       workers, bf16 autocast and AdamW/cosine presets; only the model is run (gr00t-n1.7-3b's architecture);
#   (b) scripts/reference/train_torch.py --mode baseline (ref-base) and --mode optimized (ref-opt);
#   (c) loongforge-train with its GPU defaults (lf), and with one engine changed each: adfe.enable=true
#       (lf-adfe), gcts.enable=true at one GPU (lf-gcts), trainer.cuda_graphs=off (lf-nographs); MLA and
#       DMF are not built (the report records the trainer's own refusal of mla.enable / dmf.enable).
#       Each lf run takes one `loongforge profile-step` window (PROF_STEPS steps from step PROF_AT) for its
#       step split; those steps are left out of its medians.
# Equal global batch (default fine-tuning: backbone frozen, micro-batch 32; FTS=full: everything trains,
# micro-batch 16), bf16 on the GPU, the trainable sets of upstream (docs/models.md). Report:
# scripts/bench/report.py (table, charts); how to run it: docs/bench-harness-draft.md.
#
#   [PART="prep lerobot ref lf report"] [MODELS=gr00t-n1.7-3b] [FTS=default] [CODECS=h264]
#   [RUNS="lerobot ref-opt lf"] [STEPS=100] [WARM=40] [EPISODES=600] [LR_WORKERS=] [DRY=1]
#   bash scripts/bench/headline.sh
#
# Defaults are the issue's headline rows: gr00t-n1.7-3b, default fine-tuning, h264, LeRobot's trainer
# against ref-opt and lf. The other runs are RUNS="ref-base lf-adfe lf-gcts lf-nographs" (one more call
# of PART="ref lf report", ~6 min), the other rows FTS=full, CODECS=av1, MODELS=gr00t-n1.6-3b / n16-1b.
# Estimated GPU time (H100, from docs/benchmarks.md figures; each PART is one device call of <= 10 min):
#   PART=prep     ~5 min  (wheels into a --target folder, build loongforge-train, 600 episodes x codec:
#                          replicate, LeRobot's v3.0 conversion, our shards)
#   PART=lerobot  ~3-4 min per (fine-tuning mode, codec): the 3B base checkpoint's init and save, its
#                          cold load, 100 steps
#   PART=ref      ~6 min per (model, mode, codec): export ~1.5 min, ref-opt ~4 (torch.compile ~164 s);
#                          ref-base ~1.5 more
#   PART=lf       ~1.5 min per run (first step ~22 s, a final checkpoint); PART=report seconds
# so the default matrix is ~16-17 min in four calls; FTS="default full", CODECS="h264 av1" or more
# MODELS multiply the lerobot/ref/lf parts: run them as separate calls (MODELS=gr00t-n1.6-3b PART=ref
# ...). LeRobot's trainer runs only for gr00t-n1.7-* models (it has no N1.6 or n16 policy).
# Every part writes its runs under $BENCH_WORK/results (kept on the machine between calls while it is
# warm) and leaves in $OUT at most 8 files: <part>.log, results.tar.gz (every run's metrics, monitor
# samples, launch record and log tail) and, for PART=report, headline.md/.json and two PNGs. A part
# whose inputs are missing (a cold machine) runs what it needs first (prep, the export).
# Cold reads: before every run the page cache is dropped (`echo 3 > /proc/sys/vm/drop_caches`); where
# that is refused, every file of the dataset is evicted with posix_fadvise(DONTNEED); launch.json and
# the table say which happened.
# DRY=1: the whole thing on this CPU machine with tiny sizes (gr00t-n1.7-tiny / gr00t-n1.6-tiny / n16-tiny
# exports, a tiny GR00T N1.7 base checkpoint for lerobot-train, 12 episodes, 4 steps of batch 2), Python 3.12
# from ~/.cache/loongforge/py312 (scripts/bench/setup_py312.sh), build/ for the trainer; the page cache is
# only evicted per file (fadvise), never dropped, on the shared machine.
# Carry (scripts/bench/prepare_carry.sh fills them): .bench-carry (wheels, FFmpeg 7 libraries + ffprobe,
# the Qwen BPE ranks, the distinct videos and parquet files) and .gpu-carry/ffmpeg (the trainer's build).
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
logname=$(echo "$PARTS" | tr ' ' '+')
exec > >(tee -a "$OUT/$logname.log") 2>&1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
t_start=$(date +%s)
stamp() { echo "== [$(( $(date +%s) - t_start ))s] $*"; }
die() { echo "headline.sh: $*" >&2; finish; exit 1; }

MODELS=${MODELS:-gr00t-n1.7-3b}
FTS=${FTS:-default}
CODECS=${CODECS:-h264}
# every run on the CPU dry run; on the GPU the headline rows (the others by RUNS=..., see above)
RUNS=${RUNS:-$([ "$DRY" = 1 ] && echo "lerobot ref-base ref-opt lf lf-adfe lf-gcts lf-nographs" || echo "lerobot ref-opt lf")}
EPISODES=${EPISODES:-600}
STEPS=${STEPS:-100}
WARM=${WARM:-40}
PROF_AT=${PROF_AT:-60}        # lf: one `loongforge profile-step` window from this step (excluded from the medians)
PROF_STEPS=${PROF_STEPS:-5}   # ... of at most this many steps (and at most 1 s)
LR_WORKERS=${LR_WORKERS:-}    # empty: lerobot-train's default (--num_workers 4)
RUN_TIMEOUT=${RUN_TIMEOUT:-480}   # seconds one run may take (a hung run must not eat the device call)
if [ "$DRY" = 1 ]; then
  EPISODES=${DRY_EPISODES:-12}; STEPS=${DRY_STEPS:-6}; WARM=1; PROF_AT=2; PROF_STEPS=1
  PY=${PY:-$(cat build/python-path 2>/dev/null || echo "$HOME/.cache/loongforge/venv/bin/python")}
  LPY=${LPY:-$HOME/.cache/loongforge/py312/bin/python}
  LFBUILD=${LF_BUILD:-build}
  DEVICE=cpu
else
  PY=${PY:-python3}; LPY=${LPY:-python3}; LFBUILD=build-gpu; DEVICE=cuda
fi
LFBIN=$LFBUILD/src/daemon/loongforge-train
LFCLI=$LFBUILD/cli/loongforge
LSITE=$WORK/lerobot-site
CKPT=${CKPT_DIR:-$([ "$DRY" = 1 ] && echo "$WORK/ckpt" || echo /dev/shm/bench-ckpt)}
# Exports on disk beside the data (read cold, as LeRobot's base checkpoint is); a 3B export is 12.6 GB:
# MODEL_DIR=/dev/shm/bench-models where the 64 GB disk runs short (then they are read from memory).
MODELDIR=${MODEL_DIR:-$WORK/models}
mkdir -p "$MODELDIR"

finish() {  # $OUT: the part's log (tee'd already) and every run so far, small files only
  tar -C "$WORK" -czf "$OUT/results.tar.gz" --exclude='*/out' --exclude='*/checkpoints' --exclude='*.pt' \
    --exclude='*.trace.json' \
    results 2>/dev/null
  stamp "done: $PARTS ($(du -sh "$OUT/results.tar.gz" 2>/dev/null | cut -f1) of results in \$OUT)"
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

# run_measured NAME TRAINER MODEL FT CODEC BATCH METRICS_FILE DATA_DIR -- command...
# Drops the cache, starts the command and scripts/bench/monitor.py beside it, writes launch.json.
run_measured() {
  local name=$1 trainer=$2 model=$3 ft=$4 codec=$5 batch=$6 metrics=$7 data=$8; shift 9
  local tmp=$RESULTS/.tmp-$name R=$RESULTS/$name
  rm -rf "$R" "$tmp"; mkdir -p "$tmp"
  local cache; cache=$(drop_cache $data | tail -1)   # $data: the dataset and the model file(s), unquoted
  stamp "$name: $cache"
  local idle; idle=$(idle_gpu_mb)
  local t0; t0=$(date +%s.%N)
  timeout --signal=TERM --kill-after=30 "$RUN_TIMEOUT" "$@" > "$tmp/run.log" 2>&1 &
  local pid=$!
  "$LPY" scripts/bench/monitor.py --pid $pid --metrics "$metrics" --out "$tmp/monitor.jsonl" &
  local mpid=$!
  [ -n "${AFTER_LAUNCH:-}" ] && $AFTER_LAUNCH $pid
  wait $pid; local rc=$?
  wait $mpid
  local t1; t1=$(date +%s.%N)
  mkdir -p "$R"
  [ "$metrics" != "$R/metrics.jsonl" ] && cp "$metrics" "$R/metrics.jsonl" 2>/dev/null
  mv "$tmp"/* "$R/" && rmdir "$tmp"
  "$PY" - "$R/launch.json" <<PY
import json, sys
json.dump({"name": "$name", "trainer": "$trainer", "model": "$model", "ft": "$ft", "codec": "$codec",
           "batch": $batch, "exit": $rc, "launch_t": $t0, "end_t": $t1, "warm": $WARM,
           "skip_steps": [int(x) for x in "${SKIP_STEPS:-}".split()] or [], "cache_drop": """$cache""",
           "gpu": """$(gpu_name)""", "idle_gpu_mem_mb": float("${idle:-0}" or 0),
           "model_config": "${MODEL_CONFIG:-}", "model_sets": "${MODEL_SETS:-}".split(),
           "our_seq_len": ${OUR_SEQ:-0}, "image_tokens": ${IMAGE_TOKENS:-64},
           "command": """$(printf '%q ' "$@" | cut -c1-3000)"""}, open(sys.argv[1], "w"), indent=1)
PY
  tail -3 "$R/run.log" | cut -c1-300
  stamp "$name: exit $rc, $(cat "$R/metrics.jsonl" 2>/dev/null | grep -c .) steps"
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
  stamp "prep: $([ "$DRY" = 1 ] && echo "DRY (CPU)" || gpu_name), $(nproc) cores, models $MODELS, codecs $CODECS"
  [ -d "$CARRY" ] || die "no $CARRY: run scripts/bench/prepare_carry.sh on the CPU machine and carry it"
  lerobot_env
  export PATH="$CARRY/ffmpeg7/bin:$PATH"   # ffprobe for scripts/convert_lerobot.py
  ffprobe -version | head -1
  $(lerobot_cmd) -c "import lerobot, transformers, diffusers, torchcodec, av, torch; print('lerobot', lerobot.__version__ if hasattr(lerobot, '__version__') else '0.6.1', 'transformers', transformers.__version__, 'diffusers', diffusers.__version__, 'torchcodec', torchcodec.__version__, 'av', av.__version__, 'ffmpeg', av.ffmpeg_version_info, 'torch', torch.__version__)" \
    || die "the lerobot environment does not import"
  if [ "$DRY" != 1 ]; then
    stamp "build loongforge-train"
    bash scripts/dev/gpu/build.sh loongforge-train loongforge || die "build failed (\$OUT/build.log)"
  fi
  [ -x "$LFBIN" ] || die "no $LFBIN"
  for e in mla dmf; do "$LFBIN" --config configs/n16-tiny.yaml --set $e.enable=true --print-config 2>&1 |
    grep -m1 "not in this build" ; done > "$RESULTS/unbuilt_engines.txt"
  cat "$RESULTS/unbuilt_engines.txt"
  if [[ " $RUNS " == *" lerobot "* ]]; then
    stamp "Qwen3-VL processor files for nvidia/Cosmos-Reason2-2B in an offline HF cache"
    "$PY" -c "import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], 'wb'))" \
      "$CARRY/qwen.tiktoken.xz" "$WORK/qwen.tiktoken"
    $(lerobot_cmd) scripts/bench/lerobot_side.py assets --tiktoken "$WORK/qwen.tiktoken" --hf-home "$WORK/hf-home" \
      || die "assets failed"
  fi
  for codec in $CODECS; do
    local d=$WORK/data/$codec
    stamp "data $codec: $EPISODES episodes"
    rm -rf "$d" && mkdir -p "$d"
    $(lerobot_cmd) scripts/bench/make_dataset.py replicate --src "$CARRY/data" --codec "$codec" \
      --episodes "$EPISODES" --out "$d/lerobot" || die "replicate failed"
    $(lerobot_cmd) scripts/bench/make_dataset.py v30 --root "$d/lerobot" 2>&1 | grep -v "it/s\]$" | tail -3
    [ -f "$d/lerobot/meta/info.json" ] && grep -q '"v3.0"' "$d/lerobot/meta/info.json" || die "v3.0 conversion failed"
    PYTHONPATH=scripts "$PY" scripts/convert_lerobot.py --quiet --jobs "$(nproc)" "$d/lerobot_old" "$d/lf" | tail -2 \
      || die "convert_lerobot failed"
    du -sh "$d/lerobot" "$d/lerobot_old" "$d/lf" | tr '\n' ' '; echo
  done
  df -h "$WORK" | tail -1
  touch "$WORK/.prep-done"
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

export_model() {  # export_model MODEL FT -> sets MODEL_FILE, MODEL_CONFIG, MODEL_SETS
  MODEL_CONFIG=$(our_config "$1"); MODEL_SETS=$(model_sets "$1" "$2")
  MODEL_FILE=$MODELDIR/$1.$2.pt
  [ "$DRY" = 1 ] && MODEL_FILE=$MODELDIR/$1.$2.tiny.pt
  if [ ! -f "$MODEL_FILE" ]; then
    stamp "export $MODEL_CONFIG ($2 fine-tuning; --set $MODEL_SETS)"
    local xs=(); for kv in $MODEL_SETS; do xs+=(--set "$kv"); done
    PYTHONPATH=scripts "$PY" scripts/model/export.py --config "$MODEL_CONFIG" "${xs[@]}" --out "$MODEL_FILE" | tail -2 \
      || die "export failed"
  fi
  OUR_SEQ=$(PYTHONPATH=scripts "$PY" -c "from model.config import get_config, apply_overrides
c = apply_overrides(get_config('$MODEL_CONFIG'), '$MODEL_SETS'.split()); print(c.vl_len())")
  IMAGE_TOKENS=$(PYTHONPATH=scripts "$PY" -c "from model.config import get_config; c = get_config('$MODEL_CONFIG'); print(c.num_views * c.tokens_per_view)")
}

# ------------------------------------------------------------------------------------------- (a)
part_lerobot() {
  need_prep
  lerobot_env
  local base=$WORK/lerobot-base$([ "$DRY" = 1 ] && echo -tiny)
  for model in $MODELS; do
    [[ $model == gr00t-n1.7-* ]] || { echo "lerobot: no LeRobot policy for $model (GR00T N1.7 only)"; continue; }
    if [ ! -f "$base/config.json" ]; then
      stamp "lerobot: random-init GR00T N1.7 base checkpoint (lerobot's GR00TN17) -> $base"
      $(lerobot_cmd) scripts/bench/lerobot_side.py init-model --out "$base" $([ "$DRY" = 1 ] && echo --tiny) \
        || die "init-model failed"
    fi
    for ft in $FTS; do
      for codec in $CODECS; do
        local name=$model.$ft.$codec.lerobot B; B=$(batch_of "$ft")
        # FLOPs of LeRobot's run: gr00t-n1.7-3b is its architecture; the DRY run's tiny GR00TN17 has no config of ours
        MODEL_CONFIG=$([ "$DRY" = 1 ] || our_config "$model"); MODEL_SETS=$(model_sets "$model" "$ft")
        OUR_SEQ=$(PYTHONPATH=scripts "$PY" -c "from model.config import get_config; print(get_config('$(our_config "$model")').vl_len())")
        IMAGE_TOKENS=64   # LeRobot's 256 x 256 frames, patch 16, merge 2: 64 tokens per view
        local args=(--policy.type=groot "--policy.base_model_path=$base" --policy.push_to_hub=false
                    "--policy.device=$DEVICE" "--dataset.repo_id=local/picknplace-$codec"
                    "--dataset.root=$WORK/data/$codec/lerobot" "--batch_size=$B" "--steps=$STEPS"
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
}

# ------------------------------------------------------------------------------------------- (b), (c)
common_sets() {  # common_sets MODEL FT NAME -> the trainers' --set list (both read the same config)
  local B; B=$(batch_of "$2")
  local H; H=$(horizon "$(our_config "$1")")
  echo "--config configs/bench/headline.yaml --set model.path=$MODEL_FILE --set data.path=$WORK/data/$CODEC/lf
        --set trainer.micro_batch_size=$B --set trainer.max_steps=$STEPS --set data.action_horizon=$H
        --set run.device=$DEVICE --set run.output_dir=$RESULTS --set run.name=$3
        --set checkpoint.dir=$CKPT/$3"
}

part_ref() {
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
  need_prep
  for model in $MODELS; do for ft in $FTS; do
    export_model "$model" "$ft"
    for codec in $CODECS; do
      CODEC=$codec
      for run in $RUNS; do
        local sets=()
        case $run in
          lf) sets=() ;;
          lf-adfe) sets=(--set adfe.enable=true) ;;
          lf-gcts) sets=(--set gcts.enable=true) ;;
          lf-nographs) sets=(--set trainer.cuda_graphs=off) ;;
          *) continue ;;
        esac
        local name=$model.$ft.$codec.$run
        # every lf run takes one profile-step window for its step split; report.py leaves its steps out
        LF_NAME=$name
        sets+=(--set "control.socket=/tmp/lf-bench/$name.sock")
        mkdir -p /tmp/lf-bench && chmod 700 /tmp/lf-bench   # the trainer refuses a socket folder others can reach
        rm -rf "$RESULTS/$name"
        # shellcheck disable=SC2046
        AFTER_LAUNCH=lf_profile SKIP_STEPS="" run_measured "$name" "$run" "$model" "$ft" "$codec" "$(batch_of "$ft")" \
          "$RESULTS/$name/metrics.jsonl" "$WORK/data/$codec/lf $MODEL_FILE" -- \
          "$LFBIN" $(common_sets "$model" "$ft" "$name") "${sets[@]}"
        rm -rf "${CKPT:?}/$name"
      done
    done
  done; done
}

part_report() {
  stamp "report"
  PYTHONPATH=scripts "$PY" scripts/bench/report.py "$RESULTS" --out "$OUT" | tail -40
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
