#!/usr/bin/env bash
# Checkpoint write throughput against the storage's own (issue #45), on one
# machine in one run: for each directory given (default: /dev/shm and a folder
# on the build's disk) it measures, with build/test/checkpoint/bench_checkpoint
# on a synthetic state of GB gigabytes (a third weights, two thirds AdamW
# moments, fp32):
#   storage   a plain sequential write of GB with fsync (buffered, and O_DIRECT
#             where the file system takes it): the storage's own speed
#   before    the writer before chunked writes (one thread per tensor file,
#             built-in SHA-256, the whole state staged in one slab)
#   after-1   checkpoint::Writer with write_threads=1
#   after-N   checkpoint::Writer with write_threads=THREADS
#   bounded   after-N with staging_mb=STAGING_MB (smaller than the state)
# and once: SHA-256 speed of one core (built-in code and the library used).
# Prints one JSON line per run, then a table of GB/s and the fraction of the
# plain sequential write (the faster of buffered and O_DIRECT).
#
#   bash scripts/bench/checkpoint.sh [DIR ...]     GB=2 THREADS=4 STAGING_MB=256 REPEAT=2
#
# Needs `ninja -C build bench_checkpoint` (BUILD=... for another build folder).
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
build=${BUILD:-$repo/build}
bench=$build/test/checkpoint/bench_checkpoint
[ -x "$bench" ] || { echo "checkpoint.sh: $bench is missing: ninja -C $build bench_checkpoint" >&2; exit 2; }
GB=${GB:-2} THREADS=${THREADS:-4} STAGING_MB=${STAGING_MB:-256} REPEAT=${REPEAT:-2}
dirs=("$@")
[ ${#dirs[@]} -gt 0 ] || dirs=(/dev/shm/lf-bench-ckpt "$build/bench-ckpt")
out=$(mktemp)
trap 'rm -f "$out"' EXIT

echo "# $(date -u +%FT%TZ) $(nproc) cores, $(git -C "$repo" rev-parse --short HEAD), GB=$GB THREADS=$THREADS STAGING_MB=$STAGING_MB REPEAT=$REPEAT"
"$bench" --mode hash | tee -a "$out"
for d in "${dirs[@]}"; do
  mkdir -p "$d"
  common=(--dir "$d" --gb "$GB" --repeat "$REPEAT")
  "$bench" --mode storage "${common[@]}" | tee -a "$out"
  "$bench" --mode before "${common[@]}" | sed 's/"mode":"before"/"mode":"before","label":"before"/' | tee -a "$out"
  "$bench" --mode after "${common[@]}" --threads 1 --staging-mb 0 \
    | sed 's/"mode":"after"/"mode":"after","label":"after-1"/' | tee -a "$out"
  "$bench" --mode after "${common[@]}" --threads "$THREADS" --staging-mb 0 \
    | sed "s/\"mode\":\"after\"/\"mode\":\"after\",\"label\":\"after-$THREADS\"/" | tee -a "$out"
  "$bench" --mode after "${common[@]}" --threads "$THREADS" --staging-mb "$STAGING_MB" \
    | sed "s/\"mode\":\"after\"/\"mode\":\"after\",\"label\":\"bounded-$STAGING_MB\"/" | tee -a "$out"
  rm -rf "$d"
done

# The table: per directory each run's GB/s as a fraction of the plain write there (the faster of buffered and
# O_DIRECT, best of REPEAT).
"$(cat "$build/python-path" 2>/dev/null || echo python3)" - "$out" <<'EOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
for r in rows:
    if r["mode"] == "hash":
        print(f"\nSHA-256 on one core: built-in {r['builtin_mb_per_s']:.0f} MB/s, {r['best']} {r['best_mb_per_s']:.0f} MB/s")
print(f"\n{'dir':28} {'run':14} {'GB/s':>6} {'of plain write':>15} {'stall s':>8} {'staging MB':>11}")
for d in dict.fromkeys(r["dir"] for r in rows if "dir" in r):
    mine = [r for r in rows if r.get("dir") == d]
    plain = max((r["gb_per_s"] for r in mine if r["mode"].startswith("storage") and "gb_per_s" in r), default=0)
    for r in mine:
        name = r.get("label", r["mode"])
        if "gb_per_s" not in r:
            print(f"{d:28} {name:14} {'-':>6}  ({r.get('error')})")
            continue
        frac = f"{100 * r['gb_per_s'] / plain:.0f}%" if plain else "-"
        extra = "" if r["mode"].startswith("storage") else f" {r['stall_s']:8.2f} {r['staging_mb']:11d}"
        bad = "" if r.get("valid", True) and "error" not in r else "  FAILED"
        print(f"{d:28} {name:14} {r['gb_per_s']:6.2f} {frac:>15}{extra}{bad}")
EOF
