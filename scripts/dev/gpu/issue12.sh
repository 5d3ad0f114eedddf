#!/usr/bin/env bash
# Issue #12 (ADFE) on an H200: builds what it needs into build-gpu/, runs the
# ADFE GPU tests (pinned slots, copy stream), then trains with the plain source
# and with ADFE on the same model file, data and seed:
#   tiny-sync / tiny-adfe  n16-tiny, fp32, deterministic, 20 steps: losses compared
#   1b-sync / 1b-adfe      n16-1b (configs/bench, bf16, micro-batch 32), STEPS steps:
#                          median samples/s and data wait over steps 21..STEPS
# Carry: .gpu-carry (scripts/dev/gpu/prepare_carry.sh). PART=build|runs|all (default all).
# Not run yet: written 2026-12-01 when this session had no GPU time left.
source "$(dirname "${BASH_SOURCE[0]}")/common.sh" issue12
steps=${STEPS:-100}
part=${PART:-all}
if [ "$part" != runs ]; then
  stamp "environment"; nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
  stamp "build"
  bash scripts/dev/gpu/build.sh test_adfe_gpu test_adfe loongforge-train loongforge || exit 1
  stamp "adfe tests (gpu and cpu)"
  (cd build-gpu && ctest -R 'test_adfe' --output-on-failure 2>&1 | tail -20)
fi
[ "$part" = build ] && { stamp "done"; exit 0; }

stamp "export n16-tiny and n16-1b"
PYTHONPATH=scripts python3 scripts/model/export.py --config n16-tiny --out /dev/shm/n16-tiny.pt | tail -1
PYTHONPATH=scripts python3 scripts/model/export.py --config n16-1b --out /dev/shm/n16-1b.pt | tail -1
ds=.gpu-carry/datasets/robot_sim.PickNPlace.lf
adfe=(--set adfe.enable=true --set adfe.decode_threads=4 --set adfe.prefetch_factor=4)
for run in tiny-sync tiny-adfe 1b-sync 1b-adfe; do
  stamp "$run"
  extra=(); [[ $run == *adfe ]] && extra=("${adfe[@]}")
  if [[ $run == tiny* ]]; then
    args=(--config configs/n16-tiny.yaml --set model.path=/dev/shm/n16-tiny.pt --set data.path=$ds
          --set run.device=cuda --set precision.mode=fp32 --set run.deterministic=true --set trainer.max_steps=20)
  else
    args=(--config configs/bench/n16-1b-h200.yaml --set model.path=/dev/shm/n16-1b.pt --set trainer.max_steps=$steps)
  fi
  build-gpu/src/daemon/loongforge-train "${args[@]}" "${extra[@]}" --set run.name=$run --set run.output_dir=/tmp/runs \
    --set logging.progress=off > "$OUT/$run.log" 2>&1
  echo "exit $?"; tail -2 "$OUT/$run.log"
  cp /tmp/runs/$run/metrics.jsonl "$OUT/${run}_metrics.jsonl" 2>/dev/null
done

stamp "compare"
python3 - "$OUT" <<'PY'
import json, statistics, sys, pathlib
out = pathlib.Path(sys.argv[1])
def recs(name):
    f = out / f"{name}_metrics.jsonl"
    return [json.loads(l) for l in f.read_text().splitlines() if l.strip()] if f.exists() else []
a, b = recs("tiny-sync"), recs("tiny-adfe")
print("n16-tiny fp32 losses equal:", [r["loss"] for r in a] == [r["loss"] for r in b], len(a), len(b),
      "max |diff|", max((abs(x["loss"] - y["loss"]) for x, y in zip(a, b)), default=None))
for name in ("1b-sync", "1b-adfe"):
    tail = [r for r in recs(name) if r["step"] > 20]
    if not tail:
        print(name, "no metrics"); continue
    print(f"{name}: {len(tail)} steps, median samples/s {statistics.median(r['samples_per_s'] for r in tail):.1f}, "
          f"step {statistics.median(r['step_ms'] for r in tail):.1f} ms, data wait median "
          f"{statistics.median(r['data_wait_ms'] for r in tail):.2f} ms, max {max(r['data_wait_ms'] for r in tail):.2f} ms, "
          f"queue depth median {statistics.median(r.get('queue_depth', 0) for r in tail)}, "
          f"first step data wait {recs(name)[0]['data_wait_ms']:.1f} ms")
x, y = recs("1b-sync"), recs("1b-adfe")
print("n16-1b bf16 first 5 losses:", [round(r["loss"], 6) for r in x[:5]], [round(r["loss"], 6) for r in y[:5]])
PY
stamp "done"
