#!/usr/bin/env bash
# A C++ compiler wrapper that logs each call's wall time, for attributing a package compile
# (Inductor runs $CXX for the package's wrapper and kernels):
#   CXX=scripts/dev/time_cxx.sh TIME_CXX_LOG=/tmp/cxx.log python3 scripts/compile_step.py MODEL.pt ...
# One line per call: seconds, exit status, the -O flag and the .cpp files it compiled.
t0=$(date +%s.%N)
"${TIME_CXX_REAL:-g++}" "$@"
rc=$?
printf '%.1f s rc=%d %s\n' "$(echo "$(date +%s.%N) - $t0" | bc)" "$rc" \
  "$(printf '%s\n' "$@" | grep -E '^-O|\.cpp$' | xargs -r -n1 basename | tr '\n' ' ')" >> "${TIME_CXX_LOG:-/tmp/time_cxx.log}"
exit $rc
