#!/usr/bin/env bash
# Issue #48's drill on GPU ranks: test/comm/test_fault_tolerance.py with each of its four ranks on a GPU of
# its own (NCCL; LOCAL_RANK = the rank), on a host with at least 4 GPUs (carry .gpu-carry:
# scripts/dev/gpu/prepare_carry.sh). Not run yet: no multi-GPU machine is lent to the project.
#   bash scripts/dev/gpu/fault_drill.sh            # every case but the 5-cycle long form
#   K=cycles LOONGFORGE_TEST_FAULT_CYCLES=5 bash scripts/dev/gpu/fault_drill.sh
# The GPU host has no FFmpeg CLI, so the ranks read the bundled dataset (not the suite's 64-pixel copy).
source "$(dirname "${BASH_SOURCE[0]}")/common.sh" fault-drill
n=$(nvidia-smi --list-gpus | wc -l)
[ "$n" -ge 4 ] || { echo "the drill needs 4 GPUs, this host has $n"; exit 1; }
stamp "build"
bash scripts/dev/gpu/build.sh || exit 1
(cd build-gpu && ctest -R '^(export_test_models|convert_test_dataset)$' > "$OUT/fixtures.log" 2>&1) ||
  { tail -20 "$OUT/fixtures.log"; exit 1; }
stamp "test_fault_tolerance.py on 4 GPU ranks"
LOONGFORGE_TEST_FAULT_DEVICE=cuda LOONGFORGE_TRAIN=build-gpu/src/daemon/loongforge-train LOONGFORGE_CLI=build-gpu/cli/loongforge \
  LOONGFORGE_TEST_DATASET=build-gpu/test-data/robot_sim.PickNPlace.lf LOONGFORGE_TEST_MODELS=build-gpu/test-models \
  python3 -m pytest -s -x -k "${K:-not cycles}" test/comm/test_fault_tolerance.py 2>&1 | tail -60
stamp "done"
