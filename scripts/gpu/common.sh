# Sourced by scripts/gpu/issue*.sh: repo root as cwd, $OUT, NVLink multicast
# off (the device README requires it), all output also logged to $OUT/<name>.log,
# and `stamp` for timed section headers.
#   source "$(dirname "${BASH_SOURCE[0]}")/common.sh" issue3
set -uo pipefail
OUT=${OUT:-/tmp/loongforge-out}
mkdir -p "$OUT"
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$repo"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
exec > >(tee -a "$OUT/$1.log") 2>&1
t0=$(date +%s)
stamp() { echo "== [$(( $(date +%s) - t0 ))s] $*"; }
