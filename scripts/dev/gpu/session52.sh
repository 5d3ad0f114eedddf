#!/usr/bin/env bash
# DMF's text buckets on a GPU (issue #46): n16-1b, micro-batch 32, bf16, the bench config, the bundled data
# (every task text has 14 tokens of the 32-token slot: 37.5% of the vision-language tokens are padding):
#   PART=compile (default): build-gpu/ and the export; `loongforge-train --compile-only` for the defaults and
#     for dmf.enable=true (the package of DMF's one width, 14) into the package cache /tmp/lf-cache-dmf, each
#     timed; the cache (with cuda-jit/) comes back as $OUT/lf-cache-dmf.tgz.partNN (`cat` them into
#     .gpu-carry/lf-cache-dmf.tgz);
#   PART=compare: the carried cache; lf-default, lf-dmf, ref-opt, lf-graphs, lf-graphs-dmf (STEPS steps each,
#     default 100): the steady-state table and ratios; the per-step losses of lf-dmf against lf-default;
#     scripts/bench/dmf_text_cut.py at the model on the GPU; then `ctest -L gpu -LE long` in the time left
#     (LIMIT, default 585 s from the start).
#   PART=compile bash scripts/dev/gpu/session52.sh        (carry .gpu-carry)
source "$(dirname "${BASH_SOURCE[0]}")/common.sh" session52
cache=/tmp/lf-cache-dmf
common=(MODEL=n16-1b MB=32 HORIZON=16 TAG=n16-1b COMPILE_CACHE=$cache)
logs=/tmp/lf-logs-n16-1b
cfg=configs/bench/n16-1b-h200.yaml
env "${common[@]}" SECTIONS="none" bash scripts/dev/gpu/issue11_step.sh || exit 1
train() {  # train RUNS STEPS PROFILE [RUN_LIMIT]
  env "${common[@]}" SECTIONS="train" BUILD=0 TRAIN_RUNS="$1" STEPS=$2 PROFILE=$3 FINAL_KILL=1 RUN_LIMIT=${4:-90} \
    BUDGET=$(( ${LIMIT:-585} - 10 - ($(date +%s) - t0) )) bash scripts/dev/gpu/issue11_step.sh | grep -vE "^== \[|fewer than"
}
if [ "${PART:-compile}" = compile ]; then
  rm -rf $cache
  for dmf in false true; do
    stamp "--compile-only, dmf.enable=$dmf"
    /usr/bin/time -f "compile-only wall %e s" timeout $(( ${LIMIT:-585} - 40 - ($(date +%s) - t0) )) \
      build-gpu/src/daemon/loongforge-train --config $cfg --set model.path=/dev/shm/n16-1b.pt \
      --set trainer.micro_batch_size=32 --set trainer.compile_cache=$cache --set dmf.enable=$dmf --compile-only \
      > "$OUT/compile-only-dmf-$dmf.log" 2>&1
    echo "compile-only: exit $?"; grep -vE "^\s*$" "$OUT/compile-only-dmf-$dmf.log" | tail -4
  done
  ls -l $cache
  tar -czf /tmp/lf-cache-dmf.tgz -C /tmp lf-cache-dmf && split -b 15M -d /tmp/lf-cache-dmf.tgz "$OUT/lf-cache-dmf.tgz.part"
else
  stamp "the carried package cache"
  rm -rf $cache && tar -xzf .gpu-carry/lf-cache-dmf.tgz -C /tmp && ls -l $cache/*.pt2 || exit 1
  train "lf-default lf-dmf ref-opt lf-graphs lf-graphs-dmf" ${STEPS:-100} 0 120
  stamp "losses: lf-dmf against lf-default"
  python3 scripts/dev/gpu/compare_losses.py $logs lf-default lf-dmf
  grep -h "DMF:\|padding " $logs/lf-dmf.log $logs/lf-default.log | cut -c1-300
  tar -czf "$OUT/logs-n16-1b.tgz" -C $logs . 2>/dev/null
  stamp "DMF at the model: scripts/bench/dmf_text_cut.py on the GPU (micro-batch 32)"
  py=$(grep "^LOONGFORGE_PYTHON:" build-gpu/CMakeCache.txt | cut -d= -f2)
  timeout 120 $py scripts/bench/dmf_text_cut.py --model /dev/shm/n16-1b.pt --config n16-1b --batch 32 --device cuda
  gpu_tests_in_time_left ${LIMIT:-585}
fi
stamp "done"
