#!/usr/bin/env bash
# Issue #13's scaling table on the H200 machines (NCCL): per-GPU throughput of
# loongforge-train with gradient communication plain (GCTS off), GCTS `simple`,
# `hybrid` and `hybrid` with the sharded optimizer, against the reference
# trainer's PyTorch DDP (ref-ddp: --mode baseline; torchrun at several GPUs;
# ref-opt, not in the default RUNS for its compile time: --mode optimized,
# torch.compile with CUDA graphs, the strongest baseline), at every
# world size in WORLDS (default: 1 and, on a machine with more GPUs, all of
# them). Same config for all (configs/bench/n16-1b-h200.yaml: bf16, micro-batch
# 32 per GPU, accumulation 1, so the global batch grows with the GPUs), STEPS
# steps each (default 150), steady state = steps after 50. Prints per run the
# median samples/s per GPU, ms/step, exposed communication (metrics.jsonl's
# exposed_comm_ms: reduction after backward and a sharded optimizer's gather
# wait; the reference does not report it), peak device memory and MFU, and the
# scaling efficiency of each setting against its own 1-GPU run in the same call, and for the lf runs
# the optimizer memory per rank (rank 0's AdamW moments and communication buffers, from its run line).
# Under CUDA graphs (the config's default) the GCTS runs at several GPUs
# reduce inside the last micro-batch's graph (Note [Reduction in the graph]);
# lf-after (not in the default RUNS) is hybrid with gcts.overlap=false, the
# reduction after the graph, to measure which is faster. lf-casts (not in the
# default RUNS) is lf-plain with precision.bf16_weights=off: fp32 weights cast
# by autocast in every forward, the fast path before bf16 working copies;
# lf-adfe (not in the default RUNS) is lf-plain with ADFE's asynchronous data
# pipeline on (the bench config leaves it off). lf-copies (not in the default
# RUNS) is lf-hybrid with precision.bf16_weights=on: at several GPUs, bf16
# working copies whose gradients autograd sums in fp32 (auto keeps fp32
# weights there); at one GPU the same as lf-hybrid. lf-sharded-copies (not in
# the default RUNS) is lf-sharded with precision.bf16_weights=on. lf-on (not in the default RUNS) is
# lf-plain with precision.bf16_weights=on: with SETS="trainer.gradient_accumulation_steps=2", the
# working copies whose gradients sum in fp32 against auto's fp32 weights at one GPU.
# lf-switch (not in the default RUNS) is lf-hybrid that `loongforge switch-strategy --strategy simple`
# (sent to rank 0 once step SWITCH_AT, default 100, is done) turns into simple for the rest of the run:
# the answer's applied_at_step, and medians before and after it, are printed (issue #15 asks for a
# switch during the run). CTL=1: each GCTS run (gcts.enable) takes one `monitor-comm --json --buckets`
# record of rank 0 once step 60 is done ($OUT/<run>-monitor-comm.json; its groups are printed).
# SETS="key=value ..." adds trainer overrides to every run, the reference's included.
# Builds build-gpu/ first; TESTS=1 also runs the GPU tests (LONG=0 form);
# PROFILE=1 takes a 2-second `profile-step --kernels` at step 60 of each
# one-GPU loongforge run ($OUT/<run>-w1-profile.json) and tallies the kernels of
# steps 60-75 of each one-GPU reference run the same way (train_torch.py
# --profile-steps, printed from its log); steps 55-100 are then left out of the table. Checkpoints go to /dev/shm (the final one of n16-1b is 7.9 GB)
# and are removed after each run; run directories go to $OUT/runs.
# Carry: .gpu-carry (scripts/dev/gpu/prepare_carry.sh).
# ONE_RANK_WORLD=1: the one-GPU lf runs communicate through a one-rank NCCL World (the trainer's
# LOONGFORGE_TEST_ONE_RANK_WORLD hook), so lf-hybrid reduces inside the graph and lf-after after it
# at one GPU: the cost of each placement's packing, copies and launches without a second GPU.
# EXPORT_SET="key=value ..." passes model overrides to the export (gr00t-n1.6-3b on the bundled
# dataset needs "max_state_dim=64 max_action_dim=64": its state and action are 44 wide).
#   [WORLDS="1 2"] [MODEL=n16-1b] [EXPORT_SET=...] [SETS=...] [STEPS=150] [RUNS="lf-plain ..."] [TESTS=1] [PROFILE=1] bash scripts/dev/gpu/gcts_scaling.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh" gcts_scaling
model=${MODEL:-n16-1b}; steps=${STEPS:-150}
# The run directories (metrics, summaries; no checkpoints) live under $OUT, so a call that the device
# tool's time limit ends still brings back every finished step's metrics.
runs_dir=$OUT/runs
if [ "${PROFILE:-0}" = 1 ] && [ "$steps" -lt 100 ]; then
  echo "PROFILE=1 profiles 2 s from step 60, about 25 steps of a fast model: set STEPS to 100 or more" >&2
  exit 2
