#!/usr/bin/env bash
# The whole test suite: set up what is missing (scripts/setup.sh), build, run
# every CPU test through ctest. GPU tests are separate: ctest -L gpu.
#
#   bash scripts/test.sh [extra ctest args, e.g. -R config]
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${LOONGFORGE_BUILD:-$repo/build}
t0=$(date +%s)
bash "$repo/scripts/setup.sh"
echo "== [test] running ctest (CPU tests; label gpu excluded)"
ctest --test-dir "$build" -LE gpu --output-on-failure --timeout 1500 -j"$(nproc)" "$@"
echo "== [test] setup + build + tests took $(( $(date +%s) - t0 ))s"
