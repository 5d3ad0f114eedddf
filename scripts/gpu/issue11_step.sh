#!/usr/bin/env bash
# Issue #11 on an H200: the model's fast layer forms (fused RMSNorm, causal flash
# attention with GQA in the LM, the grouped per-embodiment GEMM) against the
# model of the commit named by .gpu-carry/model-before (scripts/gpu/prepare_carry.sh
# copies scripts/model/ of BEFORE=<commit>, default HEAD), then the trainers:
#   1. build (scripts/gpu/build.sh), export n16-1b with both model codes;
#   2. scripts/gpu/profile_model.py on both files: forward+backward of the
#      TorchScript module eagerly and as one CUDA graph, top kernels;
#   3. scripts/gpu/bench_ops.py: the candidate ops alone at n16-1b shapes;
#   4. loongforge-train lf-graphs on each file and the reference trainer's
#      optimized mode (ref-opt) on the new one, STEPS steps (default 150), same data;
#   5. ctest -L gpu (the AOTInductor package test e2e_compiled_step_gpu among them).
# Every section has its own time limit so that the whole fits one device call
# (10 minutes); logs and metrics go to $OUT. SECTIONS (default "all") picks
# sections by name: profile ops train tests.
source "$(dirname "${BASH_SOURCE[0]}")/common.sh" issue11_step
steps=${STEPS:-150}
sections=${SECTIONS:-profile ops train tests}
want() { [[ " $sections " == *" $1 "* ]]; }
cfg=configs/bench/n16-1b-h200.yaml

stamp "environment"; nvidia-smi --query-gpu=name,memory.total,clocks.sm --format=csv,noheader
git log --oneline -1 2>/dev/null || true
stamp "build"; bash scripts/gpu/build.sh || exit 1
stamp "export n16-1b (this commit, and the model code of .gpu-carry/model-before)"
PYTHONPATH=scripts python3 scripts/model/export.py --config n16-1b --out /dev/shm/n16-1b.pt | tail -1 || exit 1
before=""
if [ -f .gpu-carry/model-before/model/export.py ]; then
  python3 .gpu-carry/model-before/model/export.py --config n16-1b --out /dev/shm/n16-1b-before.pt | tail -1 \
    && before=/dev/shm/n16-1b-before.pt
  cat .gpu-carry/model-before/COMMIT 2>/dev/null
fi

if want profile; then
  for f in $before /dev/shm/n16-1b.pt; do
    stamp "profile $f"
    PYTHONPATH=scripts timeout 120 python3 scripts/gpu/profile_model.py --model $f --batch 32 --top 25 \
      > "$OUT/profile-$(basename $f .pt).log" 2>&1
    grep -E "forward\+backward|regions|device events" "$OUT/profile-$(basename $f .pt).log"
  done
fi
if want ops; then
  stamp "candidate ops (scripts/gpu/bench_ops.py)"
  timeout 90 python3 scripts/gpu/bench_ops.py --batch 32 2>&1 | tee "$OUT/bench_ops.log" | grep -v Warning
fi

train_lf() {  # name model-file
  timeout 150 build-gpu/src/daemon/loongforge-train --config $cfg --set model.path=$2 --set trainer.max_steps=$steps \
    --set run.output_dir=/tmp/runs --set run.name=$1 --set logging.progress=lines --set logging.interval_steps=50 \
    --set trainer.cuda_graphs=on > "$OUT/$1.log" 2>&1; echo "$1: exit $?"
  cp /tmp/runs/$1/metrics.jsonl "$OUT/$1_metrics.jsonl" 2>/dev/null
}
if want train; then
  stamp "train: lf-graphs (new model)"; train_lf lf-graphs /dev/shm/n16-1b.pt
  if [ -n "$before" ]; then stamp "train: lf-graphs-before"; train_lf lf-graphs-before $before; fi
fi
if want tests; then
  stamp "gpu tests"
  (cd build-gpu && timeout 240 ctest -L gpu --output-on-failure > "$OUT/ctest-gpu.log" 2>&1; echo "ctest exit $?")
  grep -E "Test +#|tests passed|FAILED|Failed" "$OUT/ctest-gpu.log" | tail -20
fi
if want train; then
  stamp "train: ref-opt (new model)"
  PYTHONPATH=scripts timeout 200 python3 scripts/reference/train_torch.py --config $cfg --set model.path=/dev/shm/n16-1b.pt \
    --set trainer.max_steps=$steps --set run.output_dir=/tmp/runs --mode optimized \
    --loongforge-train build-gpu/src/daemon/loongforge-train --out /tmp/runs/ref-opt > "$OUT/ref-opt.log" 2>&1
  echo "ref-opt: exit $?"; tail -2 "$OUT/ref-opt.log"
  cp /tmp/runs/ref-opt/metrics.jsonl "$OUT/ref-opt_metrics.jsonl" 2>/dev/null
fi

stamp "steady state (steps 51-$steps)"
python3 scripts/gpu/steady_state.py "$OUT" lf-graphs lf-graphs-before ref-opt
stamp "done"
