#!/usr/bin/env bash
# One device call (~7-9 min, one H100/H200), issue #43 item 2: gr00t-n1.7-3b default fine-tuning (every dropout 0,
# micro-batch 32, bf16, the bench config, the bundled data), same call, same GPU, STEPS steps each:
#   lf-compiled-adfe  the AOTInductor package .gpu-carry/g17c-step.pt2, compiled with --bf16-weights (the list a
#                     graphed run writes; scripts/dev/gpu/session49.sh returns both), so the run keeps bf16
#                     working copies; replayed as a CUDA graph, ADFE; `profile-step --kernels` at step 60
#   lf-graphs-adfe    the TorchScript step replayed as CUDA graphs, ADFE, bf16 working copies; profiled the same way
#   ref-opt           our reference trainer's optimized mode (torch.compile + CUDA graphs, fused AdamW), last:
#                     its first step is its compile (~3 min)
#   bash scripts/dev/gpu/session49_compare.sh        (carry .gpu-carry)
source "$(dirname "${BASH_SOURCE[0]}")/common.sh" session49_compare
[ -f .gpu-carry/g17c-step.pt2 ] || { echo "no .gpu-carry/g17c-step.pt2 (scripts/dev/gpu/session49.sh returns it)"; exit 1; }
env MODEL=gr00t-n1.7-3b TAG=g17c "EXPORT_SET=gr00t_dropout=0" MB=32 HORIZON=16 SECTIONS="compiled train" \
  TRAIN_RUNS="${TRAIN_RUNS:-lf-compiled-adfe lf-graphs-adfe ref-opt}" STEPS=${STEPS:-100} PROFILE=${PROFILE:-1} \
  FINAL_KILL=1 RUN_LIMIT=${RUN_LIMIT:-90} BUDGET=${BUDGET:-540} bash scripts/dev/gpu/issue11_step.sh
stamp "done"
