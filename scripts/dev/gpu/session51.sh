#!/usr/bin/env bash
# One device call (one H100/H200, ~9.5 min), issue #43 on gr00t-n1.7-3b, GR00T's default fine-tuning,
# every dropout 0, micro-batch 32, bf16, the bench config, the bundled data, the package cache carried
# (.gpu-carry/lf-cache.tgz, from scripts/dev/gpu/session50.sh part 1):
#   1. build-gpu/ and the export (issue11_step.sh);
#   2. lf-default (the defaults: the package from the cache, ADFE, graphs), STEPS steps (default 100), with
#      profile-step --kernels: the machine's first run of the package;
#   3. the first step attributed, 12 steps each: lf-default-warm (the same run again), lf-default-evicted
#      (the shared libraries a run maps dropped from the page cache first: scripts/dev/gpu/page_cache.py),
#      lf-default-reread (dropped, then read back whole: the storage's rate);
#   4. ref-opt (our reference trainer: torch.compile + CUDA graphs), STEPS steps: the same-call baseline;
#   5. the steady-state table and ratio, the losses of lf-default against ref-opt;
#   6. ctest -L gpu -LE long in the time left (LIMIT, default 585 s from the start).
#   bash scripts/dev/gpu/session51.sh            (carry .gpu-carry)
source "$(dirname "${BASH_SOURCE[0]}")/common.sh" session51
cache=/tmp/lf-cache
common=(MODEL=gr00t-n1.7-3b "EXPORT_SET=gr00t_dropout=0" MB=32 HORIZON=16 TAG=g17d0 COMPILE_CACHE=$cache)
logs=/tmp/lf-logs-g17d0
env "${common[@]}" SECTIONS="none" bash scripts/dev/gpu/issue11_step.sh || exit 1
stamp "the carried package cache"
rm -rf $cache && tar -xzf .gpu-carry/lf-cache.tgz -C /tmp && ls -l $cache/*.pt2 || exit 1
train() {  # train RUNS STEPS PROFILE
  env "${common[@]}" SECTIONS="train" BUILD=0 TRAIN_RUNS="$1" STEPS=$2 PROFILE=$3 FINAL_KILL=1 RUN_LIMIT=${4:-90} \
    BUDGET=$(( ${LIMIT:-585} - 10 - ($(date +%s) - t0) )) bash scripts/dev/gpu/issue11_step.sh | grep -vE "^== \[|steady state|fewer than"
}
train lf-default ${STEPS:-100} 1
stamp "the first step: the same run again"
train lf-default-warm 12 0 60
stamp "the first step: the libraries dropped from the page cache"
python3 scripts/dev/gpu/page_cache.py evict --list "$OUT/libraries.txt"
train lf-default-evicted 12 0 60
stamp "the first step: dropped, then read back whole"
python3 scripts/dev/gpu/page_cache.py evict && python3 scripts/dev/gpu/page_cache.py read
train lf-default-reread 12 0 60
for r in lf-default lf-default-warm lf-default-evicted lf-default-reread; do
  echo "$r: $(grep -ho 'first step done.*' $logs/$r.log)"
done
stamp "ref-opt"
train ref-opt ${STEPS:-100} 0
stamp "steady state (steps 51-${STEPS:-100}) and losses"
python3 scripts/dev/gpu/steady_state.py $logs lf-default ref-opt --skip-steps lf-default:55-75
python3 scripts/dev/gpu/compare_losses.py $logs lf-default ref-opt
tar -czf "$OUT/logs-g17d0.tgz" -C $logs . 2>/dev/null
gpu_tests_in_time_left ${LIMIT:-585}
stamp "done"
