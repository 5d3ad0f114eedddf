#!/usr/bin/env bash
# Issue #12 on the H200 machine's 16 cores (the GPU is not used): decoded
# samples/s of loongforge's plain source and ADFE, the reference PyTorch
# DataLoader (workers decoding through the ffmpeg CLI) and torchcodec 0.11.1
# (LeRobot's decoder), 1, 2, 4, 8 and 16 threads/workers, on the bundled
# dataset (h264) and its AV1 copy: scripts/bench_data.py, same files, same run.
#   1. builds build-gpu/test/data/bench_data alone (issue12.sh's configuration)
#   2. installs the carried torchcodec wheel into /tmp/site; the carried shared
#      FFmpeg (.gpu-carry/ffmpeg-bench) gives the reference its ffmpeg and
#      ffprobe (--ffmpeg) and torchcodec its libraries (LD_LIBRARY_PATH)
#   3. compares both decoders' output with the CPU machine's, bit for bit
#      (scripts/dev/gpu/decode_digest.py against the carried decode-digests.txt)
#   4. runs bench_data.py on each dataset (--span: ADFE rows with data.video_decode=span
#      too): tables in $OUT/decode-tables.md, rows in $OUT/decode-h264.json and
#      $OUT/decode-av1.json
#   5. with GRAPH_TEST=1, then builds test_graph_runner and runs its "graph capture*"
#      cases (the GPU test of Note [Thread-local capture])
# Prepare on the CPU machine: bash scripts/dev/gpu/prepare_decode_carry.sh. Carry:
#   .gpu-carry/ffmpeg .gpu-carry/ffmpeg-bench .gpu-carry/datasets/robot_sim.PickNPlace.lf
#   .gpu-carry/datasets/robot_sim.PickNPlace.av1.lf .gpu-carry/datasets/decode-digests.txt .whl
# Env: MICRO_BATCHES (default 128), THREADS (1,2,4,8,16), REPEATS (1),
#   BUDGET (380: seconds for the whole script; each dataset's bench_data.py gets
#   --budget-s, its share of what is left after the build, and a row still
#   running at its end is cut and reported as not run).
# 128 micro-batches (1024 of the 2096 samples): with 16 workers each gets 8
# micro-batches (the CPU machine's 40 gave 2-3, so a row was mostly the
# workers' cold start: the reference's workers each decode every video they
# touch whole, about all 5); torchcodec's h264 row with 1 worker, the slowest
# (about 30 samples/s on the CPU machine: ~35 s), still fits.
source "$(dirname "${BASH_SOURCE[0]}")/common.sh" issue12_decode
mb=${MICRO_BATCHES:-128}
threads=${THREADS:-1,2,4,8,16}
repeats=${REPEATS:-1}
budget=${BUDGET:-380}
ff=$repo/.gpu-carry/ffmpeg-bench
ds=$repo/.gpu-carry/datasets

stamp "environment"
echo "$(nproc) CPUs usable ($(grep -c ^processor /proc/cpuinfo) online), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2-)"
python3 -c 'import sys, torch; print("python", sys.version.split()[0], "torch", torch.__version__)'
for p in "$ff/bin/ffmpeg" "$ds/robot_sim.PickNPlace.lf" "$ds/robot_sim.PickNPlace.av1.lf" "$ds/decode-digests.txt"; do
  [ -e "$p" ] || { echo "missing $p: run scripts/dev/gpu/prepare_decode_carry.sh and carry it (header)"; exit 1; }
done

stamp "build bench_data"
bash scripts/dev/gpu/build.sh bench_data || exit 1

stamp "torchcodec and the shared FFmpeg"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
  .whl/torchcodec-0.11.1-*.whl || exit 1
export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH} LD_LIBRARY_PATH=$ff/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export PYTHONUNBUFFERED=1
python3 -c 'import torchcodec.decoders' || exit 1  # the H200 machine's python3 has libpython3.12 (2026-12-01)
PATH=$ff/bin:$PATH python3 scripts/dev/gpu/decode_digest.py "$ds/robot_sim.PickNPlace.lf" "$ds/robot_sim.PickNPlace.av1.lf" \
  > "$OUT/decode-digests.txt" || exit 1
python3 - "$ds/decode-digests.txt" "$OUT/decode-digests.txt" <<'PY'
import collections, sys
cpu, gpu = ([l.split() for l in open(p) if l.strip()] for p in sys.argv[1:])
cpu = {(name, kind): h for h, name, kind in cpu}
same = collections.Counter()
for h, name, kind in gpu:
    same[kind, cpu.get((name, kind)) == h] += 1
for kind in sorted({k for k, _ in same}):
    print(f"{kind}: {same[kind, True]} of {same[kind, True] + same[kind, False]} videos equal to the CPU machine's "
          "(system FFmpeg 5.1.9, Debian 12)")
PY

run_bench() {  # NAME DATASET SHARE_PERCENT: bench_data.py gets that share of the seconds left
  local left=$(( budget - ($(date +%s) - t0) - 10 ))
  local share=$(( left * $3 / 100 ))
  stamp "bench_data.py $1 (--budget-s $share)"
  [ "$share" -gt 20 ] || { echo "no time left for $1 (BUDGET=$budget)"; return; }
  python3 scripts/bench_data.py --data "$2" --bench-binary build-gpu/test/data/bench_data \
    --ffmpeg "$ff/bin/ffmpeg" --threads "$threads" --micro-batches "$mb" --repeats "$repeats" \
    --budget-s "$share" --span --json "$OUT/decode-$1.json" | tee -a "$OUT/decode-tables.md"
}
# h264 first, with 62% of what is left (its torchcodec rows decode ~110 frames a
# sample); AV1 gets the rest.
run_bench h264 "$ds/robot_sim.PickNPlace.lf" 62
run_bench av1 "$ds/robot_sim.PickNPlace.av1.lf" 100
if [ "${GRAPH_TEST:-0}" = 1 ]; then
  stamp "build test_graph_runner"
  bash scripts/dev/gpu/build.sh test_graph_runner || exit 1
  stamp "test_graph_runner graph capture*"
  (cd build-gpu && ./test/fusion/test_graph_runner "graph capture*" 2>&1 | tail -30)
fi
stamp "done"
