#!/usr/bin/env bash
# Builds everything into build-gpu/ and runs the GPU tests (ctest -L gpu; with
# LONG=0 the long ones, e2e_compiled_step_gpu, are left out to fit one call),
# with their output tails in $OUT/gpu_tests.log (all of it in $OUT/ctest.log): the check a session
# makes when it changed code the GPU paths run but measured nothing on them. The multi-rank CPU
# cases are not run here: the GPU machine has no libgloo-dev, so its build has no Gloo (cmake.log
# says so) and they refuse to start; session 40's "failure" of one of them there was that refusal.
# Carry: .gpu-carry (scripts/dev/gpu/prepare_carry.sh).
#   [LONG=0] bash scripts/dev/gpu/gpu_tests.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh" gpu_tests
stamp "environment"; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
stamp "build"; bash scripts/dev/gpu/build.sh || exit 1
stamp "gpu tests"
exclude=(); [ "${LONG:-1}" = 0 ] && exclude=(-LE long)
# The whole output to $OUT/ctest.log (a failure's message can lie before the tail); the tail here.
(cd build-gpu && ctest -L gpu "${exclude[@]}" --output-on-failure --timeout 600 > "$OUT/ctest.log" 2>&1)
tail -${GPU_TEST_LINES:-60} "$OUT/ctest.log"
stamp "done"
