#!/usr/bin/env bash
# Issue #11 on an H200: the model's fast layer forms (fused RMSNorm, causal flash
# attention with GQA in the LM, one SiLU of the timestep embedding for every AdaLN,
# RoPE with one cast fewer) against the model code of another commit
# (.gpu-carry/model-before: BEFORE=<commit> bash scripts/gpu/prepare_carry.sh):
#   1. build (scripts/gpu/build.sh), export n16-1b with both model codes;
#   2. loongforge-train lf-graphs on the new file, the reference trainer's optimized
#      mode (ref-opt: torch.compile + CUDA graphs, fused AdamW) on the same file, and
#      lf-graphs-before on the old one, STEPS steps each (default 150), same data;
#   3. scripts/gpu/profile_model.py --script-only on both files: forward+backward of
#      the TorchScript module (eager launches and one CUDA graph), top kernels;
#   4. scripts/gpu/bench_ops.py: candidate ops alone at n16-1b shapes (SECTIONS=ops);
#   5. ctest -L gpu -LE long, then the long GPU tests while time is left.
# Sections get what is left of a 570 s budget (one device call is 600 s at most);
# the main log is $OUT/issue11_step.log, every other log and metrics file is in
# $OUT/logs.tgz (rewritten after each section: a call returns at most 8 files).
# SECTIONS (default "train profile tests") picks sections: train profile ops tests.
source "$(dirname "${BASH_SOURCE[0]}")/common.sh" issue11_step
steps=${STEPS:-150}
sections=${SECTIONS:-train profile tests}
want() { [[ " $sections " == *" $1 "* ]]; }
left() { local l=$(( 570 - ($(date +%s) - t0) )); [ $l -lt 1 ] && l=1; [ $l -lt $1 ] && echo $l || echo $1; }  # min(limit, time left)
cfg=configs/bench/n16-1b-h200.yaml
logs=/tmp/lf-logs; rm -rf $logs; mkdir -p $logs
pack() { tar -czf "$OUT/logs.tgz" -C $logs . 2>/dev/null; }

stamp "environment"; nvidia-smi --query-gpu=name,memory.total,clocks.sm --format=csv,noheader
stamp "build"; bash scripts/gpu/build.sh || exit 1
stamp "export n16-1b (this commit, and the model code of .gpu-carry/model-before)"
PYTHONPATH=scripts python3 scripts/model/export.py --config n16-1b --out /dev/shm/n16-1b.pt | tail -1 || exit 1
before=""
if [ -f .gpu-carry/model-before/model/export.py ]; then
  python3 .gpu-carry/model-before/model/export.py --config n16-1b --out /dev/shm/n16-1b-before.pt | tail -1 \
    && before=/dev/shm/n16-1b-before.pt
  echo "before: $(cat .gpu-carry/model-before/COMMIT 2>/dev/null)"
fi

train_lf() {  # name model-file
  timeout $(left 150) build-gpu/src/daemon/loongforge-train --config $cfg --set model.path=$2 \
    --set trainer.max_steps=$steps --set run.output_dir=/tmp/runs --set run.name=$1 --set logging.progress=lines \
    --set logging.interval_steps=50 --set trainer.cuda_graphs=on > "$logs/$1.log" 2>&1; echo "$1: exit $?"
  cp /tmp/runs/$1/metrics.jsonl "$logs/$1_metrics.jsonl" 2>/dev/null; pack
}
if want train; then
  stamp "train: lf-graphs (new model)"; train_lf lf-graphs /dev/shm/n16-1b.pt
  stamp "train: ref-opt (new model)"
  PYTHONPATH=scripts timeout $(left 250) python3 scripts/reference/train_torch.py --config $cfg \
    --set model.path=/dev/shm/n16-1b.pt --set trainer.max_steps=$steps --set run.output_dir=/tmp/runs --mode optimized \
    --loongforge-train build-gpu/src/daemon/loongforge-train --out /tmp/runs/ref-opt > "$logs/ref-opt.log" 2>&1
  echo "ref-opt: exit $?"; tail -2 "$logs/ref-opt.log"
  cp /tmp/runs/ref-opt/metrics.jsonl "$logs/ref-opt_metrics.jsonl" 2>/dev/null; pack
  if [ -n "$before" ]; then stamp "train: lf-graphs-before"; train_lf lf-graphs-before $before; fi
  stamp "steady state (steps 51-$steps)"
  python3 scripts/gpu/steady_state.py $logs lf-graphs lf-graphs-before ref-opt
fi
if want profile; then
  for f in /dev/shm/n16-1b.pt $before; do
    stamp "profile $f"
    PYTHONPATH=scripts timeout $(left 60) python3 scripts/gpu/profile_model.py --model $f --batch 32 --top 40 \
      --iters 10 --script-only > "$logs/profile-$(basename $f .pt).log" 2>&1; echo "exit $?"
    grep -E "forward\+backward|device events" "$logs/profile-$(basename $f .pt).log"; pack
  done
fi
if want ops; then
  stamp "candidate ops (scripts/gpu/bench_ops.py)"
  timeout $(left 90) python3 scripts/gpu/bench_ops.py --batch 32 2>&1 | tee "$logs/bench_ops.log" | grep -v Warning; pack
fi
if want tests; then
  stamp "gpu tests"
  (cd build-gpu && timeout $(left 120) ctest -L gpu -LE long --output-on-failure > "$logs/ctest-gpu.log" 2>&1; echo "ctest exit $?")
  grep -E "Test +#|tests passed|FAILED|Failed" "$logs/ctest-gpu.log" | tail -14; pack
  if [ "$(left 300)" -gt 60 ]; then
    stamp "long gpu tests (while time is left)"
    (cd build-gpu && timeout $(left 300) ctest -L gpu -L long --output-on-failure > "$logs/ctest-gpu-long.log" 2>&1; echo "ctest exit $?")
    grep -E "Test +#|tests passed|FAILED|Failed" "$logs/ctest-gpu-long.log" | tail -6; pack
  fi
fi
stamp "done"
