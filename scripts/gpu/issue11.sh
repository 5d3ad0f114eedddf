#!/usr/bin/env bash
# Issue #11 increments on an H200, all in one run on the same model file and
# data: n16-1b (bf16, micro-batch 32, configs/bench) trained by
#   loongforge-train with optimizer.implementation=plain (per-tensor AdamW),
#   loongforge-train with optimizer.implementation=fused (ATen multi-tensor
#   AdamW + foreach clipping), with a profile-step of its steady state,
#   the reference PyTorch trainer, baseline mode (fused AdamW, DataLoader);
# then a real CUDA out-of-memory error (micro-batch 1024) to check its message.
# Prints a table of median samples/s over the steady state (steps 51..STEPS).
# Carry: .gpu-carry (scripts/gpu/prepare_carry.sh). STEPS (default 200).
source "$(dirname "${BASH_SOURCE[0]}")/common.sh" issue11
build_test_export
cfg=configs/bench/n16-1b-h200.yaml
steps=${STEPS:-200}
common=(--config $cfg --set model.path=/dev/shm/n16-1b.pt --set trainer.max_steps=$steps
        --set run.output_dir=/tmp/runs --set logging.progress=lines --set logging.interval_steps=50)
stamp "loongforge-train, plain AdamW"
build-gpu/src/daemon/loongforge-train "${common[@]}" --set run.name=plain --set optimizer.implementation=plain \
  > "$OUT/plain.log" 2>&1; echo "exit $?"; tail -3 "$OUT/plain.log"
cp /tmp/runs/plain/metrics.jsonl "$OUT/plain_metrics.jsonl"

stamp "loongforge-train, fused AdamW (profiled at step 60)"
SOCK=/tmp/lf-ctl/fused.sock
build-gpu/src/daemon/loongforge-train "${common[@]}" --set run.name=fused --set optimizer.implementation=fused \
  --set control.socket=$SOCK > "$OUT/fused.log" 2>&1 &
pid=$!
wait_for_step $SOCK 60
build-gpu/cli/loongforge profile-step --socket $SOCK --duration 6 --output "$OUT/fused-profile.json" | tail -12
wait $pid; echo "exit $?"; tail -3 "$OUT/fused.log"
cp /tmp/runs/fused/metrics.jsonl "$OUT/fused_metrics.jsonl"

stamp "reference PyTorch trainer, baseline mode"
PYTHONPATH=scripts python3 scripts/reference/train_torch.py --config $cfg --set model.path=/dev/shm/n16-1b.pt \
  --set trainer.max_steps=$steps --set run.output_dir=/tmp/runs --mode baseline \
  --loongforge-train build-gpu/src/daemon/loongforge-train --out /tmp/runs/torch > "$OUT/torch.log" 2>&1
echo "exit $?"; tail -3 "$OUT/torch.log"
cp /tmp/runs/torch/metrics.jsonl "$OUT/torch_metrics.jsonl" 2>/dev/null

stamp "steady state (steps 51-$steps, one run each, same machine)"
python3 - "$OUT" <<'PY'
import json, statistics, sys, pathlib
out = pathlib.Path(sys.argv[1])
rows = {}
for name in ("plain", "fused", "torch"):
    f = out / f"{name}_metrics.jsonl"
    if f.exists():
        recs = [json.loads(l) for l in f.read_text().splitlines() if l.strip()]
        tail = [r for r in recs if r["step"] > 50 and not (60 <= r["step"] <= 120 and name == "fused")]
        rows[name] = (statistics.median(r["samples_per_s"] for r in tail), statistics.median(r["step_ms"] for r in tail),
                      max(r.get("peak_mem_mb", 0) for r in recs), len(tail))
for name, (sps, ms, peak, n) in rows.items():
    print(f"{name:6s} {sps:8.1f} samples/s  {ms:7.1f} ms/step  peak {peak:7.0f} MB  ({n} steps)")
if "plain" in rows and "fused" in rows:
    print(f"fused / plain = {rows['fused'][0] / rows['plain'][0]:.2f}x")
if "torch" in rows and "fused" in rows:
    print(f"fused / reference baseline = {rows['fused'][0] / rows['torch'][0]:.2f}x")
PY

stamp "out of memory on purpose: micro-batch 1024"
build-gpu/src/daemon/loongforge-train --config $cfg --set model.path=/dev/shm/n16-1b.pt --set run.output_dir=/tmp/runs \
  --set run.name=oom --set trainer.micro_batch_size=1024 --set trainer.max_steps=3 --set control.enable=false \
  > "$OUT/oom.log" 2>&1
echo "exit status $? (1 expected)"
grep -E "out of memory|Memory:|To fit|saved|Newest|unexpected" "$OUT/oom.log" | cut -c1-600
stamp "done"