fi
gpus=$(nvidia-smi -L | wc -l)
worlds=${WORLDS:-1 $([ "$gpus" -gt 1 ] && echo "$gpus")}
runs=${RUNS:-lf-plain lf-simple lf-hybrid lf-sharded ref-ddp}
stamp "environment: $gpus GPU(s), worlds $worlds, $model, $steps steps"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
# BUILD_TARGETS="loongforge-train loongforge" builds only what the runs use; TESTS=1 builds everything.
targets=${BUILD_TARGETS:-}; [ "${TESTS:-0}" = 1 ] && targets=
stamp "build"; bash scripts/dev/gpu/build.sh $targets || exit 1
if [ "${TESTS:-0}" = 1 ]; then
  stamp "gpu tests"
  (cd build-gpu && ctest -L gpu -LE long --output-on-failure --timeout 600 > "$OUT/ctest.log" 2>&1)
  tail -${GPU_TEST_LINES:-30} "$OUT/ctest.log"  # all of it in $OUT/ctest.log
fi
stamp "export $model"
xsets=(); for kv in ${EXPORT_SET:-}; do xsets+=(--set "$kv"); done
PYTHONPATH=scripts python3 scripts/model/export.py --config $model "${xsets[@]}" --out /dev/shm/$model.pt | tail -1 || exit 1
cfg=configs/bench/n16-1b-h200.yaml
common=(--config $cfg --set model.path=/dev/shm/$model.pt --set trainer.max_steps=$steps --set run.output_dir=$runs_dir
        --set logging.progress=lines --set logging.interval_steps=50)
