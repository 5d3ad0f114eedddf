#!/usr/bin/env bash
# Builds everything into build-gpu/ and runs the GPU tests (ctest -L gpu; with
# LONG=0 the long ones, e2e_compiled_step_gpu, are left out to fit one call),
# with their output tails in $OUT/gpu_tests.log (all of it in $OUT/ctest.log), then the CPU cases of
# $CPU_R on this machine ($OUT/ctest_cpu.log): the check a session makes when
# it changed code the GPU paths run but measured nothing on them.
# Carry: .gpu-carry (scripts/gpu/prepare_carry.sh).
#   [LONG=0] bash scripts/gpu/gpu_tests.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh" gpu_tests
stamp "environment"; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
stamp "build"; bash scripts/gpu/build.sh || exit 1
stamp "gpu tests"
exclude=(); [ "${LONG:-1}" = 0 ] && exclude=(-LE long)
# The whole output to $OUT/ctest.log (a failure's message can lie before the tail); the tail here.
(cd build-gpu && ctest -L gpu "${exclude[@]}" --output-on-failure --timeout 600 > "$OUT/ctest.log" 2>&1)
tail -${GPU_TEST_LINES:-60} "$OUT/ctest.log"
# CPU cases on this machine's CPUs and compiler (ctest -R "$CPU_R"): session 40 saw test_optimizer's
# "sharded AdamW's bf16 working copies give ..." (two Gloo ranks in one process) fail here only, its
# message lost; it passes on the CPU machine (RelWithDebInfo and Release builds, 1 to 16 threads).
stamp "cpu cases: ${CPU_R:=test_optimizer:.*sharded AdamW}"
(cd build-gpu && ctest -R "$CPU_R" --output-on-failure --timeout 300 > "$OUT/ctest_cpu.log" 2>&1)
grep -E "tests passed|FAILED|Failed|REQUIRE|with expansion" -A3 "$OUT/ctest_cpu.log" | tail -40
stamp "done"
