#!/usr/bin/env bash
# Issue #11 on an H200: the model's fast layer forms (fused RMSNorm, causal flash
# attention with GQA in the LM, one SiLU of the timestep embedding for every AdaLN,
# RoPE with one cast fewer) against the model code of another commit
# (.gpu-carry/model-before: BEFORE=<commit> bash scripts/dev/gpu/prepare_carry.sh):
#   1. build (scripts/dev/gpu/build.sh), export n16-1b with both model codes;
#   2. train: the runs of TRAIN_RUNS (see the case below; ref-opt is the reference
#      trainer's optimized mode: torch.compile + CUDA graphs, fused AdamW), STEPS steps
#      each (default 150), same model file and data; with PROFILE=1 (default) each
#      loongforge-train run also gets `profile-step --kernels` at step 60;
#   3. scripts/dev/gpu/profile_model.py --script-only on both files: forward+backward of
#      the TorchScript module (eager launches and one CUDA graph), top kernels;
#   4. scripts/dev/gpu/bench_ops.py: candidate ops alone at n16-1b shapes (SECTIONS=ops);
#   5. ctest -L gpu -LE long, then the long GPU tests while time is left;
#   compiled (first when picked): the AOTInductor package of n16-1b's micro-step
#      (scripts/compile_step.py), taken from .gpu-carry/n16-1b-step.pt2 when there
#      (copy a returned one there; loongforge-train refuses one that does not match),
#      else compiled (minutes) and returned as $OUT/n16-1b-step.pt2; the train
#      section's lf-compiled* runs need it.
# Sections get what is left of a BUDGET s budget (default 570: one device call is 600 s at
# most; a loongforge-train run gets at most RUN_LIMIT s, default 150);
# the main log is $OUT/issue11_step.log, every other log and metrics file is in
# $OUT/logs-TAG.tgz (rewritten after each section: a call returns at most 8 files).
# SECTIONS (default "train profile tests") picks sections: compiled train profile ops catlin tests;
# TRAIN_RUNS the runs of section train (default: all but lf-graphs-before and ref-base);
# FIRST_TESTS a ctest regex run first in section tests (any label); GPU_TEST_LIMIT the
# seconds for ctest -L gpu -LE long (default 120).
# MODEL (default n16-1b) the config exported, EXPORT_SET its export overrides (space separated
# key=value, e.g. "tune_visual=true tune_llm=true" for full fine-tuning), TAG the name of its model
# file and package (default MODEL), MB the micro-batch (default 32), ACCUM the gradient accumulation
# of the loongforge-train runs (default 1). A returned package over 15 MiB comes back in parts
# ($OUT/TAG-step.pt2.partNN, `cat` them in order into .gpu-carry/TAG-step.pt2).
# GROUPED=1 also exports TAG-grouped (category_linear=grouped: loongforge::category_linear) for the
# runs named *-grouped; COMPILE_WHICH=grouped compiles (or takes from .gpu-carry) its package
# TAG-grouped-step.pt2 instead of TAG-step.pt2. EXTRA_EXPORTS ("tag=config[:k=v,k=v] ...") exports
# more model files to /dev/shm beside the build (a later invocation in the same call finds them;
# an existing /dev/shm/TAG.pt is not exported again). Section catlin: scripts/dev/gpu/bench_category_linear.py.
# GPU_TESTS=first: section tests runs only FIRST_TESTS. BUILD=0 skips scripts/dev/gpu/build.sh. PROFILE_LIMIT: seconds
# for profile_model.py per model file (default 60). FINAL_KILL=1: see train_lf. LF_COMPILED_STEP: the
# trainer.compiled_step of every loongforge-train run (default off: the TorchScript step; the lf-compiled* runs
# name their package, lf-default takes auto, the product default, from COMPILE_CACHE, default /tmp/lf-cache).
source "$(dirname "${BASH_SOURCE[0]}")/common.sh" issue11_step
steps=${STEPS:-150}
sections=${SECTIONS:-train profile tests}
want() { [[ " $sections " == *" $1 "* ]]; }
left() { local l=$(( ${BUDGET:-570} - ($(date +%s) - t0) )); [ $l -lt 1 ] && l=1; [ $l -lt $1 ] && echo $l || echo $1; }  # min(limit, time left)
cfg=configs/bench/n16-1b-h200.yaml
model=${MODEL:-n16-1b}; tag=${TAG:-$model}; mb=${MB:-32}; accum=${ACCUM:-1}
mfile=/dev/shm/$tag.pt
export_set=(); for kv in ${EXPORT_SET:-}; do export_set+=(--set "$kv"); done
# Logs and runs per TAG; kept across invocations of one call (a later invocation with the same TAG
# adds to the same logs-TAG.tgz instead of wiping the earlier one's logs).
logs=/tmp/lf-logs-$tag; mkdir -p $logs
runs=/tmp/runs-$tag
pack() { tar -czf "$OUT/logs-$tag.tgz" -C $logs . 2>/dev/null; }