for kv in ${SETS:-}; do common+=(--set "$kv"); done
names=()
for w in $worlds; do
  for run in $runs; do
    name=$run-w$w
    stamp "$name"
    rm -rf "$runs_dir/$name" "$OUT/${name}_metrics.jsonl"  # a failed run must not show an earlier call's metrics
    case $run in
      lf-plain) sets=() ;;
      lf-casts) sets=(--set precision.bf16_weights=off) ;;
      lf-on) sets=(--set precision.bf16_weights=on) ;;
      lf-adfe) sets=(--set adfe.enable=true) ;;
      lf-copies) sets=(--set gcts.enable=true --set gcts.comm_strategy=hybrid --set precision.bf16_weights=on) ;;
      lf-simple) sets=(--set gcts.enable=true --set gcts.comm_strategy=simple) ;;
      lf-hybrid|lf-switch) sets=(--set gcts.enable=true --set gcts.comm_strategy=hybrid) ;;
      lf-after) sets=(--set gcts.enable=true --set gcts.comm_strategy=hybrid --set gcts.overlap=false) ;;
      lf-sharded) sets=(--set gcts.enable=true --set gcts.comm_strategy=hybrid --set gcts.shard_optimizer=true) ;;
      lf-sharded-copies) sets=(--set gcts.enable=true --set gcts.comm_strategy=hybrid --set gcts.shard_optimizer=true
                               --set precision.bf16_weights=on) ;;
    esac
    case $run in
      lf-*)
        ctl=(--set control.enable=false)
        prof=0; [ "${PROFILE:-0}" = 1 ] && [ "$w" = 1 ] && prof=1
        monitor=0; [ "${CTL:-0}" = 1 ] && [[ " ${sets[*]} " == *" gcts.enable=true "* ]] && monitor=1
        # A socket per rank ({rank}: the trainer puts its rank there); rank 0's is the one spoken to.
        sock=/tmp/lf-ctl/$name-0.sock
        { [ $prof = 1 ] || [ $monitor = 1 ] || [ $run = lf-switch ]; } &&
          ctl=(--set "control.socket=/tmp/lf-ctl/$name-{rank}.sock")
        rw=(); [ "${ONE_RANK_WORLD:-0}" = 1 ] && [ "$w" = 1 ] && rw=(LOONGFORGE_TEST_ONE_RANK_WORLD=1)
        env "${rw[@]}" LOONGFORGE_TRAIN=build-gpu/src/daemon/loongforge-train LOG_DIR=/tmp/logs/$name timeout 400 \
          bash scripts/launch_local.sh $w "${common[@]}" --set run.name=$name "${sets[@]}" "${ctl[@]}" \
          --set checkpoint.dir=/dev/shm/ckpt/$name > "$OUT/$name.log" 2>&1 &
        pid=$!
        if [ $prof = 1 ] && wait_for_step $sock 60 $pid; then
          build-gpu/cli/loongforge profile-step --socket $sock --duration 2 --kernels \
            --output "$OUT/$name-profile.json" | tail -24
        fi
        if [ $monitor = 1 ] && wait_for_step "$sock" 60 $pid; then
          build-gpu/cli/loongforge monitor-comm --socket "$sock" --count 1 --buckets --json \
            > "$OUT/$name-monitor-comm.json" 2>&1
          summarize_monitor "$OUT/$name-monitor-comm.json"
        fi
        if [ $run = lf-switch ] && wait_for_step "$sock" "${SWITCH_AT:-100}" $pid; then
          build-gpu/cli/loongforge switch-strategy --socket "$sock" --strategy simple --json \
            > "$OUT/$name-switch.json" 2>&1
          cat "$OUT/$name-switch.json"
        fi
        wait $pid; echo "exit $?"
        rm -rf /dev/shm/ckpt
        grep -m1 -E "gradient communication" "$OUT/$name.log" | cut -c1-300
        cp $runs_dir/$name/metrics.jsonl "$OUT/${name}_metrics.jsonl" 2>/dev/null ;;
      ref-ddp|ref-opt)
        mode=baseline; [ $run = ref-opt ] && mode=optimized
        launcher=(python3); [ "$w" -gt 1 ] && launcher=(torchrun --standalone --nproc_per_node $w)
        rprof=(); [ "${PROFILE:-0}" = 1 ] && [ "$w" = 1 ] && rprof=(--profile-steps 60:76)
        PYTHONPATH=scripts timeout 400 "${launcher[@]}" scripts/reference/train_torch.py "${common[@]}" \
          --set control.enable=false "${rprof[@]}" \
          --set run.name=$name --mode $mode --loongforge-train build-gpu/src/daemon/loongforge-train \
          --out $runs_dir/$name > "$OUT/$name.log" 2>&1
        echo "exit $?"
        grep -A 24 "^kernels over" "$OUT/$name.log" | head -25
        cp $runs_dir/$name/metrics.jsonl "$OUT/${name}_metrics.jsonl" 2>/dev/null ;;
    esac
    tail -2 "$OUT/$name.log" | cut -c1-300
    names+=("$name")
  done
