#!/usr/bin/env bash
# Issue #11 item 6 on an H200 (no build, nothing carried): the joint
# forward+backward of n16-1b compiled by AOTInductor, checked against eager
# autograd and timed against eager, TorchScript (+CUDA graph) and
# torch.compile reduce-overhead (scripts/dev/gpu/compiled_step.py). The package is
# left in $OUT/step-n16-1b-b32.pt2 when it fits.
source "$(dirname "${BASH_SOURCE[0]}")/common.sh" issue11_compiled
stamp "environment"; nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
PYTHONPATH=scripts python3 scripts/dev/gpu/compiled_step.py --config ${CONFIG:-n16-1b} --batch ${BATCH:-32} \
  --package /dev/shm/step.pt2 ${COMPILED_ARGS:-}
cp /dev/shm/step.pt2 "$OUT/step-${CONFIG:-n16-1b}-b${BATCH:-32}.pt2" 2>/dev/null
stamp "done"
