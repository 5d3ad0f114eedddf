# Sourced by scripts/dev/gpu/issue*.sh: repo root as cwd, $OUT, NVLink multicast
# off (the device README requires it), all output also logged to $OUT/<name>.log,
# and `stamp` for timed section headers.
#   source "$(dirname "${BASH_SOURCE[0]}")/common.sh" issue3
set -uo pipefail
OUT=${OUT:-/tmp/loongforge-out}
mkdir -p "$OUT"
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)
cd "$repo"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
exec > >(tee -a "$OUT/$1.log") 2>&1
t0=$(date +%s)
stamp() { echo "== [$(( $(date +%s) - t0 ))s] $*"; }

# Builds build-gpu/, runs the GPU tests and exports n16-1b to /dev/shm/n16-1b.pt.
build_test_export() {
  stamp "environment"; nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
  stamp "build"; bash scripts/dev/gpu/build.sh || exit 1
  stamp "gpu tests"; (cd build-gpu && ctest -L gpu --output-on-failure 2>&1 | tail -${GPU_TEST_LINES:-15})
  stamp "export n16-1b"
  PYTHONPATH=scripts python3 scripts/model/export.py --config n16-1b --out /dev/shm/n16-1b.pt | tail -2 || exit 1
}

# wait_for_step SOCKET N [PID]: waits for the trainer behind SOCKET to serve, then
# (at most 5 minutes) until it has done N steps; sets $step. Returns early when
# process PID (if given) has exited.
wait_for_step() {
  local alive="true"; [ -n "${3:-}" ] && alive="kill -0 $3"
  for _ in $(seq 600); do [ -S "$1" ] && break; $alive 2>/dev/null || return 1; sleep 0.2; done
  for _ in $(seq 300); do
    $alive 2>/dev/null || return 1
    step=$(build-gpu/cli/loongforge status --socket "$1" --json 2>/dev/null |
           python3 -c 'import json,sys; print(json.load(sys.stdin).get("step",0))' 2>/dev/null)
    [ "${step:-0}" -ge "$2" ] && break; sleep 1
  done
}

# summarize_monitor FILE: one line per group of a `monitor-comm --json` record.
summarize_monitor() {
  python3 - "$1" <<'PY'
import json, sys
text = open(sys.argv[1]).read()
try:
    rec = json.loads(text.splitlines()[0])
except (ValueError, IndexError):
    print("monitor-comm: " + text[:300]); sys.exit(0)
comm = rec.get("comm", rec)
print(json.dumps({k: v for k, v in comm.items() if k not in ("groups", "buckets")})[:600])
for g in comm.get("groups", []):
    print("  " + json.dumps(g)[:300])
PY
}

# gpu_tests_in_time_left LIMIT: `ctest -L gpu -LE long` in what is left of LIMIT s from the script's start
# (nothing with 30 s or less), its log $OUT/ctest-gpu.log, a summary printed.
gpu_tests_in_time_left() {
  local left=$(( $1 - ($(date +%s) - t0) ))
  [ $left -gt 30 ] || return 0
  stamp "ctest -L gpu -LE long ($left s left)"
  (cd build-gpu && timeout $left ctest -L gpu -LE long --output-on-failure > "$OUT/ctest-gpu.log" 2>&1
   echo "ctest exit $?")
  grep -E "Test +#|tests passed|FAILED|Failed|not bit-identical" "$OUT/ctest-gpu.log" | tail -40
}