stamp "environment"; nvidia-smi --query-gpu=name,memory.total,clocks.sm --format=csv,noheader
stamp "build, and export $model ${EXPORT_SET:-} as $tag beside it (this commit, and the model code of .gpu-carry/model-before)"
# export_model TAG CONFIG [k=v ...]: /dev/shm/TAG.pt unless there (log $logs/export-TAG.log)
export_model() {
  local t=$1 c=$2; shift 2
  [ -f /dev/shm/$t.pt ] && { echo "export $t: /dev/shm/$t.pt is there"; return 0; }
  local sets=(); for kv in "$@"; do sets+=(--set "$kv"); done
  PYTHONPATH=scripts python3 scripts/model/export.py --config $c ${sets[@]+"${sets[@]}"} --out /dev/shm/$t.pt.tmp \
    > "$logs/export-$t.log" 2>&1 && mv /dev/shm/$t.pt.tmp /dev/shm/$t.pt && tail -1 "$logs/export-$t.log"
}
pkg=/dev/shm/$tag-step.pt2; pkg_grouped=/dev/shm/$tag-grouped-step.pt2
ctag=$tag; cfile=$mfile
[ "${COMPILE_WHICH:-gather}" = grouped ] && { ctag=$tag-grouped; cfile=/dev/shm/$tag-grouped.pt; pkg=$pkg_grouped; }
# compile_pkg: scripts/compile_step.py of $cfile into $pkg (log $logs/compile_step.log, Python stacks every
# 60 s in it), returned in $OUT (in parts over 15 MiB). COMPILE_ENV: variables for it (e.g.
# AOT_INDUCTOR_COMPILE_WRAPPER_OPT_LEVEL=O0). COMPILE_ARGS: more arguments for compile_step.py (--bf16-weights FILE).
compile_pkg() {
  env ${COMPILE_ENV:-} PYTHONPATH=scripts timeout $(left ${COMPILE_LIMIT:-330}) python3 scripts/compile_step.py $cfile \
    --batch-size $mb --action-horizon ${HORIZON:-16} --device cuda --precision bf16 --out $pkg --stacks-every 60 \
    ${COMPILE_ARGS:-} > "$logs/compile_step.log" 2>&1
  echo "compile_step: exit $?"
  grep -E "^(traced|exported|compiled)" "$logs/compile_step.log"; ls -l $pkg 2>/dev/null
  if [ -f $pkg ] && [ $(stat -c %s $pkg) -le $((15 << 20)) ]; then cp $pkg "$OUT/$ctag-step.pt2"
  elif [ -f $pkg ]; then split -b 15M -d $pkg "$OUT/$ctag-step.pt2.part"; fi
}
export_pids=()
# BG_COMPILE=1 (section compiled, gather form, no carried package): the compile starts once the model
# file is exported, beside the build, so its trace (which runs the step on the GPU) is over before the
# trainers start.
early_compile=0
if want compiled && [ "${BG_COMPILE:-0}" = 1 ] && [ "$ctag" = "$tag" ] && [ ! -f .gpu-carry/$ctag-step.pt2 ]; then
  early_compile=1
