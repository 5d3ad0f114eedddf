#!/usr/bin/env bash
# One device call (~9.5 min, one H100/H200), session 47:
#   1. build-gpu/ and the export of gr00t-n1.7-3b with every dropout at 0 (scripts/dev/gpu/issue11_step.sh),
#      then the GPU tests the last calls did not reach (issue #42: test_trainer_gpu, e2e_reference_optimized_gpu;
#      issue #43: test_compiled_draws, the views-as-reshapes export; e2e_gr00t_graphs_gpu) -- at most 340 s;
#   2. with what is left: gr00t-n1.7-3b default fine-tuning, micro-batch 32, bf16, the bench config, STEPS steps
#      each, same call, same GPU: lf-compiled-adfe (the AOTInductor package .gpu-carry/g17d0-step.pt2:
#      scripts/dev/gpu/session45_compile.sh on the GPU, then scripts/dev/build_aoti_package.py here, replayed as
#      a CUDA graph, ADFE) against lf-graphs-adfe (the TorchScript step replayed as CUDA graphs, ADFE).
#   bash scripts/dev/gpu/session47.sh        (carry .gpu-carry)
source "$(dirname "${BASH_SOURCE[0]}")/common.sh" session47
budget=${BUDGET:-565}
common=(MODEL=gr00t-n1.7-3b TAG=g17d0 "EXPORT_SET=gr00t_dropout=0" MB=32)
env "${common[@]}" SECTIONS="compiled tests" GPU_TESTS=first BUDGET=${TEST_BUDGET:-340} \
  FIRST_TESTS="${FIRST_TESTS:-^test_trainer_gpu|^e2e_reference_optimized_gpu\$|^test_compiled_draws|^e2e_gr00t_graphs_gpu\$}" \
  bash scripts/dev/gpu/issue11_step.sh
left=$(( budget - ($(date +%s) - t0) ))
stamp "train, $left s left"
[ $left -gt 60 ] && env "${common[@]}" SECTIONS="train" BUILD=0 TRAIN_RUNS="${TRAIN_RUNS:-lf-compiled-adfe lf-graphs-adfe}" \
  STEPS=${STEPS:-100} PROFILE=0 RUN_LIMIT=${RUN_LIMIT:-120} FINAL_KILL=1 BUDGET=$left bash scripts/dev/gpu/issue11_step.sh
stamp "done"
