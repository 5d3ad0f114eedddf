#!/usr/bin/env bash
# Two device calls (one H100/H200, ~9.5 min each), issue #43 items 3-6 on gr00t-n1.7-3b, GR00T's default
# fine-tuning, every dropout 0, micro-batch 32, bf16, the bench config, the bundled data:
#   PART=1 (default): build-gpu/ and the export (issue11_step.sh); the optimizer kernels' GPU test case;
#     `loongforge-train --compile-only` with the default trainer.compiled_step (auto) into the package cache
#     /tmp/lf-cache, alone on the machine (timed); the optimizer's floor (optimizer_floor.py) and where the
#     model load goes (model_load_probe.py); then lf-default (no engine or compiled-step key: the cache hit,
#     ADFE, graphs) with profile-step --kernels. The cache comes back as $OUT/lf-cache.tgz.partNN: `cat` them
#     into .gpu-carry/lf-cache.tgz for part 2.
#   PART=2: the build and export again (a fresh machine), the staged model load's GPU test
#     (test_staged_load_gpu), the carried cache, then in one call lf-default,
#     lf-graphs-adfe (the TorchScript step) and ref-opt (our reference's torch.compile + CUDA graphs), STEPS
#     each (the runs' logs attribute the staged model load); `ctest -L gpu -LE long` in the time left.
#     PART2_BUDGET (default 480) and PART2_LIMIT (585): seconds from the start for the runs, and for the tests.
#   bash scripts/dev/gpu/session50.sh            (carry .gpu-carry)
source "$(dirname "${BASH_SOURCE[0]}")/common.sh" session50
cache=/tmp/lf-cache
common=(MODEL=gr00t-n1.7-3b "EXPORT_SET=gr00t_dropout=0" MB=32 HORIZON=16 TAG=g17d0 COMPILE_CACHE=$cache)
cfg=configs/bench/n16-1b-h200.yaml
env "${common[@]}" SECTIONS="none" bash scripts/dev/gpu/issue11_step.sh || exit 1
mfile=/dev/shm/g17d0.pt
if [ "${PART:-1}" = 1 ]; then
  stamp "the optimizer kernels' GPU test case"
  timeout 120 build-gpu/test/trainer/test_trainer_gpu "optimizer on a GPU*" 2>&1 | grep -vE "^\s*$" | tail -12
  stamp "--compile-only (trainer.compiled_step at its default), alone on the machine"
  rm -rf $cache
  /usr/bin/time -f "compile-only wall %e s" build-gpu/src/daemon/loongforge-train --config $cfg \
    --set model.path=$mfile --set trainer.micro_batch_size=32 --set trainer.compile_cache=$cache \
    --compile-only > "$OUT/compile-only.log" 2>&1
  echo "compile-only: exit $?"; grep -vE "^\s*$" "$OUT/compile-only.log" | tail -6
  ls -l $cache
  stamp "the optimizer's floor; the model load's parts"
  python3 scripts/dev/gpu/optimizer_floor.py --params 1.6205e9 --copies 1.2927e9
  timeout 120 python3 scripts/dev/gpu/model_load_probe.py $mfile
  stamp "lf-default (the package from the cache)"
  env "${common[@]}" SECTIONS="train" BUILD=0 TRAIN_RUNS=lf-default STEPS=${STEPS:-100} PROFILE=1 FINAL_KILL=1 \
    RUN_LIMIT=90 BUDGET=$(( 585 - ($(date +%s) - t0) )) bash scripts/dev/gpu/issue11_step.sh
  tar -czf /tmp/lf-cache.tgz -C /tmp lf-cache && split -b 15M -d /tmp/lf-cache.tgz "$OUT/lf-cache.tgz.part"
else
  stamp "the staged model load's GPU test"
  (cd build-gpu && timeout 60 test/model/test_staged_load_gpu 2>&1 | tail -4)
  stamp "the carried package cache"
  rm -rf $cache && tar -xzf .gpu-carry/lf-cache.tgz -C /tmp && ls -l $cache || exit 1
  env "${common[@]}" SECTIONS="train" BUILD=0 TRAIN_RUNS="${TRAIN_RUNS:-lf-default lf-graphs-adfe ref-opt}" \
    STEPS=${STEPS:-100} PROFILE=1 FINAL_KILL=1 RUN_LIMIT=90 BUDGET=$(( ${PART2_BUDGET:-480} - ($(date +%s) - t0) )) \
    bash scripts/dev/gpu/issue11_step.sh
  gpu_tests_in_time_left ${PART2_LIMIT:-585}
fi
stamp "done"