fi
if [ $early_compile = 1 ]; then
  (export_model $tag $model ${EXPORT_SET:-} && compile_pkg) & compile_pid=$!
else
  export_model $tag $model ${EXPORT_SET:-} & export_pids+=($!)
fi
for spec in ${EXTRA_EXPORTS:-}; do
  t=${spec%%=*}; rest=${spec#*=}; c=${rest%%:*}; kvs=""; [[ $rest == *:* ]] && kvs=${rest#*:}
  export_model $t $c ${kvs//,/ } & export_pids+=($!)
done
if [ "${BUILD:-1}" = 1 ]; then bash scripts/dev/gpu/build.sh || exit 1; fi  # BUILD=0: build-gpu/ as it is
export_failed=0
for p in ${export_pids[@]+"${export_pids[@]}"}; do wait $p || export_failed=1; done
if [ $early_compile = 1 ]; then  # the export runs inside the compile's job: wait for the file only
  while [ ! -f $mfile ] && kill -0 $compile_pid 2>/dev/null; do sleep 2; done
fi
# The grouped model file calls loongforge:: operators: exported after the build made libloongforge_ops.so.
export LOONGFORGE_OPS_LIBRARY=$PWD/build-gpu/src/ops/libloongforge_ops.so
if [ "${GROUPED:-0}" = 1 ]; then export_model $tag-grouped $model ${EXPORT_SET:-} category_linear=grouped || export_failed=1; fi
if [ $export_failed = 1 ]; then
  for f in "$logs"/export-*.log; do echo "-- $f"; tail -n 5 "$f"; done
  [ -f $mfile ] || exit 1  # this invocation's own model file is needed; a failed extra one is reported above
fi
stamp "built and exported"
before=""
if [ -f .gpu-carry/model-before/model/export.py ]; then
  python3 .gpu-carry/model-before/model/export.py --config $model ${export_set[@]+"${export_set[@]}"} \
    --out /dev/shm/$tag-before.pt | tail -1 && before=/dev/shm/$tag-before.pt
  echo "before: $(cat .gpu-carry/model-before/COMMIT 2>/dev/null)"
fi

# train_lf NAME MODEL-FILE [--set k=v ...]: one loongforge-train run; with PROFILE=1 also
# `loongforge profile-step --kernels` over the 10 steps after step PROFILE_AT (default 60;
# steps PROFILE_AT-5 .. PROFILE_AT+15 are left out of the steady state).
skips=()
train_lf() {
  local name=$1 file=$2; shift 2
  local sock=/tmp/lf-ctl/$name.sock
  rm -rf $runs/$name  # else the trainer would write to $runs/$name-2 and the metrics below be another run's
  timeout $(left ${RUN_LIMIT:-150}) build-gpu/src/daemon/loongforge-train --config $cfg --set model.path=$file \
    --set trainer.max_steps=$steps --set trainer.micro_batch_size=$mb \
    --set trainer.gradient_accumulation_steps=$accum --set run.output_dir=$runs --set run.name=$name --set logging.progress=lines \
    --set logging.interval_steps=50 --set control.socket=$sock --set trainer.compiled_step=${LF_COMPILED_STEP:-off} \
    "$@" > "$logs/$name.log" 2>&1 &
  local pid=$!
  local at=${PROFILE_AT:-60}
  if [ "${PROFILE:-1}" = 1 ] && wait_for_step $sock $at $pid; then
    build-gpu/cli/loongforge profile-step --socket $sock --duration 30 --max-steps 10 --kernels \
      --output "$logs/$name-profile.json" 2>&1 | tail -12
    build-gpu/cli/loongforge status --socket $sock --json > "$logs/$name-status.json" 2>/dev/null
    python3 -c 'import json,sys; s=json.load(open(sys.argv[1])); print("status:", {k: s.get(k) for k in ("step_runner", "optimizer_graph")})' \
      "$logs/$name-status.json" 2>/dev/null
    skips+=("$name:$((at - 5))-$((at + 15))")
  fi
  # FINAL_KILL=1: once the last step is done the trainer is killed, so a big model's final checkpoint
  # (37 GB for n16-3b full fine-tuning, 144 s) does not spend the call; the run's metrics are written by then.
  if [ "${FINAL_KILL:-0}" = 1 ] && wait_for_step $sock $steps $pid; then
    sleep 2; pkill -KILL -P $pid; kill -KILL $pid 2>/dev/null  # $pid is timeout's: the trainer is its child
    echo "$name: killed after step $step (FINAL_KILL=1)"
  fi
  wait $pid; echo "$name: exit $?"
  # A killed trainer's device memory is released by the driver after the process is gone: the next run
  # waits for it (else it can fail to load its model: out of memory, as on 2026-12-02).
  for _ in $(seq 60); do [ -z "$(nvidia-smi --query-compute-apps=pid --format=csv,noheader 2>/dev/null)" ] && break; sleep 1; done
  grep -E "compiled step|captured|error|Error" "$logs/$name.log" | head -5
  cp $runs/$name/metrics.jsonl "$logs/${name}_metrics.jsonl" 2>/dev/null; pack
}
ran=""
if want compiled; then
  stamp "compiled: the AOTInductor package of $ctag's micro-step (batch $mb)"
  [ -f .gpu-carry/$ctag-step.pt2 ] && cp .gpu-carry/$ctag-step.pt2 $pkg && echo "carried package"
  # BG_COMPILE=1: compile while the later sections run (their lf-compiled* runs are skipped)
  if [ $early_compile = 1 ]; then echo "compiling since the export (background)"
  elif [ ! -f $pkg ] && [ "${BG_COMPILE:-0}" = 1 ]; then compile_pkg & compile_pid=$!
  elif [ ! -f $pkg ]; then compile_pkg; fi
  pkg=/dev/shm/$tag-step.pt2
  [ -f .gpu-carry/$tag-step.pt2 ] && [ ! -f $pkg ] && cp .gpu-carry/$tag-step.pt2 $pkg
fi
# lf-compiled-graphs: the package, replayed as CUDA graphs, optimizer graph (the defaults with a package)
# lf-compiled: the package called without graphs; lf-compiled-adfe: as lf-compiled-graphs, ADFE's source
# lf-graphs: the TorchScript forward+backward replayed, optimizer graph; lf-plain: no graphs, per-tensor AdamW
run_one() {  # run_one RUN: one run of section train (the names below)
  local run=$1
  # the *-ckpt runs: a checkpoint every CKPT_EVERY steps (default 400), the last one kept
  local ckpt=(--set checkpoint.interval_steps=${CKPT_EVERY:-400} --set checkpoint.keep_last=1)
  stamp "train: $run"
  case $run in
    lf-compiled-graphs) [ -f $pkg ] && [ -z "${compile_pid:-}" ] && train_lf $run $mfile --set trainer.compiled_step=$pkg ;;
    lf-compiled) [ -f $pkg ] && train_lf $run $mfile --set trainer.compiled_step=$pkg \
                   --set trainer.cuda_graphs=off ;;
    lf-compiled-adfe) [ -f $pkg ] && train_lf $run $mfile --set trainer.compiled_step=$pkg \
                        --set adfe.enable=true --set adfe.decode_threads=4 ;;
    lf-compiled-adfe-ckpt) [ -f $pkg ] && train_lf $run $mfile --set trainer.compiled_step=$pkg \
                             --set adfe.enable=true --set adfe.decode_threads=4 "${ckpt[@]}" ;;
    lf-default|lf-default-*)  # the defaults for a GPU (trainer.compiled_step=auto: the package cache COMPILE_CACHE),
      # no engine keys; lf-default-NAME: the same run again under another name
      train_lf $run $mfile --set trainer.compiled_step=auto --set trainer.compile_cache=${COMPILE_CACHE:-/tmp/lf-cache} ;;
    lf-dmf)  # lf-default with DMF's text buckets (one width with the compiled step: its own package)
      train_lf $run $mfile --set trainer.compiled_step=auto --set trainer.compile_cache=${COMPILE_CACHE:-/tmp/lf-cache} \
        --set dmf.enable=true ;;
    lf-graphs) train_lf $run $mfile --set trainer.cuda_graphs=on ;;
    lf-graphs-dmf) train_lf $run $mfile --set trainer.cuda_graphs=on --set dmf.enable=true ;;
    lf-graphs-adfe) train_lf $run $mfile --set trainer.cuda_graphs=on --set adfe.enable=true --set adfe.decode_threads=4 ;;
    lf-graphs-adfe-cpuresize)  # as lf-graphs-adfe with the frames resized on the CPU (data.frame_resize=cpu)
      train_lf $run $mfile --set trainer.cuda_graphs=on --set adfe.enable=true --set adfe.decode_threads=4 \
        --set data.frame_resize=cpu ;;
    lf-graphs-adfe-ckpt) train_lf $run $mfile --set trainer.cuda_graphs=on --set adfe.enable=true \
                           --set adfe.decode_threads=4 "${ckpt[@]}" ;;
    lf-graphs-adfe-mb2x)  # twice the micro-batch, half the accumulation: the same global batch
      train_lf $run $mfile --set trainer.cuda_graphs=on --set adfe.enable=true --set adfe.decode_threads=4 \
        --set trainer.micro_batch_size=$((mb * 2)) --set trainer.gradient_accumulation_steps=$(( accum > 1 ? accum / 2 : 1 )) ;;
    lf-graphs-grouped) train_lf $run /dev/shm/$tag-grouped.pt --set trainer.cuda_graphs=on ;;
    lf-compiled-graphs-grouped) [ -f $pkg_grouped ] && [ -z "${compile_pid:-}" ] && \
                                  train_lf $run /dev/shm/$tag-grouped.pt --set trainer.compiled_step=$pkg_grouped ;;
    lf-graphs-before) [ -n "$before" ] && train_lf $run $before --set trainer.cuda_graphs=on ;;
    lf-plain) train_lf $run $mfile --set trainer.cuda_graphs=off --set optimizer.implementation=plain ;;
    ref-opt|ref-base)
      mode=optimized; [ $run = ref-base ] && mode=baseline
      PYTHONPATH=scripts timeout $(left 250) python3 scripts/reference/train_torch.py --config $cfg \
        --set model.path=$mfile --set trainer.micro_batch_size=$mb --set trainer.max_steps=$steps --set run.output_dir=$runs \
        --mode $mode --loongforge-train build-gpu/src/daemon/loongforge-train --out $runs/$run \
        > "$logs/$run.log" 2>&1
      echo "$run: exit $?"; tail -2 "$logs/$run.log"
      cp $runs/$run/metrics.jsonl "$logs/${run}_metrics.jsonl" 2>/dev/null; pack ;;
  esac
  ran="$ran $run"
}
if want train; then
  for run in ${TRAIN_RUNS:-lf-compiled-graphs lf-compiled lf-compiled-adfe lf-graphs ref-opt lf-plain}; do run_one $run; done
