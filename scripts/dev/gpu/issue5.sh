#!/usr/bin/env bash
# Issue #5 on an H200: checkpoint stall and write throughput for n16-3b.
# Trains n16-3b (bf16, micro-batch 8) for 50 steps with a checkpoint at step
# 40 (asynchronous write: the stall is the copy into pinned host buffers that a
# helper thread allocated while training started) and the final one at step
# 50. Checkpoints go to local disk with
# keep_last 1; the exported model lives in /dev/shm to leave disk room.
# Carry: .gpu-carry (scripts/dev/gpu/prepare_carry.sh).
source "$(dirname "${BASH_SOURCE[0]}")/common.sh" issue5
stamp "environment"; nvidia-smi --query-gpu=name,memory.total --format=csv,noheader; df -h /tmp | tail -1; free -g | head -2
stamp "build"; bash scripts/dev/gpu/build.sh || exit 1
stamp "export n16-3b"
PYTHONPATH=scripts python3 scripts/model/export.py --config n16-3b --out /dev/shm/n16-3b.pt | tail -4 || exit 1
ls -la /dev/shm/n16-3b.pt
stamp "train n16-3b, 50 steps, async checkpoint at 40 and 50"
build-gpu/src/daemon/loongforge-train --config configs/bench/n16-1b-h200.yaml --set model.path=/dev/shm/n16-3b.pt \
  --set run.name=n16-3b-ckpt --set run.output_dir=/tmp/runs --set trainer.micro_batch_size=8 \
  --set trainer.max_steps=50 --set checkpoint.interval_steps=40 --set checkpoint.keep_last=1 \
  --set checkpoint.async_write=true --set logging.interval_steps=5 --set logging.progress=lines 2>&1 | tail -30
cp /tmp/runs/n16-3b-ckpt/metrics.jsonl "$OUT/n16-3b_metrics.jsonl"
python3 - <<'PY'
import json
rows = [json.loads(l) for l in open("/tmp/runs/n16-3b-ckpt/metrics.jsonl")]
for r in rows:
    if r["checkpoint_stall_ms"] > 0:
        print(f"step {r['step']}: checkpoint stall {r['checkpoint_stall_ms']:.0f} ms, step time {r['step_ms']:.0f} ms")
steps = sorted(r["step_ms"] for r in rows[1:])
print(f"median step {steps[len(steps)//2]:.0f} ms")
PY
ls /tmp/runs/n16-3b-ckpt/checkpoints; du -sh /tmp/runs/n16-3b-ckpt/checkpoints/* 2>/dev/null
stamp "done"
