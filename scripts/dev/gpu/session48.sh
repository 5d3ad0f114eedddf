#!/usr/bin/env bash
# One device call (~9.5 min, one H100/H200), issue #43: the compiled step of gr00t-n1.7-3b measured.
#   1. export gr00t-n1.7-3b with every dropout at 0 and compile its default fine-tuning micro-step
#      (micro-batch 32, bf16, the data's 16 actions, host wrapper at -O0) in the background
#      (scripts/dev/gpu/issue11_step.sh, BG_COMPILE=1), beside the build of build-gpu/;
#   2. while it compiles: the GPU tests no call of session 47 reached (FIRST_TESTS: test_nccl_gpu with its
#      abort/regroup case, e2e_grouped_embodiment_gpu);
#   3. once the package is there (returned in $OUT as g17d0-step.pt2.partNN: `cat` them into
#      .gpu-carry/g17d0-step.pt2 for later calls), same call, same GPU, 100 steps each, the bench config,
#      ADFE: lf-compiled-adfe (the package replayed as a CUDA graph) then lf-graphs-adfe (the TorchScript
#      step as CUDA graphs), each with `profile-step --kernels` at step 60.
#   bash scripts/dev/gpu/session48.sh        (carry .gpu-carry)
source "$(dirname "${BASH_SOURCE[0]}")/common.sh" session48
env MODEL=gr00t-n1.7-3b TAG=g17d0 "EXPORT_SET=gr00t_dropout=0" MB=32 HORIZON=16 \
  SECTIONS="compiled tests" BG_COMPILE=1 COMPILE_ENV=AOT_INDUCTOR_COMPILE_WRAPPER_OPT_LEVEL=O0 \
  COMPILE_LIMIT=${COMPILE_LIMIT:-470} GPU_TESTS=first \
  FIRST_TESTS="${FIRST_TESTS:-^test_nccl_gpu|^e2e_grouped_embodiment_gpu\$}" \
  AFTER_COMPILE_RUNS="${AFTER_COMPILE_RUNS:-lf-compiled-adfe lf-graphs-adfe}" STEPS=${STEPS:-100} \
  PROFILE=${PROFILE:-1} FINAL_KILL=1 RUN_LIMIT=${RUN_LIMIT:-75} BUDGET=${BUDGET:-580} \
  bash scripts/dev/gpu/issue11_step.sh
stamp "done"
