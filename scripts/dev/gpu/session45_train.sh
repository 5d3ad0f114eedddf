#!/usr/bin/env bash
# One device call (~9.5 min, one H100/H200) for issue #43: gr00t-n1.7-3b default fine-tuning with every dropout
# at 0 (the form the compiled step takes today), micro-batch 32, bf16, the bundled dataset (bench config),
# 100 steps each, same call, same GPU:
#   lf-compiled-adfe  the AOTInductor package (.gpu-carry/g17d0-step.pt2: scripts/dev/gpu/session45_compile.sh
#                     on the GPU, then scripts/dev/build_aoti_package.py here) replayed as a CUDA graph, ADFE
#   lf-graphs-adfe    the TorchScript step replayed as CUDA graphs, ADFE (today's default path)
#   ref-opt           the reference trainer's optimized mode (torch.compile + CUDA graphs, fused AdamW)
# each loongforge-train run with `profile-step --kernels` at step 40 (scripts/dev/gpu/issue11_step.sh), then
# the optimizer's bandwidth floor on this GPU (scripts/dev/gpu/optimizer_floor.py).
#   bash scripts/dev/gpu/session45_train.sh        (carry .gpu-carry)
source "$(dirname "${BASH_SOURCE[0]}")/common.sh" session45_train
stamp "optimizer floor"
PYTHONPATH=scripts/dev/gpu python3 scripts/dev/gpu/optimizer_floor.py --params ${TRAINABLE:-1.62e9}
stamp "train"
MODEL=gr00t-n1.7-3b TAG=g17d0 EXPORT_SET="gr00t_dropout=0" MB=32 STEPS=${STEPS:-100} SECTIONS="compiled train" \
  TRAIN_RUNS="${TRAIN_RUNS:-lf-compiled-adfe lf-graphs-adfe ref-opt}" PROFILE=1 PROFILE_AT=40 RUN_LIMIT=150 \
  FINAL_KILL=1 BUDGET=${BUDGET:-560} bash scripts/dev/gpu/issue11_step.sh
stamp "done"
