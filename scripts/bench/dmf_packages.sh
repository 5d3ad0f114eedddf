#!/usr/bin/env bash
# DMF's text widths with and without the compiled step, on a copy of a dataset whose task texts have other
# lengths (scripts/bench/dmf_varied_texts.py): the vision-language padding and the steady-state speed of
#   whole       dmf.enable=false, trainer.compiled_step=off (the TorchScript step, the whole text slot)
#   dmf         dmf.enable=true,  trainer.compiled_step=off (a width per micro-batch, dmf.text_buckets at most)
#   pkg-whole   dmf.enable=false, trainer.compiled_step=on  (one package, the whole slot)
#   pkg-1       dmf.enable=true,  trainer.compiled_step=on, dmf.package_buckets=1 (one package, the longest text)
#   pkg-2       dmf.enable=true,  trainer.compiled_step=on, dmf.package_buckets=2 (a package for each of 2 widths)
# each STEPS steps after the packages are compiled into a fresh cache (--compile-only, timed, not in the runs).
#   bash scripts/bench/dmf_packages.sh                       (the CPU: n16-tiny and the test fixtures)
#   TRAIN=build-gpu/src/daemon/loongforge-train CONFIG=configs/bench/n16-1b-h200.yaml MODEL=/dev/shm/n16-1b.pt \
#     DATA=... SETS="run.device=cuda" MB=32 bash scripts/bench/dmf_packages.sh   (a GPU)
# Env: TRAIN, CONFIG (configs/n16-tiny.yaml), MODEL (build/test-models/n16-tiny.pt), DATA (the bundled
# dataset as the tests convert it), LENGTHS (6,6,6,6,14: one per task text, tokens with BOS and EOS), MB (4),
# STEPS (40), RUNS (all five), SETS (more key=value for every run), WORK (/tmp/dmf-packages, emptied first).
# Prints one line per run and writes $WORK/dmf_packages.json. Every figure is read from the run's own
# summary.json: vl_padding.share, steady_state (the median after the warm-up), dmf.micro_batches_by_width.
set -euo pipefail
cd "$(dirname "$0")/../.."
TRAIN=${TRAIN:-build/src/daemon/loongforge-train}
CONFIG=${CONFIG:-configs/n16-tiny.yaml}
MODEL=${MODEL:-build/test-models/n16-tiny.pt}
DATA=${DATA:-build/test-data/robot_sim.PickNPlace.lf}
LENGTHS=${LENGTHS:-6,6,6,6,14}
MB=${MB:-4}
STEPS=${STEPS:-40}
RUNS=${RUNS:-whole dmf pkg-whole pkg-1 pkg-2}
WORK=${WORK:-/tmp/dmf-packages}
PY=${PYTHON:-$( [ -x /root/.cache/loongforge/venv/bin/python ] && echo /root/.cache/loongforge/venv/bin/python || echo python3)}
rm -rf "$WORK" && mkdir -p "$WORK"
"$PY" scripts/bench/dmf_varied_texts.py --src "$DATA" --out "$WORK/data" --lengths "$LENGTHS" > /dev/null
common=(--config "$CONFIG" --set "model.path=$MODEL" --set "data.path=$WORK/data" --set "trainer.micro_batch_size=$MB"
        --set "trainer.max_steps=$STEPS" --set checkpoint.interval_steps=1000000 --set logging.progress=off
        --set "trainer.compile_cache=$WORK/cache")
for kv in ${SETS:-}; do common+=(--set "$kv"); done
sets_of() {
  case $1 in
    whole) echo "dmf.enable=false trainer.compiled_step=off" ;;
    dmf) echo "dmf.enable=true trainer.compiled_step=off" ;;
    pkg-whole) echo "dmf.enable=false trainer.compiled_step=on" ;;
    pkg-1) echo "dmf.enable=true trainer.compiled_step=on dmf.package_buckets=1" ;;
    pkg-2) echo "dmf.enable=true trainer.compiled_step=on dmf.package_buckets=2" ;;
    *) echo "unknown run $1" >&2; exit 2 ;;
  esac
}
args_of() { local a=() kv; for kv in $(sets_of "$1"); do a+=(--set "$kv"); done; echo "${a[@]}"; }
for run in $RUNS; do  # the packages first, each compile timed
  case $run in pkg-*) ;; *) continue ;; esac
  t=$(date +%s.%N)
  # shellcheck disable=SC2046  # the run's --set pairs, one word each
  "$TRAIN" "${common[@]}" $(args_of "$run") --set "run.output_dir=$WORK/prep-$run" --compile-only \
    > "$WORK/compile-$run.log" 2>&1 || { tail -20 "$WORK/compile-$run.log"; exit 1; }
  printf '%-10s --compile-only %.0f s: %s\n' "$run" "$(echo "$(date +%s.%N) - $t" | bc)" \
    "$(grep -hE '^(compiled|already prepared)' "$WORK/compile-$run.log" | sed 's|(log: [^)]*)||' | tr '\n' ';')"
done
for run in $RUNS; do
  # shellcheck disable=SC2046
  "$TRAIN" "${common[@]}" $(args_of "$run") --set "run.output_dir=$WORK/$run" > "$WORK/$run.log" 2>&1 ||
    { tail -20 "$WORK/$run.log"; exit 1; }
done
# shellcheck disable=SC2086  # one argument per run
"$PY" - "$WORK" $RUNS <<'PY'
import json, sys
from pathlib import Path
work, runs = Path(sys.argv[1]), sys.argv[2:]
rows = {}
for run in runs:
    [summary] = list((work / run).glob("*/summary.json"))
    s = json.loads(summary.read_text())
    st = s["steady_state"]
    rows[run] = {"vl_padding_share": s["vl_padding"]["share"], "samples_per_s": st["samples_per_s_median"],
                 "step_ms": st["step_ms_median"], "steady_steps": st["steps"],
                 "widths": s.get("dmf", {}).get("micro_batches_by_width"),
                 "compiled_step": (s.get("compiled_step") or {}).get("source")}
base = rows.get("whole")
for run, r in rows.items():
    ratio = f"{r['samples_per_s'] / base['samples_per_s']:.3f}x whole" if base else ""
    print(f"{run:<10} padding {100 * r['vl_padding_share']:5.1f}%  {r['samples_per_s']:8.1f} samples/s "
          f"(step {r['step_ms']:.2f} ms, median of {r['steady_steps']})  {ratio:<13} widths {r['widths']}  "
          f"package {r['compiled_step']}")
(work / "dmf_packages.json").write_text(json.dumps(rows, indent=1))
PY
