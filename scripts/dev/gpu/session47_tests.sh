#!/usr/bin/env bash
# One short device call (one H100/H200): build-gpu/, then the GPU tests still unrun, one ctest each in this
# order while BUDGET (default 420 s) lasts: e2e_reference_optimized_gpu (issue #42), test_compiled_draws (#43:
# the GR00T-head package's dropout draws replayed), e2e_gr00t_graphs_gpu. Whole outputs in $OUT/ctest-<name>.log.
#   bash scripts/dev/gpu/session47_tests.sh        (carry .gpu-carry)
source "$(dirname "${BASH_SOURCE[0]}")/common.sh" session47_tests
budget=${BUDGET:-420}
left() { echo $(( budget - ($(date +%s) - t0) )); }
stamp "environment"; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
stamp "build"; bash scripts/dev/gpu/build.sh || exit 1
for t in ${TESTS:-e2e_reference_optimized_gpu test_compiled_draws e2e_gr00t_graphs_gpu}; do
  [ "$(left)" -gt 20 ] || { echo "$t: not run (no time left)"; continue; }
  stamp "$t (at most $(( $(left) - 10 )) s)"
  (cd build-gpu && timeout $(( $(left) - 10 )) ctest -R "^$t" --output-on-failure > "$OUT/ctest-$t.log" 2>&1; echo "ctest exit $?")
  grep -E "Test +#|tests passed|FAILED|Failed|error" "$OUT/ctest-$t.log" | tail -8
done
stamp "done"
