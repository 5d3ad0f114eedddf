#!/usr/bin/env bash
# One device call (~9.5 min, one H100/H200) for issue #43 and the GPU checks left from session 44:
#   1. the C++-only AOTInductor package of gr00t-n1.7-3b's default fine-tuning micro-step with every
#      dropout at 0 (the form scripts/compile_step.py takes today), micro-batch 32, bf16
#      (scripts/dev/gpu/compile_only.sh, CPP_ONLY=1; returned gzip-compressed under $OUT/g17d0/),
#   2. once its trace is over (the GPU is free again), beside its code generation: the GPU tests
#      with LONG=0 (scripts/dev/gpu/gpu_tests.sh: build-gpu/ from scratch), then EXTRA_TESTS (long-labelled GPU
#      tests: the compiled step's draws replayed, MLA), then the checkpoint write throughput of issue #45 on the GPU
#      host (scripts/bench/checkpoint.sh), while time is left.
# On the CPU machine afterwards:
#   cat OUT/g17d0/g17d0-step-cpp.pt2.gz* | gunzip > /tmp/g17d0-cpp.pt2
#   python3 scripts/dev/build_aoti_package.py /tmp/g17d0-cpp.pt2 .gpu-carry/g17d0-step.pt2 --opt-level O0
# gives the package that scripts/dev/gpu/session45_train.sh trains with. Carry: .gpu-carry.
#   bash scripts/dev/gpu/session45_compile.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh" session45_compile
budget=${BUDGET:-575}
left() { echo $(( budget - ($(date +%s) - t0) )); }
mkdir -p "$OUT/g17d0"
stamp "compile gr00t-n1.7-3b (dropout 0, micro-batch 32, C++-only) in the background"
CPP_ONLY=1 MODEL=gr00t-n1.7-3b TAG=g17d0 MB=32 EXPORT_SET="gr00t_dropout=0" LIMIT=$(( budget - 20 )) \
  OUT="$OUT/g17d0" bash scripts/dev/gpu/compile_only.sh > /dev/null 2>&1 & cpid=$!
for _ in $(seq 150); do  # the trace runs the step on the GPU: the tests wait for it
  grep -q "^exported in" "$OUT/g17d0/compile_only.log" 2>/dev/null && break
  kill -0 $cpid 2>/dev/null || break; sleep 2
done
grep -E "^(traced|exported)" "$OUT/g17d0/compile_only.log"
stamp "gpu tests (LONG=0), at most $(( $(left) - 150 )) s"
LONG=0 GPU_TEST_LINES=45 timeout $(( $(left) - 150 )) bash scripts/dev/gpu/gpu_tests.sh; echo "gpu_tests: exit $?"
for t in ${EXTRA_TESTS:-test_compiled_draws test_mla_gpu}; do  # gpu tests labelled long, while time is left
  [ "$(left)" -gt 150 ] || break
  stamp "$t"
  (cd build-gpu && timeout $(( $(left) - 100 )) ctest -R "^$t\$" --output-on-failure > "$OUT/ctest-$t.log" 2>&1; echo "ctest exit $?")
  grep -E "Test +#|tests passed|FAILED|Failed|failed|error" "$OUT/ctest-$t.log" | tail -8
done
if [ "$(left)" -gt 120 ]; then
  stamp "checkpoint throughput"
  ninja -C build-gpu bench_checkpoint > "$OUT/bench_build.log" 2>&1 && \
  BUILD=build-gpu GB=${GB:-8} THREADS=8 STAGING_MB=4096 REPEAT=1 timeout $(( $(left) - 30 )) \
    bash scripts/bench/checkpoint.sh /dev/shm/lf-bench-ckpt "$PWD/build-gpu/bench-ckpt" 2>&1 | tail -14
fi
stamp "waiting for the compile"
wait $cpid; echo "compile_only: exit $?"
grep -E "^== |^compiled|files,|cpp.gz" "$OUT/g17d0/compile_only.log" | tail -10; ls -l "$OUT/g17d0"
stamp "done"
