#!/usr/bin/env bash
# Issue #11 attribution on an H200 (no build): where forward+backward time goes
# in the n16-1b model file (scripts/dev/gpu/profile_model.py: eager and TorchScript,
# top kernels, launches) and candidate ops at its shapes (scripts/dev/gpu/bench_ops.py).
# Needs nothing carried. Writes $OUT/issue11_profile.log and $OUT/eager-trace.json.
source "$(dirname "${BASH_SOURCE[0]}")/common.sh" issue11_profile
stamp "environment"; nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
python3 -c 'import torch; print("torch", torch.__version__)'
stamp "export n16-1b"
PYTHONPATH=scripts python3 scripts/model/export.py --config n16-1b --out /dev/shm/n16-1b.pt | tail -2 || exit 1
stamp "profile the model file"
PYTHONPATH=scripts python3 scripts/dev/gpu/profile_model.py --model /dev/shm/n16-1b.pt --batch 32 \
  --trace "$OUT/eager-trace.json" ${PROFILE_ARGS:-}
stamp "candidate ops"
python3 scripts/dev/gpu/bench_ops.py --batch 32
stamp "done"