done
stamp "steady state (steps after 50)"
PROFILE=${PROFILE:-0} python3 - "$OUT" "${names[@]}" <<'PY'
import json, os, re, statistics as st, sys
from pathlib import Path
out, names = Path(sys.argv[1]), sys.argv[2:]
profiled = os.environ["PROFILE"] == "1"
rows = {}
for n in names:
    f = out / f"{n}_metrics.jsonl"
    if not f.exists():
        print(f"{n}: no metrics"); continue
    recs = [json.loads(l) for l in f.read_text().splitlines() if l.strip()]
    run, w = n.rsplit("-w", 1)
    skip = profiled and w == "1"  # profile-step and --profile-steps slow the steps they profile
    tail = [r for r in recs if r["step"] > 50 and not (skip and 55 <= r["step"] <= 100)]
    if not tail:
        print(f"{n}: fewer than 51 steps"); continue
    w = int(w)
    sps = st.median(r["samples_per_s"] for r in tail)
    per_gpu = sps / w if run.startswith("ref") else sps  # the reference reports the job's samples/s
    rows[n] = dict(run=run, w=w, per_gpu=per_gpu, ms=st.median(r["step_ms"] for r in tail),
                   exposed=st.median(r.get("exposed_comm_ms", 0.0) for r in tail),
                   mem=max(r.get("peak_mem_mb", 0.0) for r in recs), mfu=st.median(r.get("mfu", 0.0) for r in tail),
                   n=len(tail), moments="-", buffers="-")
    # rank 0's run line: "(moments X MB on this rank)", the optimizer memory per rank, and its
    # "Y MB of communication buffers" (a sharded optimizer's; Z MB of fp32 masters are not in it)
    text = log.read_text(errors="replace") if (log := out / f"{n}.log").exists() else ""
    m = re.search(r"\(moments ([0-9.]+) MB on this rank\)", text)
    if m:
        rows[n]["moments"] = m.group(1)
        b = re.search(r"([0-9.]+) MB of communication buffers", text)
        rows[n]["buffers"] = b.group(1) if b else "0"
print(f"{'run':18} {'GPUs':>4} {'samples/s/GPU':>13} {'ms/step':>8} {'exposed ms':>10} {'exposed %':>9} "
      f"{'peak MB':>8} {'moments MB':>10} {'buffers MB':>10} {'MFU':>6} {'scaling':>8}")
for n, r in rows.items():
    one = rows.get(f"{r['run']}-w1")
    eff = f"{100 * r['per_gpu'] / one['per_gpu']:.1f}%" if one and r["w"] > 1 else "-"
    exposed = "-" if r["run"].startswith("ref") else f"{r['exposed']:.2f}"
    share = "-" if r["run"].startswith("ref") else f"{100 * r['exposed'] / r['ms']:.2f}"
    print(f"{n:18} {r['w']:>4} {r['per_gpu']:>13.1f} {r['ms']:>8.1f} {exposed:>10} {share:>9} {r['mem']:>8.0f} "
          f"{r['moments']:>10} {r['buffers']:>10} {r['mfu']:>6.3f} {eff:>8}   ({r['n']} steps)")
# lf-switch: medians of the steps before and after the switch took effect (its answer's applied_at_step).
for n in names:
    f = out / f"{n}-switch.json"
    if not n.startswith("lf-switch-") or not f.exists() or n not in rows:
        continue
    try:
        applied = json.loads(f.read_text()).get("applied_at_step")
    except ValueError:
        print(f"{n}: switch-strategy answered {f.read_text()[:200]!r}"); continue
    recs = [json.loads(l) for l in (out / f"{n}_metrics.jsonl").read_text().splitlines() if l.strip()]
    before = [r["samples_per_s"] for r in recs if 50 < r["step"] < applied]
    after = [r["samples_per_s"] for r in recs if r["step"] > applied + 5]  # past the new plan's warm-up
    if before and after:
        print(f"{n}: hybrid until step {applied}: {st.median(before):.1f} samples/s/GPU ({len(before)} steps); "
              f"simple after it: {st.median(after):.1f} ({len(after)} steps from step {applied + 6})")
for w in sorted({r["w"] for r in rows.values()}):
    for base in ("ref-ddp", "ref-opt"):
        ref = rows.get(f"{base}-w{w}")
        if ref:
            print(f"{w} GPU(s), against {base}: " + ", ".join(
                f"{r['run']} {r['per_gpu'] / ref['per_gpu']:.2f}x" for r in rows.values()
                if r["w"] == w and not r["run"].startswith("ref")))
PY
stamp "done"
