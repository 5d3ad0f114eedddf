#!/usr/bin/env bash
# The C++ side of scripts/bench_data.py alone (no reference, no torchcodec): ADFE with
# data.video_decode=whole and =span, THREADS decode threads (default "4 8 16"), on the
# bundled h264 dataset and its AV1 copy, MICRO_BATCHES (default 128) x 8 samples, 64 px,
# cold frame cache; build-gpu/test/data/bench_data must be built (scripts/dev/gpu/build.sh).
# Table in $OUT/decode-native.md. Carry .gpu-carry/datasets/robot_sim.PickNPlace.lf and
# .gpu-carry/datasets/robot_sim.PickNPlace.av1.lf (scripts/dev/gpu/prepare_decode_carry.sh).
source "$(dirname "${BASH_SOURCE[0]}")/common.sh" bench_decode_native
mb=${MICRO_BATCHES:-128}
{
  echo "| data | threads | whole samples/s | span samples/s | span / whole | frames decoded (whole / span) |"
  echo "|---|---|---|---|---|---|"
  for d in robot_sim.PickNPlace.lf robot_sim.PickNPlace.av1.lf; do
    for t in ${THREADS:-4 8 16}; do
      row=()
      for m in whole span; do
        row+=("$(build-gpu/test/data/bench_data .gpu-carry/datasets/$d adfe $t 4 $mb 8 64 2048 video_decode=$m)")
      done
      python3 - "$d" "$t" "${row[@]}" <<'PY'
import json, sys
d, t, w, s = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), json.loads(sys.argv[4])
print(f"| {d} | {t} | {w['samples_per_s']:.1f} | {s['samples_per_s']:.1f} | "
      f"{s['samples_per_s'] / w['samples_per_s']:.2f}x | {w['frames_decoded']} / {s['frames_decoded']} |")
PY
    done
  done
} | tee "$OUT/decode-native.md"
echo "$(nproc) CPUs; $mb micro-batches x 8 samples, 64 px"
