#!/usr/bin/env bash
# One device call (~9.5 min, one H100/H200), issue #43: gr00t-n1.7-3b default fine-tuning (every dropout 0,
# micro-batch 32, bf16, the bench config, the bundled data), same call, same GPU, STEPS steps each:
#   ref-opt           our reference trainer's optimized mode (torch.compile + CUDA graphs, fused AdamW)
#   lf-compiled-adfe  the AOTInductor package .gpu-carry/g17d0-step.pt2 (scripts/dev/gpu/session48.sh returns
#                     it) replayed as a CUDA graph, ADFE; with `profile-step --kernels` at step 60
#   lf-graphs-adfe    the TorchScript step replayed as CUDA graphs, ADFE; profiled the same way
# then, with what is left, the checkpoint writer on a quiet GPU host (issue #45: 8 threads, unbounded and
# staging bounded to 4096 MB, an 8 GB state, best of 2, /dev/shm; session 47's figures ran beside a compile).
#   bash scripts/dev/gpu/session48_compare.sh        (carry .gpu-carry)
source "$(dirname "${BASH_SOURCE[0]}")/common.sh" session48_compare
budget=${BUDGET:-580}
[ -f .gpu-carry/g17d0-step.pt2 ] || echo "no .gpu-carry/g17d0-step.pt2: lf-compiled-adfe is skipped"
env MODEL=gr00t-n1.7-3b TAG=g17d0 "EXPORT_SET=gr00t_dropout=0" MB=32 HORIZON=16 SECTIONS="compiled train" \
  TRAIN_RUNS="${TRAIN_RUNS:-ref-opt lf-compiled-adfe lf-graphs-adfe}" STEPS=${STEPS:-100} PROFILE=${PROFILE:-1} \
  FINAL_KILL=1 RUN_LIMIT=${RUN_LIMIT:-90} BUDGET=$(( budget - ${CKPT_S:-70} )) bash scripts/dev/gpu/issue11_step.sh
left=$(( budget - ($(date +%s) - t0) ))
if [ $left -gt 50 ]; then
  stamp "checkpoint writer, $left s left"
  ninja -C build-gpu bench_checkpoint > "$OUT/bench_build.log" 2>&1
  b=build-gpu/test/checkpoint/bench_checkpoint d=/dev/shm/lf-bench-ckpt; mkdir -p $d
  for args in "--mode storage" "--mode after --threads 8 --staging-mb 0" "--mode after --threads 8 --staging-mb 4096"; do
    timeout $(( budget - ($(date +%s) - t0) - 5 )) $b $args --dir $d --gb 8 --repeat 2 || break
  done
  rm -rf $d
fi
stamp "done"
