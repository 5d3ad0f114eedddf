#!/usr/bin/env bash
# Issue #11 on an H200, all in one run on the same model file and data:
# n16-1b (bf16, micro-batch 32, configs/bench) trained STEPS steps by
#   lf-eager   loongforge-train, trainer.cuda_graphs=off, fused AdamW
#   lf-graphs  loongforge-train, trainer.cuda_graphs=on (forward+backward replayed
#              as a CUDA graph), fused AdamW; profile-step of its steady state
#   ref-base   the reference PyTorch trainer, baseline mode (eager, fused AdamW, DataLoader)
#   ref-opt    the reference PyTorch trainer, optimized mode (torch.compile
#              reduce-overhead: Inductor kernels + CUDA graphs, fused AdamW, DataLoader)
#   lf-compiled loongforge-train, trainer.compiled_step: an AOTInductor package of the
#              micro-step compiled here first (scripts/compile_step.py, minutes)
# after the GPU tests (ctest -L gpu). Prints a table of median samples/s over
# steps 51..STEPS (lf-graphs leaves out steps 55..100, around its profile-step).
# Carry: .gpu-carry (scripts/dev/gpu/prepare_carry.sh). STEPS (default 200); RUNS
# (default "lf-eager lf-graphs ref-base ref-opt").
source "$(dirname "${BASH_SOURCE[0]}")/common.sh" issue11
build_test_export
cfg=configs/bench/n16-1b-h200.yaml
steps=${STEPS:-200}
runs=${RUNS:-lf-eager lf-graphs ref-base ref-opt lf-compiled}
common=(--config $cfg --set model.path=/dev/shm/n16-1b.pt --set trainer.max_steps=$steps
        --set run.output_dir=/tmp/runs --set logging.progress=lines --set logging.interval_steps=50)
for run in $runs; do
  stamp "$run"
  case $run in
    lf-eager)
      build-gpu/src/daemon/loongforge-train "${common[@]}" --set run.name=$run --set trainer.cuda_graphs=off \
        > "$OUT/$run.log" 2>&1; echo "exit $?" ;;
    lf-graphs)
      SOCK=/tmp/lf-ctl/graphs.sock
      build-gpu/src/daemon/loongforge-train "${common[@]}" --set run.name=$run --set trainer.cuda_graphs=on \
        --set control.socket=$SOCK > "$OUT/$run.log" 2>&1 &
      pid=$!
      wait_for_step $SOCK 60
      build-gpu/cli/loongforge status --socket $SOCK --json > "$OUT/$run-status.json"
      build-gpu/cli/loongforge profile-step --socket $SOCK --duration 2 --output "$OUT/$run-profile.json" | tail -12
      wait $pid; echo "exit $?" ;;
    lf-compiled)
      PYTHONPATH=scripts python3 scripts/compile_step.py /dev/shm/n16-1b.pt --batch-size 32 --device cuda \
        --precision bf16 --out /dev/shm/n16-1b-step.pt2 2>&1 | grep -v Warning | tail -3
      build-gpu/src/daemon/loongforge-train "${common[@]}" --set run.name=$run \
        --set trainer.compiled_step=/dev/shm/n16-1b-step.pt2 > "$OUT/$run.log" 2>&1; echo "exit $?" ;;
    ref-base|ref-opt)
      mode=baseline; [ $run = ref-opt ] && mode=optimized
      PYTHONPATH=scripts python3 scripts/reference/train_torch.py --config $cfg --set model.path=/dev/shm/n16-1b.pt \
        --set trainer.max_steps=$steps --set run.output_dir=/tmp/runs --mode $mode \
        --loongforge-train build-gpu/src/daemon/loongforge-train --out /tmp/runs/$run > "$OUT/$run.log" 2>&1
      echo "exit $?" ;;
  esac
  tail -3 "$OUT/$run.log"
  cp /tmp/runs/$run/metrics.jsonl "$OUT/${run}_metrics.jsonl" 2>/dev/null
done

stamp "steady state (steps 51-$steps, one run each, same machine)"
python3 scripts/dev/gpu/steady_state.py "$OUT" $runs --skip-steps lf-graphs:55-100
stamp "done"
