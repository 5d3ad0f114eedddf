#!/usr/bin/env bash
# Issue #9 on an H200: the trainer behind its seams on a GPU. Builds, runs the
# GPU tests, then
#  1. trains n16-1b (bf16, micro-batch 32, 300 steps; configs/bench) and
#     prints throughput and the profile-step split, to compare with the
#     numbers before the seams (docs/benchmarks.md, issue 3/4);
#  2. provokes a real CUDA out-of-memory error (micro-batch 1024) and checks
#     the message names the step, the phase, the memory figures and the keys,
#     and that the process exits 1 instead of aborting.
# Carry: .gpu-carry (scripts/dev/gpu/prepare_carry.sh).
source "$(dirname "${BASH_SOURCE[0]}")/common.sh" issue9
build_test_export
CLI=build-gpu/cli/loongforge
SOCK=/tmp/lf-ctl/n16-1b.sock
stamp "train n16-1b, 300 steps"
build-gpu/src/daemon/loongforge-train --config configs/bench/n16-1b-h200.yaml --set model.path=/dev/shm/n16-1b.pt \
  --set run.output_dir=/tmp/runs --set logging.progress=lines --set logging.interval_steps=50 \
  --set control.socket=$SOCK > "$OUT/n16-1b-train.log" 2>&1 &
pid=$!
wait_for_step $SOCK 60
stamp "profile-step 8 s at step $step"
$CLI profile-step --socket $SOCK --duration 8 --output "$OUT/n16-1b-profile.json" | tail -14
$CLI status --socket $SOCK
wait $pid; echo "trainer exit $?"
tail -12 "$OUT/n16-1b-train.log"
cp /tmp/runs/n16-1b-h200/metrics.jsonl "$OUT/n16-1b-metrics.jsonl"
python3 - "$OUT/n16-1b-metrics.jsonl" <<'PY'
import json, sys, statistics
rows = [json.loads(l) for l in open(sys.argv[1])]
tail = rows[50:]
print(f"steady state (steps 51-{len(rows)}): {statistics.median(r['samples_per_s'] for r in tail):.1f} samples/s median, "
      f"{statistics.median(r['step_ms'] for r in tail):.1f} ms/step, mfu {statistics.median(r['mfu'] for r in tail):.3f}, "
      f"peak {max(r['peak_mem_mb'] for r in rows):.0f} MB")
PY
stamp "out of memory on purpose: micro-batch 1024"
build-gpu/src/daemon/loongforge-train --config configs/bench/n16-1b-h200.yaml --set model.path=/dev/shm/n16-1b.pt \
  --set run.output_dir=/tmp/runs --set run.name=oom --set trainer.micro_batch_size=1024 --set trainer.max_steps=3 \
  --set control.enable=false > "$OUT/oom.log" 2>&1
echo "exit status $? (1 expected)"
grep -E "out of memory|Memory:|To fit|saved|Newest" "$OUT/oom.log" | cut -c1-400
stamp "done"