fi
if [ -n "$ran" ]; then
  stamp "steady state (steps 51-$steps)"
  python3 scripts/dev/gpu/steady_state.py $logs $ran ${skips[@]+--skip-steps "${skips[@]}"}
fi
if [[ " $ran " == *" lf-graphs-adfe "* && " $ran " == *" lf-graphs-adfe-cpuresize "* ]]; then
  stamp "losses: frames resized on the device (lf-graphs-adfe) against the CPU (lf-graphs-adfe-cpuresize)"
  python3 scripts/dev/gpu/compare_losses.py $logs lf-graphs-adfe-cpuresize lf-graphs-adfe
fi
for c in lf-graphs-adfe lf-compiled-adfe; do
  if [[ " $ran " == *" $c-ckpt "* ]]; then
    stamp "data wait while checkpoints are written (scripts/dev/gpu/ckpt_data_wait.py, $c-ckpt)"
    python3 scripts/dev/gpu/ckpt_data_wait.py $logs $c-ckpt $([[ " $ran " == *" $c "* ]] && echo --baseline $c)
  fi
done
if want profile; then
  for f in $mfile $before; do
    stamp "profile $f"
    PYTHONPATH=scripts timeout $(left ${PROFILE_LIMIT:-60}) python3 scripts/dev/gpu/profile_model.py --model $f --batch $mb --top 40 \
      --iters 10 --script-only > "$logs/profile-$(basename $f .pt).log" 2>&1; echo "exit $?"
    grep -E "forward\+backward|device events" "$logs/profile-$(basename $f .pt).log"; pack
  done
