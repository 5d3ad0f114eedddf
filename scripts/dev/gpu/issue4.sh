#!/usr/bin/env bash
# Issue #4 on an H200: the control plane against a GPU run. Builds, runs the
# GPU tests, then trains n16-1b (bf16, micro-batch 32) and drives the CLI:
# status, profile-step (10 s: per-phase times with device syncs, Chrome
# trace), checkpoint-now (validated), stop (exit 0 expected). Writes the
# profile, trace, status and logs to $OUT.
# Carry: .gpu-carry (scripts/dev/gpu/prepare_carry.sh).
source "$(dirname "${BASH_SOURCE[0]}")/common.sh" issue4
build_test_export
CLI=build-gpu/cli/loongforge
SOCK=/tmp/lf-ctl/n16-1b.sock
stamp "train n16-1b in the background"
build-gpu/src/daemon/loongforge-train --config configs/bench/n16-1b-h200.yaml --set model.path=/dev/shm/n16-1b.pt \
  --set run.output_dir=/tmp/runs --set trainer.max_steps=100000 --set logging.progress=lines \
  --set logging.interval_steps=20 --set checkpoint.keep_last=1 --set control.socket=$SOCK > "$OUT/n16-1b-train.log" 2>&1 &
pid=$!
# Let it warm up (first video decodes, allocator growth) before profiling.
wait_for_step $SOCK 30
stamp "status at step $step"
$CLI status --socket $SOCK; $CLI status --socket $SOCK --json > "$OUT/n16-1b-status.json"
stamp "profile-step 10 s"
$CLI profile-step --socket $SOCK --duration 10 --output "$OUT/n16-1b-profile.json"; echo "exit $?"
python3 -c "import json; t=json.load(open('$OUT/n16-1b-profile.trace.json')); print(len(t['traceEvents']), 'trace events')"
stamp "checkpoint-now"
$CLI checkpoint-now --socket $SOCK; echo "exit $?"
ckpt=$(ls -d /tmp/runs/n16-1b-h200/checkpoints/* | tail -1)
$CLI validate-checkpoint "$ckpt"; echo "validate exit $?"
stamp "engine verbs"
$CLI mla-stats --socket $SOCK; echo "exit $?"
stamp "stop"
$CLI stop --socket $SOCK; echo "stop exit $?"
wait $pid; echo "trainer exit $?"
tail -15 "$OUT/n16-1b-train.log"
[ -S $SOCK ] && echo "socket still there" || echo "socket removed"
cp /tmp/runs/n16-1b-h200/metrics.jsonl "$OUT/n16-1b-metrics.jsonl"
python3 scripts/plot_metrics.py /tmp/runs/n16-1b-h200 --out-dir "$OUT" | tail -3
stamp "done"