fi
if want ops; then
  stamp "candidate ops (scripts/dev/gpu/bench_ops.py)"
  timeout $(left 90) python3 scripts/dev/gpu/bench_ops.py --batch 32 2>&1 | tee "$logs/bench_ops.log" | grep -v Warning; pack
fi
if want catlin; then
  stamp "the per-embodiment linears three ways (scripts/dev/gpu/bench_category_linear.py)"
  PYTHONPATH=scripts timeout $(left 120) python3 scripts/dev/gpu/bench_category_linear.py --config n16-1b --config n16-3b \
    2>&1 | tee "$logs/bench_category_linear.log" | grep -v Warning; pack
fi
if want tests; then
  stamp "gpu tests"
  if [ -n "${FIRST_TESTS:-}" ]; then  # a regex of tests to run first (any label)
    (cd build-gpu && timeout $(left 300) ctest -R "$FIRST_TESTS" --output-on-failure > "$logs/ctest-first.log" 2>&1; echo "ctest exit $?")
    grep -E "Test +#|tests passed|FAILED|Failed|difference" "$logs/ctest-first.log" | tail -14; pack
  fi
  [ "${GPU_TESTS:-all}" = first ] || (cd build-gpu && timeout $(left ${GPU_TEST_LIMIT:-120}) ctest -L gpu -LE long ${FIRST_TESTS:+-E "$FIRST_TESTS"} --output-on-failure > "$logs/ctest-gpu.log" 2>&1; echo "ctest exit $?")
  [ -f "$logs/ctest-gpu.log" ] && grep -E "Test +#|tests passed|FAILED|Failed" "$logs/ctest-gpu.log" | tail -14; pack
  if [ "${GPU_TESTS:-all}" != first ] && [ "$(left 300)" -gt 60 ]; then
    stamp "long gpu tests (while time is left)"
    (cd build-gpu && timeout $(left 300) ctest -L gpu -L long --output-on-failure > "$logs/ctest-gpu-long.log" 2>&1; echo "ctest exit $?")
    grep -E "Test +#|tests passed|FAILED|Failed" "$logs/ctest-gpu-long.log" | tail -6; pack
  fi
fi
if [ -n "${compile_pid:-}" ]; then
  stamp "waiting for the background compile"; wait $compile_pid; compile_pid=""; pack
  # AFTER_COMPILE_RUNS: runs of section train made once the background compile is done
  if [ -f $pkg ] && [ -n "${AFTER_COMPILE_RUNS:-}" ]; then
    for run in $AFTER_COMPILE_RUNS; do run_one $run; done
    python3 scripts/dev/gpu/steady_state.py $logs $ran ${skips[@]+--skip-steps "${skips[@]}"}
  fi
fi
stamp "done"
